"""Training: label-smoothed loss, inverse-sqrt schedule, the loop with evaluation, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import logging
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from nanomt import checkpoint as ckpt
from nanomt.config import Config, SplitConfig, TrainConfig, load_config, save_config, to_dict
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
from nanomt.tokenizer import PAD_ID, Tokenizer, train_tokenizer
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


def dropout_at(step: int, cfg: Config, elapsed: float = 0.0) -> float:
    """model.dropout, or during train.dropout_ramp of the budget the curriculum from train.dropout_start to it."""
    tc, p = cfg.train, cfg.model.dropout
    if tc.dropout_start is None:
        return p
    spent = step / tc.max_steps
    if tc.max_minutes is not None:
        spent = max(spent, elapsed / (tc.max_minutes * 60))
    return tc.dropout_start + (p - tc.dropout_start) * min(spent / tc.dropout_ramp, 1.0)


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


def pick_device(name: str) -> torch.device:
    """`auto` is CUDA when present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TrainingError(f"train.device={name} but CUDA is not available")
    return torch.device(name)


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (<malloc.h>)


def user_allocator_settings() -> list[str]:
    """The environment variables by which the user chose glibc malloc settings or another allocator."""
    return [k for k in os.environ if k in ("GLIBC_TUNABLES", "LD_PRELOAD") or k.startswith("MALLOC_")]


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve large blocks from its heap and keep what is freed; False where it did nothing."""
    # By default glibc gives each block over its mmap threshold (at most 32 MB, so a step's (B*T, V) logits and
    # their gradient) pages of its own and unmaps them on free: every step faulted ~50,000 fresh pages in again,
    # 1.09-1.25x of the Multi30k fp32 step, 1.01-1.06x of the bf16 one (benchmarks/README.md). Allocator
    # settings of the user's own win.
    if sys.platform != "linux" or user_allocator_settings():
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own malloc
        return False
    return libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**30) == 1


@functools.cache
def cpu_has_bf16_kernels() -> bool:
    """Whether oneDNN has bf16 matmul kernels for this CPU (AVX-512 or AMX); else bf16 falls to a scalar loop."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a PyTorch without this (private) query: fp32 is the safe choice
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is bf16 where the device has bf16 matrix kernels, else fp32; other settings are kept as they are."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        # Not counting emulation: pre-Ampere GPUs (V100, T4) "support" bf16 at a fraction of their fp32 speed.
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_bf16_kernels() else "fp32"


def autocast(precision: str, device: torch.device):
    """Mixed-precision context for the forward pass; the caller owns it, the model knows nothing of it."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise TrainingError("train.precision=fp16 needs CUDA; use bf16 on the CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------
# RNG and trainer state.
# ---------------------------------------------------------------------------------------------------------


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as plain tensors/ints (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": pos,
            "has_gauss": has_gauss,
            "gauss": gauss,
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state saved."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    """Seed every RNG a run touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------------------
# Setup: run directory, tokenizer, binarized data, model.
# ---------------------------------------------------------------------------------------------------------


def has_split(cfg: Config, name: str) -> bool:
    """Whether the config names data for a split."""
    return cfg.data.hf is not None or getattr(cfg.data, name) != SplitConfig()


def check_options(cfg: Config) -> None:
    """TrainingError for options that do not combine, before the run directory or tokenizer is made."""
    tc = cfg.train
    if cfg.model.restrict_output and cfg.data.bpe_dropout:
        raise TrainingError(
            "model.restrict_output needs data.bpe_dropout: 0 (dropout segmentations use target ids that "
            "the plain one never does)"
        )
    if tc.bidirectional_epochs and not cfg.data.shared_vocab:
        raise TrainingError(
            "train.bidirectional_epochs needs data.shared_vocab: true (the reversed pairs feed target ids "
            "to the encoder and source ids to the decoder)"
        )
    if tc.bidirectional_epochs and cfg.model.restrict_output and tc.accum_steps > 1:
        # A group of batches spanning the switch would score its reversed pairs with the narrowed output layer.
        raise TrainingError("train.bidirectional_epochs with model.restrict_output needs train.accum_steps: 1")


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


