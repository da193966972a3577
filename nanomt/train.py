"""Training: label-smoothed loss, inverse-sqrt schedule, the loop with evaluation, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from nanomt import checkpoint as ckpt
from nanomt import runtime
from nanomt.checkpoint import TrainState
from nanomt.config import BOS_ID, EOS_ID, PAD_ID, Config, SplitConfig, TrainConfig, load_config, save_config, to_dict
from nanomt.data import (
    Batch,
    Corpus,
    binarize,
    both_directions,
    check_split,
    collate,
    corpus_texts,
    make_batches,
    output_ids,
    padding_fraction,
    resegment,
    shard,
    split_pairs,
)
from nanomt.metrics import bleu
from nanomt.model import Transformer
from nanomt.runtime import Runtime, autocast
from nanomt.tokenizer import Tokenizer, train_tokenizer
from nanomt.translate import Translator

log = logging.getLogger("nanomt")


class TrainingError(RuntimeError):
    """Training cannot go on (a non-finite loss, a run directory from another config)."""


def lr_at(step: int, cfg: TrainConfig, d_model: int, elapsed: float = 0.0) -> float:
    """Learning rate for 1-based `step` after `elapsed` seconds of training (the clock matters to "linear" only)."""
    step = max(step, 1)
    warmup = max(cfg.warmup_steps, 1)
    if cfg.schedule == "noam":  # 5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), scaled by lr
        return cfg.lr * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if cfg.schedule == "linear":
        # Decay to 0 where the budget ends: at max_steps, or when max_minutes runs out if that comes first. A
        # step count guessed from the machine's speed misses on a shared host (the Multi30k hour ended with
        # the lr at 12% of its peak); the clock does not. Past warmup the decay term is <= 1 <= the ramp.
        decay = (cfg.max_steps - step) / max(cfg.max_steps - warmup, 1)
        if cfg.max_minutes is not None:
            decay = min(decay, 1.0 - elapsed / (cfg.max_minutes * 60))
        return cfg.lr * max(0.0, min(step / warmup, decay))
    if step < warmup:  # fairseq's inverse_sqrt: the same curve, with lr as its peak
        return cfg.lr * step / warmup
    return cfg.lr * math.sqrt(warmup / step)


class LabelSmoothedLoss(torch.autograd.Function):
    """Summed label-smoothed cross-entropy whose gradient is computed with the loss, in cache-sized row blocks.

    d loss / d logits = softmax(logits) - q, with q = (1 - eps) on the gold token + eps / V everywhere, so the
    forward pass can write the gradient directly. Done in blocks of `ROWS` rows, the (N, V) logits are read
    once instead of the ~10 full passes of log_softmax + smoothing + their backward (2x faster on a CPU).
    """

    ROWS = 32

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int) -> torch.Tensor:
        n, v = logits.shape
        grad = torch.empty_like(logits)
        total = logits.new_zeros((), dtype=torch.float64)
        for i in range(0, n, LabelSmoothedLoss.ROWS):
            logp = logits[i : i + LabelSmoothedLoss.ROWS].float().log_softmax(dim=-1)  # (R, V)
            y = target[i : i + LabelSmoothedLoss.ROWS, None]  # (R, 1)
            keep = (y != pad_id).to(logp.dtype)  # (R, 1)
            nll, smooth = logp.gather(1, y), logp.sum(dim=1, keepdim=True) / v
            total += (-(1 - smoothing) * nll - smoothing * smooth).mul(keep).sum().double()
            g = logp.exp_().sub_(smoothing / v)  # softmax - eps / V
            g.scatter_add_(1, y, torch.full_like(keep, smoothing - 1))  # - (1 - eps) on the gold token
            grad[i : i + LabelSmoothedLoss.ROWS] = g.mul_(keep)
        ctx.save_for_backward(grad)
        return total.float()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int) -> torch.Tensor:
    """Summed cross-entropy with label smoothing (Szegedy et al., 2016), padding positions ignored.

    Equal to F.cross_entropy(..., label_smoothing=smoothing, ignore_index=pad_id, reduction="sum").
    """
    return LabelSmoothedLoss.apply(logits.reshape(-1, logits.size(-1)), target.reshape(-1), smoothing, pad_id)


# ---------------------------------------------------------------------------------------------------------
# Set-up: run directory, tokenizer, binarized data, model and optimizer.
# ---------------------------------------------------------------------------------------------------------


def has_split(cfg: Config, name: str) -> bool:
    """Whether the config names data for a split."""
    return cfg.data.hf is not None or getattr(cfg.data, name) != SplitConfig()


def prepare_run_dir(cfg: Config, run_dir: Path) -> tuple[Config, Tokenizer]:
    """Validate the corpus, train or load the tokenizer, fix vocabulary sizes in the config, save config.yaml."""
    if cfg.data.hf is None:
        check_split(cfg.data.train, "train")
        if has_split(cfg, "valid"):
            check_split(cfg.data.valid, "valid")
    run_dir.mkdir(parents=True, exist_ok=True)
    tok_dir = run_dir / ckpt.TOKENIZER
    if any(tok_dir.glob("*.model")):
        tokenizer = Tokenizer.load(tok_dir)
    else:
        log.info("training a %s tokenizer (vocab %d) on the training data", cfg.data.tokenizer, cfg.data.vocab_size)
        tokenizer = train_tokenizer(
            (s for s, _ in split_pairs(cfg.data, "train")),
            (t for _, t in split_pairs(cfg.data, "train")),
            tok_dir,
            cfg.data,
        )
    model_cfg = dataclasses.replace(
        cfg.model,
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
    )
    cfg = dataclasses.replace(cfg, model=model_cfg)
    saved = run_dir / ckpt.CONFIG
    if saved.is_file() and ckpt.step_dirs(run_dir):
        old = load_config(saved)
        for section in ("model", "data"):
            a, b = to_dict(getattr(old, section)), to_dict(getattr(cfg, section))
            diff = [k for k in a if a[k] != b.get(k)]
            if diff:
                raise TrainingError(
                    f"{run_dir} holds a run with another {section} config ({section}.{diff[0]}: "
                    f"{a[diff[0]]!r} there, {b[diff[0]]!r} now); use another --run-dir"
                )
    save_config(cfg, saved)
    return cfg, tokenizer


def valid_set(cfg: Config, tokenizer: Tokenizer, cache: Path) -> tuple[Corpus, list[str], list[str]] | None:
    """Binarized validation corpus and the raw text of the sentences used for BLEU."""
    if not has_split(cfg, "valid"):
        return None
    corpus = binarize(cfg.data, "valid", tokenizer, cache, max_len=cfg.model.max_positions - 1)
    n = cfg.train.valid_bleu_sentences
    srcs, refs = [], []
    for src, tgt in split_pairs(cfg.data, "valid"):
        if n is not None and len(srcs) >= n:
            break
        if src.strip() and tgt.strip():
            srcs.append(src)
            refs.append(tgt)
    return corpus, srcs, refs


@dataclass(frozen=True)
class TrainData:
    """What training reads: the tokenizer, the binarized corpus, the validation set, and per-epoch inputs."""

    tokenizer: Tokenizer
    corpus: Corpus
    valid: tuple[Corpus, list[str], list[str]] | None  # binarized, and the raw sources/references for BLEU
    max_len: int
    texts: tuple[list[str], list[str]] | None  # the raw pairs, re-segmented every epoch under BPE-dropout
    output_vocab: dict[bool, torch.Tensor]  # restrict_output: the scored target ids, with / without reversed pairs


def prepare_data(cfg: Config, run_dir: Path, rt: Runtime) -> tuple[Config, TrainData]:
    """Tokenizer (trained by rank 0 once), config with the vocabulary sizes, binarized train and valid sets."""
    if rt.is_main:
        cfg, tokenizer = prepare_run_dir(cfg, run_dir)
    if rt.world > 1:
        dist.barrier()
        if not rt.is_main:  # the others read what rank 0 prepared
            cfg, tokenizer = load_config(run_dir / ckpt.CONFIG), Tokenizer.load(run_dir / ckpt.TOKENIZER)
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "bin"
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    corpus = binarize(cfg.data, "train", tokenizer, cache, max_len=max_len)
    if len(corpus) == 0:
        raise TrainingError("no training pairs left after filtering")
    output_vocab = {}
    if cfg.model.restrict_output:
        output_vocab[False] = torch.from_numpy(output_ids(corpus))
        if cfg.train.bidirectional_epochs:  # a reversed epoch's targets are both sides' sentences
            output_vocab[True] = torch.from_numpy(output_ids(both_directions(corpus)))
    return cfg, TrainData(
        tokenizer=tokenizer,
        corpus=corpus,
        valid=valid_set(cfg, tokenizer, cache) if rt.is_main else None,
        max_len=max_len,
        texts=corpus_texts(corpus, tokenizer) if cfg.data.bpe_dropout else None,
        output_vocab=output_vocab,
    )


def seed_everything(seed: int) -> None:
    """Seed every RNG a run touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build(cfg: Config, rt: Runtime) -> tuple[Transformer, torch.optim.Optimizer]:
    """The model, initialized from train.seed, and its AdamW."""
    seed_everything(cfg.train.seed)
    model = Transformer(cfg.model).to(rt.device)
    tc = cfg.train
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=lr_at(1, tc, cfg.model.d_model),
        betas=tc.betas,
        eps=tc.eps,
        weight_decay=tc.weight_decay,
        # One kernel over all parameters instead of ~10 passes per tensor: the default for-loop AdamW is ~10%
        # of a BASE-sized fp32 step on a CPU (docs/performance.md). Same update and state; a run resumed from
        # a checkpoint of an older nanomt keeps that checkpoint's (unfused) setting.
        fused=rt.device.type in ("cpu", "cuda"),
    )
    return model, optimizer


