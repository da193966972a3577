"""Training: the label-smoothed loss, the learning-rate schedule, one optimizer step, and the loop, read top to
bottom: prepare the data, build the model, resume, then step, log, evaluate and save until the budget is spent."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from nanomt.core import checkpoint as ckpt
from nanomt.core import runtime
from nanomt.core.batches import bucket, make_batches
from nanomt.core.checkpoint import TrainState
from nanomt.core.config import Config, TrainConfig, load_config
from nanomt.core.model import Transformer
from nanomt.core.runtime import Runtime, autocast
from nanomt.decoding.translate import Translator
from nanomt.training.data import Batch, Corpus, collate, pack
from nanomt.training.errors import TrainingError
from nanomt.training.evaluate import calibrate_run
from nanomt.training.metrics import COLLAPSED_BELOW, bleu, bleu_by_language, source_dependence
from nanomt.training.metrics_log import MetricsLog, Window
from nanomt.training.prepare import TrainData, prepare_data
from nanomt.training.ranks import lost_ranks_fail_clearly, rank0_value, sigint_requests_stop
from nanomt.training.stream import (
    PAD_MULTIPLE,
    Epoch,
    Group,
    Prefetcher,
    bucketed,
    epoch_batches,
    pack_row_tokens,
    pad_width,
    pinned,
    to_device,
)

log = logging.getLogger("nanomt")


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
    if step < warmup:  # fairseq's inverse_sqrt and the constant schedule: the same ramp, with lr as its peak
        return cfg.lr * step / warmup
    return cfg.lr if cfg.schedule == "constant" else cfg.lr * math.sqrt(warmup / step)


class LabelSmoothedLoss(torch.autograd.Function):
    """Summed label-smoothed cross-entropy whose gradient is computed with the loss, in cache-sized row blocks.

    d loss / d logits = softmax(logits) - q, with q = (1 - eps) on the gold token + eps / V everywhere, so the
    forward pass can write the gradient directly. Done in blocks of `ROWS` rows, the (N, V) logits are read
    once instead of the ~10 full passes of log_softmax + smoothing + their backward (2x faster on a CPU).
    """

    ROWS = 32

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int, rows: int = ROWS
    ) -> torch.Tensor:
        n, v = logits.shape
        grad = torch.empty_like(logits)
        total = logits.new_zeros((), dtype=torch.float64)
        for i in range(0, n, rows):
            logp = logits[i : i + rows].float().log_softmax(dim=-1)  # (R, V)
            y = target[i : i + rows, None]  # (R, 1)
            keep = (y != pad_id).to(logp.dtype)  # (R, 1)
            nll, smooth = logp.gather(1, y), logp.sum(dim=1, keepdim=True) / v
            total += (-(1 - smoothing) * nll - smoothing * smooth).mul(keep).sum().double()
            g = logp.exp_().sub_(smoothing / v)  # softmax - eps / V
            g.scatter_add_(1, y, torch.full_like(keep, smoothing - 1))  # - (1 - eps) on the gold token
            grad[i : i + rows] = g.mul_(keep)
        ctx.save_for_backward(grad)
        return total.float()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None, None


def label_smoothed_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    smoothing: float,
    pad_id: int,
    fused: bool | None = None,
    rows: int = LabelSmoothedLoss.ROWS,
) -> torch.Tensor:
    """Summed cross-entropy with label smoothing (Szegedy et al., 2016), padding positions ignored.

    Equal to F.cross_entropy(..., label_smoothing=smoothing, ignore_index=pad_id, reduction="sum"), which is what
    runs where `fused` (default: on CUDA, where it is a few fused kernels); LabelSmoothedLoss elsewhere (a CPU), in
    blocks of `rows` rows (a GPU wants thousands: each block is a few kernels, and no fp32 (N, V) copy is kept).
    """
    logits, target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
    if logits.is_cuda if fused is None else fused:
        return F.cross_entropy(logits.float(), target, ignore_index=pad_id, label_smoothing=smoothing, reduction="sum")
    return LabelSmoothedLoss.apply(logits, target, smoothing, pad_id, rows)


# ---------------------------------------------------------------------------------------------------------
# The step: its batches, backward, update.
# ---------------------------------------------------------------------------------------------------------


def set_output_vocab(model: Transformer, data: TrainData, epoch: int, tc: TrainConfig) -> None:
    """restrict_output: the target ids epoch `epoch` scores (more of them while pairs are also reversed)."""
    if data.output_vocab:  # set at every epoch start, not only at the switch, so that a resumed run scores them
        model.set_output_vocab(data.output_vocab[epoch < tc.bidirectional_epochs])


def collate_for_step(corpus: Corpus, indices, cfg: Config, rt: Runtime) -> Batch:
    """One step's batch as the device takes it: padded (to PAD_MULTIPLE on CUDA), or packed rows (train.packed);
    under train.compile, widths (and padded batches' rows) in `bucket` sizes, so that the compiled step meets a
    bounded number of shapes."""
    ids, cuda, compiled = cfg.model.special_ids, rt.device.type == "cuda", cfg.train.compile
    if cfg.train.packed:
        row_tokens = pack_row_tokens(cfg, rt)
        b = pack(corpus, indices, ids, row_tokens, PAD_MULTIPLE if cuda else 1, bucket if compiled else None)
    else:
        b = collate(corpus, indices, ids)
        if compiled:
            b = bucketed(b, ids.pad)
        elif cuda:
            b = pad_width(b, PAD_MULTIPLE, ids.pad)
    return pinned(b) if cuda else b


def step_batches(data: TrainData, epoch: int, pos: int, cfg: Config, rt: Runtime) -> Iterator[tuple]:
    """This rank's (epoch, position, its Epoch, batch) from (epoch, position) on, each batch as the step takes it."""
    while True:
        ep = epoch_batches(data, epoch, cfg, rt)
        if rt.is_main:
            log.debug("epoch %d: padding fraction %.3f", epoch, ep.padding)
        for i in range(pos, len(ep.batches)):
            yield epoch, i, ep, collate_for_step(ep.corpus, ep.batches[i], cfg, rt)
        epoch, pos = epoch + 1, 0


class BatchStream(Prefetcher):
    """step_batches, collated by a background thread a few batches ahead.

    The order is the plan's, a function of (seed, epoch) alone, so a resumed run takes the same batches. On CUDA
    they come padded to PAD_MULTIPLE (or packed, train.packed) and in pinned memory, so that their copy to the GPU
    overlaps the step. Started by the first peek: a finished run that is started again draws no epoch.
    """

    def __init__(self, data: TrainData, epoch: int, pos: int, cfg: Config, rt: Runtime):
        super().__init__(step_batches(data, epoch, pos, cfg, rt), name="nanomt-collate")


def next_group(
    stream: BatchStream, state: TrainState, model: Transformer, data: TrainData, cfg: Config, rt: Runtime
) -> tuple[Group, Epoch]:
    """The next accum_steps batches on the device; the state's position moves past them, to a new epoch if one ends."""
    batches, tokens = [], 0
    for _ in range(cfg.train.accum_steps):
        if batches and budget_spent(state, stream, cfg.train):  # the data ends within the group: a shorter last one
            break
        epoch, pos, ep, b = stream.get()
        if epoch != state.epoch:
            set_output_vocab(model, data, epoch, cfg.train)
        state.epoch, state.batch_pos = epoch, pos + 1
        batches.append(to_device(b, rt))
        tokens += ep.tokens[pos]
    return Group(batches, tokens), ep


def backward(model: Transformer, ddp_model, group: Group, scaler, cfg: Config, rt: Runtime) -> torch.Tensor:
    """Gradients of the group's summed loss over the target tokens of all ranks; returns this rank's share of it.

    The share stays on the device (the mean over the ranks is the step's loss, read at log intervals): the step
    waits for nothing. The token count comes from the batch plan, on the host: no collective either.
    """
    # Normalized by the ranks' mean token count, so that DDP's average of the ranks' gradients is exact.
    n_tokens = group.tokens / rt.world
    losses = []
    for i, b in enumerate(group.batches):
        last = i == len(group.batches) - 1
        with contextlib.nullcontext() if rt.world == 1 or last else ddp_model.no_sync():
            with autocast(rt.precision, rt.device):
                logits = ddp_model(b.src, b.tgt_in, restricted=True, packing=b.packing)
            target = model.output_targets(b.tgt_out)
            loss = label_smoothed_loss(logits, target, cfg.train.label_smoothing, model.output_pad) / n_tokens
            (scaler.scale(loss) if scaler else loss).backward()
        losses.append(loss.detach())
    return torch.stack(losses).sum()


def update(model: Transformer, optimizer: torch.optim.Optimizer, scaler, lr: float, clip_norm: float) -> torch.Tensor:
    """Clip the gradients, step the optimizer at `lr`, zero the gradients; returns the norm before clipping."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    if scaler:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm or float("inf"))
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach()


def check_finite(losses: list[float], first_step: int, run_dir: Path) -> None:
    """A non-finite loss stops training, naming the last checkpoint written before it (all checked ones)."""
    bad = [(i, x) for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        good = ckpt.step_dirs(run_dir)
        raise TrainingError(
            f"loss is {bad[0][1]} at step {first_step + bad[0][0]}; stopping. The last good checkpoint is "
            f"{good[-1][1] if good else 'none'}; try a lower train.lr or train.precision=fp32"
        )


# ---------------------------------------------------------------------------------------------------------
# Evaluation: validation loss and BLEU, the best weights.
# ---------------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_loss(model: Transformer, corpus: Corpus, cfg: Config, rt: Runtime) -> float:
    """Label-smoothed loss per target token on a corpus; each rank scores its share of the batches."""
    sums = torch.zeros(2, dtype=torch.float64, device=rt.device)  # loss, target tokens
    batches = make_batches(corpus.src_lens, corpus.tgt_lens, cfg.train.max_tokens, 0, 0, shuffle=False)
    for idx in batches[rt.rank :: rt.world]:
        batch = to_device(collate(corpus, idx, cfg.model.special_ids), rt)
        with autocast(rt.precision, rt.device):
            logits = model(batch.src, batch.tgt_in, restricted=True)
        target = model.output_targets(batch.tgt_out)  # with restrict_output, ids it never scores are skipped
        sums[0] += label_smoothed_loss(logits, target, cfg.train.label_smoothing, model.output_pad)
        sums[1] += (target != model.output_pad).sum()
    if rt.world > 1:
        dist.all_reduce(sums)
    loss, tokens = sums.tolist()
    return loss / max(tokens, 1)


def evaluate(model: Transformer, data: TrainData, cfg: Config, rt: Runtime) -> dict | None:
    """Validation loss per target token, and greedy BLEU on the first valid_bleu_sentences pairs.

    Every rank evaluates its share, so that none waits for the others in a collective meanwhile; rank 0 gets the
    row, the others None.
    """
    corpus, srcs, refs = data.valid
    model.eval()
    row = {"valid_loss": evaluate_loss(model, corpus, cfg, rt)}
    if srcs:
        mine = srcs[rt.rank :: rt.world]
        translator = Translator(model, data.tokenizer, cfg, rt.device)
        with autocast(rt.precision, rt.device):
            hyps = translator.translate(mine, beam_size=1, max_tokens=cfg.train.max_tokens) if mine else []
        if rt.world > 1:  # sentence i was rank i % world's
            parts = [None] * rt.world if rt.is_main else None
            dist.gather_object(hyps, parts, dst=0, group=rt.host_group)
            hyps = [parts[i % rt.world][i // rt.world] for i in range(len(srcs))] if rt.is_main else []
        row["valid_bleu"] = bleu(hyps, refs) if rt.is_main else 0.0
        row["valid_distinct"] = round(source_dependence(srcs, hyps), 4) if rt.is_main else 0.0
        if rt.is_main and cfg.data.target_languages:  # a multilingual model: each target language's own
            row["valid_bleu_by_language"] = bleu_by_language(srcs, hyps, refs)
    model.train()
    return row if rt.is_main else None


def keep_best(model: Transformer, row: dict, state: TrainState, run_dir: Path) -> None:
    """model.safetensors holds the weights of the best evaluation so far: by BLEU, or by loss where there is none."""
    score = row.get("valid_bleu", -row["valid_loss"])
    better = score > state.best_score
    if better:
        state.best_score = score
    if better or not (run_dir / ckpt.WEIGHTS).is_file():
        ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)


# ---------------------------------------------------------------------------------------------------------
# The loop, then its phases in the order it calls them.
# ---------------------------------------------------------------------------------------------------------


@lost_ranks_fail_clearly
def train(cfg: Config, run_dir: str | Path) -> Path:
    """Train (or resume) a run in `run_dir`; returns the run directory."""
    run_dir, tc = Path(run_dir), cfg.train
    rt = runtime.setup(tc.device, tc.precision, tc.num_threads)
    cfg, data = prepare_data(cfg, run_dir, rt)
    model, optimizer, scaler = build(cfg, rt)
    state, resumed_from = resume(run_dir, model, optimizer, scaler, tc, rt)
    stepped = step_model(model, rt, tc.compile)
    metrics = MetricsLog(run_dir / "metrics.jsonl", rt.is_main, state.step, tc.tensorboard)
    run = Run(cfg, rt, run_dir, data, model, stepped, optimizer, scaler, metrics)
    announce(run, state, resumed_from)
    start_step = state.step
    set_output_vocab(model, data, state.epoch, tc)
    # After the set-up (tokenizer, binarizing), whose freed memory the heap would otherwise keep for the whole run.
    if rt.device.type == "cpu" and runtime.keep_freed_memory():
        log.debug("malloc: no mmap for large blocks, no heap trimming, for the rest of this process")
    show_bar = rt.is_main and tc.progress and sys.stderr.isatty()  # elsewhere, log rows are log lines
    bar = tqdm(total=tc.max_steps, initial=state.step, disable=not show_bar, dynamic_ncols=True, unit="step")
    stream, window = BatchStream(data, state.epoch, state.batch_pos, cfg, rt), Window(state.step)
    model.train()
    with sigint_requests_stop(True) as stop, contextlib.closing(bar), contextlib.closing(stream):
        while not (budget_spent(state, stream, tc) or out_of_time(state, tc)):
            group, ep = next_group(stream, state, model, data, cfg, rt)
            loss = backward(model, stepped, group, scaler, cfg, rt)
            lr = lr_at(state.step + 1, tc, cfg.model.d_model, state.elapsed)
            window.add(loss, update(model, optimizer, scaler, lr, tc.clip_norm), group.tokens)
            state.step += 1
            bar.update(1)
            log_due = state.step % tc.log_every == 0 or budget_spent(state, stream, tc)
            eval_due = data.valid is not None and state.step % tc.eval_every == 0
            save_due = state.step % tc.save_every == 0
            if not (log_due or eval_due or save_due or (rt.world == 1 and stop.is_set())):
                window.tick(state, rt)
                continue  # no wait for the device: the next step is queued behind this one
            losses, norms, stopping = window.read(state, stop.is_set(), rt)
            check_finite(losses, window.first_step, run_dir)  # before any checkpoint of these steps
            if log_due:
                log_row(run, window.row(state, losses, norms, lr, ep.padding), bar)
                window.reset(state.step)
            with window.pause():
                if eval_due:
                    evaluate_and_keep_best(run, state)
                if save_due or stopping:
                    save(run, state)
            if stopping:
                log.warning("interrupted at step %d; checkpoint saved. Run the same command to resume.", state.step)
                raise KeyboardInterrupt
            window.tick(state, rt)
    finish(run, state, start_step)
    return run_dir


def build(cfg: Config, rt: Runtime) -> tuple[Transformer, torch.optim.Optimizer, torch.amp.GradScaler | None]:
    """The model, initialized from train.seed, its AdamW, and fp16's loss scaler."""
    tc = cfg.train
    random.seed(tc.seed)  # every RNG a run touches
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = Transformer(cfg.model).to(rt.device)
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
    scaler = torch.amp.GradScaler(rt.device.type) if rt.precision == "fp16" else None
    return model, optimizer, scaler


def step_model(model: Transformer, rt: Runtime, compile: bool = False) -> torch.nn.Module:
    """The model the step calls: under DistributedDataParallel with several ranks, compiled if asked."""
    stepped: torch.nn.Module = model
    if rt.world > 1:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        stepped = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    # Compiled last, around DDP, so that DDP's gradient hooks stay outside the graph; the weights stay `model`'s.
    return torch.compile(stepped, dynamic=True) if compile else stepped


def resume(
    run_dir: Path, model: Transformer, optimizer: torch.optim.Optimizer, scaler, tc: TrainConfig, rt: Runtime
) -> tuple[TrainState, Path | None]:
    """The trainer state of the run's last checkpoint and that checkpoint, or a new state (and None); a new run
    starts from the weights of train.init_from."""
    if tc.init_from and not ckpt.step_dirs(run_dir):
        ckpt.load_weights(model, ckpt.checkpoint_weights(tc.init_from))
        if rt.is_main:
            log.info("starting from the weights of %s", tc.init_from)
    return TrainState.resume_or_new(run_dir, model, optimizer, scaler, rt.rank)


@dataclass(frozen=True)
class Run:
    """What the phases of one training run share: its config, processes, directory and data, the model (and the
    model the step calls: under DDP, compiled), the optimizer, fp16's loss scaler and the metrics log."""

    cfg: Config
    rt: Runtime
    run_dir: Path
    data: TrainData
    model: Transformer
    stepped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    metrics: MetricsLog


def announce(run: Run, state: TrainState, resumed_from: Path | None) -> None:
    """Rank 0 says where the run starts, and what it trains with."""
    rt, tc = run.rt, run.cfg.train
    if not rt.is_main:
        return
    if resumed_from:
        log.info("resuming from %s (step %d, epoch %d)", resumed_from, state.step, state.epoch)
    log.info(
        "model: %s parameters; %d training pairs (%s); device %s, %d threads, %s",
        f"{run.model.num_parameters():,}",
        len(run.data.corpus),
        run.data.corpus.stats,
        rt.device,
        torch.get_num_threads(),
        rt.precision if rt.precision == tc.precision else f"{tc.precision} ({rt.precision})",
    )


def budget_spent(state: TrainState, stream: BatchStream, tc: TrainConfig) -> bool:
    """Whether the step budget is spent, or the epoch budget: the next batch would be from epoch max_epochs (the
    same on every rank at every step, so the last step is logged and a group ends where the data does)."""
    return state.step >= tc.max_steps or (tc.max_epochs is not None and stream.peek()[0] >= tc.max_epochs)


def out_of_time(state: TrainState, tc: TrainConfig) -> bool:
    """Whether the run's clock has reached train.max_minutes."""
    # The clock (state.elapsed) moves every step in one process; under DDP at log intervals, evaluations and
    # checkpoints, where the ranks take rank 0's, so that all stop at the same step.
    return tc.max_minutes is not None and state.elapsed >= tc.max_minutes * 60


def log_row(run: Run, row: dict, bar: tqdm) -> None:
    """A training row: to metrics.jsonl, and onto the progress bar, or (rank 0, no bar) as a log line."""
    run.metrics.write(row)
    bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
    if bar.disable and run.rt.is_main:
        values = row["step"], row["loss"], row["lr"], row["tokens_per_s"]
        log.info("step %d: loss %.3f, lr %.2e, %.0f tokens/s", *values)


def evaluate_and_keep_best(run: Run, state: TrainState) -> None:
    """Every rank evaluates its share; rank 0 writes the row, keeps the best weights and logs the scores."""
    row = evaluate(run.model, run.data, run.cfg, run.rt)
    if row is None:
        return
    row = {"step": state.step, "epoch": state.epoch, **row}
    run.metrics.write({**row, "elapsed_s": round(state.elapsed, 2)})
    keep_best(run.model, row, state, run.run_dir)
    bleu_text = f", valid BLEU {row['valid_bleu']:.2f}" if "valid_bleu" in row else ""
    if row.get("valid_bleu_by_language"):
        bleu_text += " (" + ", ".join(f"{c} {b:.2f}" for c, b in row["valid_bleu_by_language"].items()) + ")"
    log.info("step %d: valid loss %.3f%s", state.step, row["valid_loss"], bleu_text)
    if row.get("valid_distinct", 1.0) < COLLAPSED_BELOW:
        log.warning(
            "step %d: the validation translations hardly depend on the source (%.0f%% as many distinct translations "
            "as sources): the decoder may be ignoring the encoder. Early in training that is normal; later, see "
            "docs/distill.md (a one-layer post-norm decoder collapses so)",
            state.step,
            100 * row["valid_distinct"],
        )


def save(run: Run, state: TrainState) -> None:
    """A checkpoint of the state: every rank takes part, rank 0 writes it, with every rank's RNG states."""
    state.save(run.run_dir, run.model, run.optimizer, run.scaler, run.cfg.train.keep_last, run.rt.host_group)


def finish(run: Run, state: TrainState, start_step: int) -> None:
    """After the last step: the final evaluation and checkpoint where the loop wrote none, the calibration."""
    rt, tc, run_dir = run.rt, run.cfg.train, run.run_dir
    # A finished run that is started again resumes, finds nothing to do and returns: no second final eval.
    has_weights = rank0_value((run_dir / ckpt.WEIGHTS).is_file(), rt)
    if state.step > start_step or not has_weights:
        if run.data.valid is None:  # nothing to choose by: the last weights
            if rt.is_main:
                ckpt.save_weights(run.model, run_dir / ckpt.WEIGHTS)
        elif state.step % tc.eval_every != 0 or not has_weights:
            evaluate_and_keep_best(run, state)
        if state.step % tc.save_every != 0:
            save(run, state)
        if tc.calibrate and rt.is_main and run.data.valid is not None:
            calibrate_run(run.cfg, run_dir, rt)
    if rt.world > 1:
        dist.barrier()


def train_from_file(config_path: str | Path, run_dir: str | Path | None, overrides: list[str]) -> Path:
    """The `nanomt train` entry: load YAML + overrides and train in run_dir (default runs/<config name>)."""
    cfg = load_config(config_path, overrides)
    run_dir = Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem
    return train(cfg, run_dir)