@torch.no_grad()
def evaluate_loss(model, corpus: Corpus, cfg: Config, device: torch.device) -> float:
    """Label-smoothed loss per target token on a corpus."""
    total, tokens = 0.0, 0
    for idx in make_batches(corpus.src_lens, corpus.tgt_lens, cfg.train.max_tokens, 0, 0, shuffle=False):
        batch = collate(corpus, idx).to(device)
        with autocast(cfg.train.precision, device):
            logits = model(batch.src, batch.tgt_in, restricted=True)
        target = model.output_targets(batch.tgt_out)  # with restrict_output, ids it never scores are skipped
        total += label_smoothed_loss(logits, target, cfg.train.label_smoothing, PAD_ID).item()
        tokens += int((target != PAD_ID).sum())
    return total / max(tokens, 1)


# ---------------------------------------------------------------------------------------------------------
# The loop.
# ---------------------------------------------------------------------------------------------------------


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


def distributed_context() -> tuple[int, int]:
    """(rank, world size) under torchrun, starting the process group once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def train(cfg: Config, run_dir: str | Path) -> Path:
    """Train (or resume) a run in `run_dir`; returns the run directory."""
    run_dir = Path(run_dir)
    tc = cfg.train
    check_options(cfg)
    rank, world = distributed_context()
    device = pick_device(tc.device)
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.set_num_threads(tc.num_threads or max(1, (os.cpu_count() or 1) // world))
    if rank == 0:
        cfg, tokenizer = prepare_run_dir(cfg, run_dir)
    if world > 1:
        dist.barrier()
        if rank != 0:
            cfg, tokenizer = prepare_run_dir_follower(cfg, run_dir)
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "bin"
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    corpus = binarize(cfg.data, "train", tokenizer, cache, max_len=max_len)
    valid = valid_set(cfg, tokenizer, cache) if rank == 0 else None
    if len(corpus) == 0:
        raise TrainingError("no training pairs left after filtering")

    seed_everything(tc.seed)
    model = Transformer(cfg.model).to(device)
    if cfg.model.restrict_output:
        model.set_output_vocab(torch.from_numpy(output_ids(corpus)))
        if rank == 0:
            log.info(
                "output layer: %d of %d target ids (the training targets')",
                len(model.output_ids),
                len(model.output_mask),
            )
    # With restrict_output, each epoch's output ids: a bidirectional epoch's targets are both sides' sentences.
    vocab_of = {}
    if cfg.model.restrict_output:
        vocab_of[False] = model.output_ids.clone()
        if tc.bidirectional_epochs:
            vocab_of[True] = torch.from_numpy(output_ids(both_directions(corpus)))
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=lr_at(1, tc, cfg.model.d_model),
        betas=tc.betas,
        eps=tc.eps,
        weight_decay=tc.weight_decay,
        # One kernel over all parameters instead of ~10 passes per tensor: the default for-loop AdamW is ~10%
        # of a BASE-sized fp32 step on a CPU (benchmarks/README.md). Same update and state; a run resumed from
        # a checkpoint of an older nanomt keeps that checkpoint's (unfused) setting.
        fused=device.type in ("cpu", "cuda"),
    )
    step, epoch, batch_pos, elapsed, best_bleu = 0, 0, 0, 0.0, -1.0
    last = ckpt.step_dirs(run_dir)
    if last:
        step_dir = last[-1][1]
        ckpt.load_weights(model, step_dir / ckpt.WEIGHTS)
        state = ckpt.load_trainer_state(step_dir)
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, batch_pos = state["step"], state["epoch"], state["batch_pos"]
        elapsed, best_bleu = state["elapsed"], state["best_bleu"]
        set_rng_state(state["rng"][rank] if isinstance(state["rng"], list) else state["rng"])
        if rank == 0:
            log.info("resuming from %s (step %d, epoch %d)", step_dir, step, epoch)
    ddp_model = model
    if world > 1:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    precision = resolve_precision(tc.precision, device)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    if rank == 0 and precision == "bf16" and device.type == "cpu" and not cpu_has_bf16_kernels():
        # An AVX2-only CPU: PyTorch's fallback bf16 matmul is a scalar loop (0.9 against 51 GFLOP/s in fp32).
        log.warning(
            "train.precision=bf16 on a CPU without bf16 matrix kernels (no AVX-512/AMX): ~60x slower "
            "than fp32; use train.precision=auto or fp32"
        )

    if rank == 0:
        log.info(
            "model: %s parameters; %d training pairs (%s); device %s, %d threads, %s",
            f"{model.num_parameters():,}",
            len(corpus),
            corpus.stats,
            device,
            torch.get_num_threads(),
            precision if precision == tc.precision else f"{tc.precision} ({precision})",
        )
    metrics = MetricsLog(run_dir / "metrics.jsonl", rank == 0, step, tc.tensorboard)

    texts = corpus_texts(corpus, tokenizer) if cfg.data.bpe_dropout else None

    def epoch_data(e: int) -> tuple[Corpus, list, float]:
        """Epoch e's corpus (a fresh BPE-dropout segmentation; both directions), this rank's batches, padding."""
        c = corpus
        if texts is not None:  # seeded by (seed, epoch): a resumed run re-draws the same segmentation
            c = resegment(corpus, texts, tokenizer, cfg.data.bpe_dropout, tc.seed * 100_003 + e, max_len)
        bidir = e < tc.bidirectional_epochs
        if bidir:
            c = both_directions(c)
        if vocab_of:  # set here, not only at the switch, so that a resumed run scores the epoch's ids
            model.set_output_vocab(vocab_of[bidir])
        batches = shard(make_batches(c.src_lens, c.tgt_lens, tc.max_tokens, tc.seed, e), rank, world)
        return c, batches, padding_fraction(batches, c.src_lens, c.tgt_lens)

    def save(reason: str) -> None:
        if rank != 0:
            return
        state = {
            "optimizer": optimizer.state_dict(),
            "step": step,
            "epoch": epoch,
            "batch_pos": batch_pos,
            "elapsed": elapsed,
            "best_bleu": best_bleu,
            "rng": rng_state(),
        }
        path = ckpt.save_training_checkpoint(run_dir, step, model, state, tc.keep_last)
        log.debug("saved %s (%s)", path, reason)

    def run_eval() -> None:
        nonlocal best_bleu
        if valid is None:
            return
        model.eval()
        vcorpus, srcs, refs = valid
        row = {"step": step, "epoch": epoch, "valid_loss": evaluate_loss(model, vcorpus, cfg, device)}
        if srcs:
            translator = Translator(model, tokenizer, cfg, device)
            with autocast(precision, device):
                hyps = translator.translate(srcs, beam_size=1, max_tokens=tc.max_tokens)
            row["valid_bleu"] = bleu(hyps, refs)
        row["elapsed_s"] = round(elapsed, 2)
        model.train()
        metrics.write(row)
        score = row.get("valid_bleu", -row["valid_loss"])
        if score > best_bleu or not (run_dir / ckpt.WEIGHTS).is_file():
            best_bleu = max(score, best_bleu)
            ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
        log.info(
            "step %d: valid loss %.3f%s",
            step,
            row["valid_loss"],
            f", valid BLEU {row['valid_bleu']:.2f}" if "valid_bleu" in row else "",
        )

    stop_requested = []
    old_handler = signal.getsignal(signal.SIGINT)
    if rank == 0 and threading_main():
        signal.signal(signal.SIGINT, lambda *_: stop_requested.append(True))

    start_step = step
    epoch_corpus, batches, padding = epoch_data(epoch)
    if rank == 0:
        log.info("padding fraction %.3f", padding)
    # After the set-up (tokenizer, binarizing), whose freed memory the heap would otherwise keep for the whole run.
    if device.type == "cpu" and keep_freed_memory():
        log.debug("malloc: no mmap for large blocks, no heap trimming, for the rest of this process")
    show_bar = rank == 0 and tc.progress and sys.stderr.isatty()
    bar = tqdm(total=tc.max_steps, initial=step, disable=not show_bar, dynamic_ncols=True, unit="step")
    model.train()
    window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0}
    interrupted = False
    try:
        while not done(step, epoch, elapsed, tc):
            t0 = time.perf_counter()
            group: list[Batch] = []
            while len(group) < tc.accum_steps:
                if batch_pos >= len(batches):
                    epoch, batch_pos = epoch + 1, 0
                    epoch_corpus, batches, padding = epoch_data(epoch)
                group.append(collate(epoch_corpus, batches[batch_pos]).to(device))
                batch_pos += 1
            n_tokens = sum(b.n_tgt_tokens for b in group)
            if world > 1:  # normalize by the global token count so that DDP's gradient average is exact
                t = torch.tensor([n_tokens], dtype=torch.float64, device=device)
                dist.all_reduce(t)
                n_tokens = t.item() / world
            lr = lr_at(step + 1, tc, cfg.model.d_model, elapsed)
            for g in optimizer.param_groups:
                g["lr"] = lr
            if tc.dropout_start is not None:
                model.set_dropout(dropout_at(step + 1, cfg, elapsed))
            loss_sum = 0.0
            for i, b in enumerate(group):
                sync = contextlib.nullcontext() if world == 1 or i == len(group) - 1 else ddp_model.no_sync()
                with sync:
                    with autocast(precision, device):
                        logits = ddp_model(b.src, b.tgt_in, restricted=True)
                    target = model.output_targets(b.tgt_out)
                    loss = label_smoothed_loss(logits, target, tc.label_smoothing, PAD_ID) / n_tokens
                    (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.item()
            if world > 1:  # every rank logs, and stops on, the loss of the whole global batch
                t = torch.tensor([loss_sum], dtype=torch.float64, device=device)
                dist.all_reduce(t)
                loss_sum = t.item() / world
            if not math.isfinite(loss_sum):
                good = ckpt.step_dirs(run_dir)
                raise TrainingError(
                    f"loss is {loss_sum} at step {step + 1}; stopping. The last good checkpoint is "
                    f"{good[-1][1] if good else 'none'}; try a lower train.lr or train.precision=fp32"
                )
            if scaler:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm or float("inf")).item()
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            dt = time.perf_counter() - t0
            window["loss"] += loss_sum
            window["tokens"] += sum(b.n_tgt_tokens for b in group)
            window["time"] += dt
            window["steps"] += 1
            if step % tc.log_every == 0 or step == tc.max_steps:
                row = {
                    "step": step,
                    "epoch": epoch,
                    "loss": window["loss"] / window["steps"],
                    "lr": lr,
                    "tokens_per_s": window["tokens"] * world / max(window["time"], 1e-9),
                    "grad_norm": grad_norm,
                    "padding": padding,
                    "elapsed_s": round(elapsed + dt, 2),
                }
                if tc.dropout_start is not None:
                    row["dropout"] = model.src_embed.dropout.p
                metrics.write(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
                if not show_bar and rank == 0:
                    log.info(
                        "step %d: loss %.3f, lr %.2e, %.0f tokens/s",
                        step,
                        row["loss"],
                        lr,
                        row["tokens_per_s"],
                    )
                window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0}
            bar.update(1)
            if rank == 0 and step % tc.eval_every == 0:
                run_eval()
            elapsed += time.perf_counter() - t0  # the wall-clock budget counts evaluation too
            if world > 1 and tc.max_minutes is not None:  # rank 0's clock for all: one lr, one last step
                t = torch.tensor([elapsed], dtype=torch.float64, device=device)
                dist.broadcast(t, 0)
                elapsed = t.item()
            if step % tc.save_every == 0:
                save("periodic")
            if stop_requested:
                interrupted = True
                break
    finally:
        bar.close()
        if rank == 0 and threading_main():
            signal.signal(signal.SIGINT, old_handler)
    if interrupted:
        save("interrupted")
        log.warning("interrupted at step %d; checkpoint saved. Run the same command to resume.", step)
        raise KeyboardInterrupt
    # A finished run that is started again resumes, finds nothing to do and returns: no second final eval.
    has_weights = (run_dir / ckpt.WEIGHTS).is_file()
    if rank == 0 and (step > start_step or not has_weights):
        if step % tc.eval_every != 0 or not has_weights:
            if valid is not None:
                run_eval()
            else:
                ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
        if step % tc.save_every != 0:
            save("final")
    if world > 1:
        dist.barrier()
    return run_dir


def done(step: int, epoch: int, elapsed: float, tc: TrainConfig) -> bool:
    """Whether a stopping criterion (steps, epochs, wall-clock minutes) is met."""
    if step >= tc.max_steps:
        return True
    if tc.max_epochs is not None and epoch >= tc.max_epochs:
        return True
    return tc.max_minutes is not None and elapsed >= tc.max_minutes * 60


def threading_main() -> bool:
    """Signal handlers can only be installed from the main thread."""
    import threading

    return threading.current_thread() is threading.main_thread()


def prepare_run_dir_follower(cfg: Config, run_dir: Path) -> tuple[Config, Tokenizer]:
    """Non-zero DDP ranks read what rank 0 prepared."""
    return load_config(run_dir / ckpt.CONFIG), Tokenizer.load(run_dir / ckpt.TOKENIZER)


def train_from_file(config_path: str | Path, run_dir: str | Path | None, overrides: list[str]) -> Path:
    """The `nanomt train` entry: load YAML + overrides and train in run_dir (default runs/<config name>)."""
    cfg = load_config(config_path, overrides)
    run_dir = Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem
    return train(cfg, run_dir)