# ---------------------------------------------------------------------------------------------------------
# The phases of the loop: an epoch's batches, one step, evaluation.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    """One epoch's corpus (re-segmented, reversed pairs added), this rank's batches, their padding fraction."""

    corpus: Corpus
    batches: list
    padding: float


def epoch_batches(data: TrainData, epoch: int, model: Transformer, cfg: Config, rt: Runtime) -> Epoch:
    """Epoch `epoch`'s batches; a function of (seed, epoch) alone, so that a resumed run draws the same ones."""
    tc, c = cfg.train, data.corpus
    if data.texts is not None:  # a fresh BPE-dropout segmentation, seeded by (seed, epoch)
        c = resegment(c, data.texts, data.tokenizer, cfg.data.bpe_dropout, tc.seed * 100_003 + epoch, data.max_len)
    bidirectional = epoch < tc.bidirectional_epochs
    if bidirectional:
        c = both_directions(c)
    if data.output_vocab:  # set at every epoch start, not only at the switch, so that a resumed run scores them
        model.set_output_vocab(data.output_vocab[bidirectional])
    batches = shard(make_batches(c.src_lens, c.tgt_lens, tc.max_tokens, tc.seed, epoch), rt.rank, rt.world)
    return Epoch(c, batches, padding_fraction(batches, c.src_lens, c.tgt_lens))


def next_group(
    data: TrainData, ep: Epoch, state: TrainState, model: Transformer, cfg: Config, rt: Runtime
) -> tuple[list[Batch], Epoch]:
    """The next accum_steps batches on the device, moving on to a newly drawn epoch where one ends."""
    group: list[Batch] = []
    while len(group) < cfg.train.accum_steps:
        if state.batch_pos >= len(ep.batches):
            state.epoch, state.batch_pos = state.epoch + 1, 0
            ep = epoch_batches(data, state.epoch, model, cfg, rt)
        group.append(collate(ep.corpus, ep.batches[state.batch_pos]).to(rt.device))
        state.batch_pos += 1
    return group, ep


def all_ranks_mean(value: float, rt: Runtime) -> float:
    """The mean of a number over the ranks (the number itself in one process)."""
    if rt.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return t.item() / rt.world


def backward(model: Transformer, ddp_model, group: list[Batch], scaler, cfg: Config, rt: Runtime) -> float:
    """Gradients of the group's summed loss over its target tokens (all ranks' tokens); returns that loss."""
    # Normalized by the global token count, so that DDP's average of the ranks' gradients is exact.
    n_tokens = all_ranks_mean(sum(b.n_tgt_tokens for b in group), rt)
    loss_sum = 0.0
    for i, b in enumerate(group):
        last = i == len(group) - 1
        with contextlib.nullcontext() if rt.world == 1 or last else ddp_model.no_sync():
            with autocast(rt.precision, rt.device):
                logits = ddp_model(b.src, b.tgt_in, restricted=True)
            target = model.output_targets(b.tgt_out)
            loss = label_smoothed_loss(logits, target, cfg.train.label_smoothing, PAD_ID) / n_tokens
            (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.item()
    return all_ranks_mean(loss_sum, rt)  # every rank logs, and stops on, the loss of the whole global batch


def update(model: Transformer, optimizer: torch.optim.Optimizer, scaler, lr: float, clip_norm: float) -> float:
    """Clip the gradients, step the optimizer at `lr`, zero the gradients; returns the norm before clipping."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    if scaler:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm or float("inf")).item()
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


@torch.no_grad()
def evaluate_loss(model: Transformer, corpus: Corpus, cfg: Config, rt: Runtime) -> float:
    """Label-smoothed loss per target token on a corpus."""
    total, tokens = 0.0, 0
    for idx in make_batches(corpus.src_lens, corpus.tgt_lens, cfg.train.max_tokens, 0, 0, shuffle=False):
        batch = collate(corpus, idx).to(rt.device)
        with autocast(rt.precision, rt.device):
            logits = model(batch.src, batch.tgt_in, restricted=True)
        target = model.output_targets(batch.tgt_out)  # with restrict_output, ids it never scores are skipped
        total += label_smoothed_loss(logits, target, cfg.train.label_smoothing, PAD_ID).item()
        tokens += int((target != PAD_ID).sum())
    return total / max(tokens, 1)


def evaluate(model: Transformer, data: TrainData, cfg: Config, rt: Runtime) -> dict:
    """Validation loss per target token, and greedy BLEU on the first valid_bleu_sentences pairs."""
    corpus, srcs, refs = data.valid
    model.eval()
    row = {"valid_loss": evaluate_loss(model, corpus, cfg, rt)}
    if srcs:
        translator = Translator(model, data.tokenizer, cfg, rt.device)
        with autocast(rt.precision, rt.device):
            hyps = translator.translate(srcs, beam_size=1, max_tokens=cfg.train.max_tokens)
        row["valid_bleu"] = bleu(hyps, refs)
    model.train()
    return row


def keep_best(model: Transformer, row: dict, state: TrainState, run_dir: Path) -> None:
    """model.safetensors holds the weights of the best evaluation so far: by BLEU, or by loss where there is none."""
    score = row.get("valid_bleu", -row["valid_loss"])
    better = score > state.best_score
    if better:
        state.best_score = score
    if better or not (run_dir / ckpt.WEIGHTS).is_file():
        ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl (rank 0 only), optionally mirrored to TensorBoard."""

    def __init__(self, path: Path, enabled: bool, resume_step: int, tensorboard: bool):
        self.path, self.enabled, self.writer = path, enabled, None
        if not enabled:
            return
        if path.is_file():  # rows past the checkpoint belong to the lost part of a killed run
            rows = [r for r in path.read_text(encoding="utf-8").splitlines() if r.strip()]
            kept = [r for r in rows if json.loads(r).get("step", 0) <= resume_step]
            path.write_text("".join(r + "\n" for r in kept), encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TrainingError("train.tensorboard=true needs the tensorboard package") from None
            self.writer = SummaryWriter(str(path.parent / "tensorboard"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float):
                    self.writer.add_scalar(k, v, row["step"])


# ---------------------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Window:
    """Sums over the steps since the last log row."""

    loss: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0

    def add(self, loss: float, tokens: int, seconds: float) -> None:
        self.loss, self.tokens, self.seconds, self.steps = (
            self.loss + loss,
            self.tokens + tokens,
            self.seconds + seconds,
            self.steps + 1,
        )


@contextlib.contextmanager
def sigint_requests_stop(enabled: bool):
    """Within the block, Ctrl-C sets the event instead of raising, so the loop can stop after a whole step."""
    stop = threading.Event()
    if not (enabled and runtime.is_main_thread()):
        yield stop
        return
    old = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)


def train(cfg: Config, run_dir: str | Path) -> Path:
    """Train (or resume) a run in `run_dir`; returns the run directory."""
    run_dir, tc = Path(run_dir), cfg.train
    rt = runtime.setup(tc.device, tc.precision, tc.num_threads)
    cfg, data = prepare_data(cfg, run_dir, rt)
    model, optimizer = build(cfg, rt)
    state, resumed_from = TrainState.resume_or_new(run_dir, model, optimizer, rt.rank)
    ddp_model = model
    if rt.world > 1:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    scaler = torch.amp.GradScaler("cuda") if rt.precision == "fp16" else None
    metrics = MetricsLog(run_dir / "metrics.jsonl", rt.is_main, state.step, tc.tensorboard)
    if rt.is_main:
        if resumed_from:
            log.info("resuming from %s (step %d, epoch %d)", resumed_from, state.step, state.epoch)
        log.info(
            "model: %s parameters; %d training pairs (%s); device %s, %d threads, %s",
            f"{model.num_parameters():,}",
            len(data.corpus),
            data.corpus.stats,
            rt.device,
            torch.get_num_threads(),
            rt.precision if rt.precision == tc.precision else f"{tc.precision} ({rt.precision})",
        )

    def save() -> None:
        if rt.is_main:
            state.save(run_dir, model, optimizer, tc.keep_last)

    def evaluate_and_log() -> None:
        row = {"step": state.step, "epoch": state.epoch, **evaluate(model, data, cfg, rt)}
        metrics.write({**row, "elapsed_s": round(state.elapsed, 2)})
        keep_best(model, row, state, run_dir)
        bleu_text = f", valid BLEU {row['valid_bleu']:.2f}" if "valid_bleu" in row else ""
        log.info("step %d: valid loss %.3f%s", state.step, row["valid_loss"], bleu_text)

    start_step = state.step
    ep = epoch_batches(data, state.epoch, model, cfg, rt)
    if rt.is_main:
        log.info("padding fraction %.3f", ep.padding)
    # After the set-up (tokenizer, binarizing), whose freed memory the heap would otherwise keep for the whole run.
    if rt.device.type == "cpu" and runtime.keep_freed_memory():
        log.debug("malloc: no mmap for large blocks, no heap trimming, for the rest of this process")
    show_bar = rt.is_main and tc.progress and sys.stderr.isatty()
    bar = tqdm(total=tc.max_steps, initial=state.step, disable=not show_bar, dynamic_ncols=True, unit="step")
    window = Window()
    model.train()
    with sigint_requests_stop(rt.is_main) as stop, contextlib.closing(bar):
        while not done(state, ep, tc):
            t0 = time.perf_counter()
            group, ep = next_group(data, ep, state, model, cfg, rt)
            loss = backward(model, ddp_model, group, scaler, cfg, rt)
            if not math.isfinite(loss):
                good = ckpt.step_dirs(run_dir)
                raise TrainingError(
                    f"loss is {loss} at step {state.step + 1}; stopping. The last good checkpoint is "
                    f"{good[-1][1] if good else 'none'}; try a lower train.lr or train.precision=fp32"
                )
            lr = lr_at(state.step + 1, tc, cfg.model.d_model, state.elapsed)
            grad_norm = update(model, optimizer, scaler, lr, tc.clip_norm)
            state.step += 1
            window.add(loss, sum(b.n_tgt_tokens for b in group), time.perf_counter() - t0)
            if state.step % tc.log_every == 0 or state.step == tc.max_steps:
                row = {
                    "step": state.step,
                    "epoch": state.epoch,
                    "loss": window.loss / window.steps,
                    "lr": lr,
                    "tokens_per_s": window.tokens * rt.world / max(window.seconds, 1e-9),
                    "grad_norm": grad_norm,
                    "padding": ep.padding,
                    "elapsed_s": round(state.elapsed + time.perf_counter() - t0, 2),
                }
                metrics.write(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
                if not show_bar and rt.is_main:
                    log.info("step %d: loss %.3f, lr %.2e, %.0f tokens/s", *(row[k] for k in LOGGED))
                window = Window()
            bar.update(1)
            if rt.is_main and data.valid is not None and state.step % tc.eval_every == 0:
                evaluate_and_log()
            state.elapsed += time.perf_counter() - t0  # the wall-clock budget counts evaluation too
            if tc.max_minutes is not None:  # rank 0's clock for all: one lr, one last step
                state.elapsed = rank0_value(state.elapsed, rt)
            if state.step % tc.save_every == 0:
                save()
            if stop.is_set():
                save()
                log.warning("interrupted at step %d; checkpoint saved. Run the same command to resume.", state.step)
                raise KeyboardInterrupt
    # A finished run that is started again resumes, finds nothing to do and returns: no second final eval.
    has_weights = (run_dir / ckpt.WEIGHTS).is_file()
    if rt.is_main and (state.step > start_step or not has_weights):
        if data.valid is None:  # nothing to choose by: the last weights
            ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
        elif state.step % tc.eval_every != 0 or not has_weights:
            evaluate_and_log()
        if state.step % tc.save_every != 0:
            save()
    if rt.world > 1:
        dist.barrier()
    return run_dir


LOGGED = ("step", "loss", "lr", "tokens_per_s")


def rank0_value(value: float, rt: Runtime) -> float:
    """Rank 0's value of a number on every rank."""
    if rt.world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.broadcast(t, 0)
    return t.item()


def done(state: TrainState, ep: Epoch, tc: TrainConfig) -> bool:
    """Whether a stopping criterion (steps, epochs, wall-clock minutes) is met."""
    if state.step >= tc.max_steps:
        return True
    # An epoch whose batches are all trained counts as done, before the next one is drawn.
    epochs_done = state.epoch + (state.batch_pos >= len(ep.batches))
    if tc.max_epochs is not None and epochs_done >= tc.max_epochs:
        return True
    return tc.max_minutes is not None and state.elapsed >= tc.max_minutes * 60


def train_from_file(config_path: str | Path, run_dir: str | Path | None, overrides: list[str]) -> Path:
    """The `nanomt train` entry: load YAML + overrides and train in run_dir (default runs/<config name>)."""
    cfg = load_config(config_path, overrides)
    run_dir = Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem
    return train(cfg, run_dir)
