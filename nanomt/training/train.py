"""Training: label-smoothed loss, inverse-sqrt schedule, the loop with evaluation, checkpoints and exact resume."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import queue
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
import torch.nn.functional as F
from tqdm import tqdm

from nanomt.core import checkpoint as ckpt
from nanomt.core import runtime
from nanomt.core.batches import bucket, make_batches
from nanomt.core.checkpoint import TrainState
from nanomt.core.config import Config, SplitConfig, TrainConfig, load_config, save_config, to_dict
from nanomt.core.model import Transformer, varlen_kernel
from nanomt.core.runtime import Runtime, autocast
from nanomt.core.tokenizer import Tokenizer, train_tokenizer
from nanomt.decoding import calibration as calib
from nanomt.decoding.translate import Translator
from nanomt.training.data import (
    Batch,
    Corpus,
    CorpusText,
    Subset,
    binarize,
    both_directions,
    check_split,
    collate,
    corpora,
    corpus_texts,
    mixture,
    output_ids,
    pack,
    padding_fraction,
    resegment,
    shard,
    split_pairs,
)
from nanomt.training.evaluate import calibrate
from nanomt.training.metrics import bleu

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
# Set-up: run directory, tokenizer, binarized data, model and optimizer.
# ---------------------------------------------------------------------------------------------------------


def has_split(cfg: Config, name: str) -> bool:
    """Whether the config names data for a split."""
    return cfg.data.hf is not None or getattr(cfg.data, name) != SplitConfig()


def check_run_dir(run_dir: Path) -> None:
    """A --run-dir is new, or one that training made: a model made otherwise (imported, averaged) is never touched."""
    if (run_dir / ckpt.CHECKPOINTS).is_dir():  # made by train at the start of the run
        return
    # A tokenizer alone is no model: one put there beforehand is the run's vocabulary (run_tokenizer loads it).
    found = [name for name in (ckpt.CONFIG, ckpt.WEIGHTS) if (run_dir / name).exists()]
    if found:
        raise TrainingError(
            f"{run_dir} holds a model that was not trained there ({found[0]}: an imported or averaged checkpoint?); "
            f"nothing was written. To fine-tune it: train.init_from={run_dir} (--init-from) and another --run-dir"
        )


def init_tokenizer(init_from: Path, run_dir: Path) -> Tokenizer:
    """The tokenizer of checkpoint `init_from`, after checking it is the one its weights were trained with."""
    tokenizer_dir = ckpt.find_run_files(init_from)[1]
    tokenizer = Tokenizer.load(tokenizer_dir)
    stored = ckpt.weights_fingerprint(ckpt.checkpoint_weights(init_from))
    if stored is not None and stored != tokenizer.fingerprint():
        raise TrainingError(
            f"train.init_from {init_from}: its weights were trained with tokenizer {stored[:12]}, but "
            f"{tokenizer_dir} holds {tokenizer.fingerprint()[:12]}"
        )
    return tokenizer


def run_tokenizer(cfg: Config, run_dir: Path) -> Tokenizer:
    """The run's tokenizer: its own (a restart), the init_from checkpoint's, or one trained on the training data."""
    tok_dir = run_dir / ckpt.TOKENIZER
    if any(tok_dir.glob("*.model")):
        # A restart reads no corpus file here: binarize checks the files when its cache misses.
        return Tokenizer.load(tok_dir)
    if cfg.train.init_from:
        tokenizer = init_tokenizer(Path(cfg.train.init_from), run_dir)
        tokenizer.save(tok_dir)
        return tokenizer
    if cfg.data.hf is None:  # every file problem surfaces before the tokenizer is trained
        for name in ("train", "valid") if has_split(cfg, "valid") else ("train",):
            for where, split in corpora(cfg.data, name):
                check_split(split, where)
    log.info("training a %s tokenizer (vocab %d) on the training data", cfg.data.tokenizer, cfg.data.vocab_size)
    return train_tokenizer(
        (s for s, _ in split_pairs(cfg.data, "train")),
        (t for _, t in split_pairs(cfg.data, "train")),
        tok_dir,
        cfg.data,
    )


def with_tokenizer(cfg: Config, tokenizer: Tokenizer) -> Config:
    """The config with the tokenizer's vocabulary sizes, and its special ids for a model trained from scratch."""
    if cfg.train.init_from:  # the checkpoint's model, whose ids its tokenizer was checked against
        model = cfg.model
    else:
        bos = cfg.model.bos_id if tokenizer.bos_id is None else tokenizer.bos_id
        model = dataclasses.replace(
            cfg.model,
            src_vocab_size=tokenizer.src_vocab_size,
            tgt_vocab_size=tokenizer.tgt_vocab_size,
            pad_id=tokenizer.pad_id,
            bos_id=bos,
            eos_id=tokenizer.eos_id,
        )
    try:
        tokenizer.check_model_ids(model)
    except ValueError as e:
        raise TrainingError(str(e)) from None
    return dataclasses.replace(cfg, model=model)


def prepare_run_dir(cfg: Config, run_dir: Path) -> tuple[Config, Tokenizer]:
    """Train (checking the corpus first) or load the tokenizer, fix vocabulary sizes in the config, save config.yaml."""
    check_run_dir(run_dir)
    init_from = Path(cfg.train.init_from) if cfg.train.init_from else None
    if init_from is not None and init_from.resolve() in (run_dir.resolve(), run_dir.resolve().parent.parent):
        raise TrainingError(f"train.init_from {init_from} is the --run-dir itself; give the fine-tuning run its own")
    (run_dir / ckpt.CHECKPOINTS).mkdir(parents=True, exist_ok=True)  # marks the directory as a training run's
    tokenizer = run_tokenizer(cfg, run_dir)
    cfg = with_tokenizer(cfg, tokenizer)
    saved = run_dir / ckpt.CONFIG
    if saved.is_file():
        old = load_config(saved)
        for section in ("model", "data"):
            a, b = to_dict(getattr(old, section)), to_dict(getattr(cfg, section))
            diff = [k for k in a if a[k] != b.get(k)]
            if diff:
                raise TrainingError(
                    f"{run_dir} holds a run with another {section} config ({section}.{diff[0]}: "
                    f"{a[diff[0]]!r} there, {b[diff[0]]!r} now); use another --run-dir"
                )
    # Resolved: the model section is whole, so the run loads without the checkpoint it started from.
    save_config(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=None)), saved)
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
    texts: tuple[CorpusText, CorpusText] | None  # memory-mapped raw pairs, re-segmented each epoch (BPE-dropout)
    output_vocab: dict[bool, torch.Tensor]  # restrict_output: the scored target ids, with / without reversed pairs


def main_rank_first(rt: Runtime, what: str, fn):
    """fn() on rank 0 while the other ranks wait (they get None); its failure is every rank's, said clearly."""
    if rt.world == 1:
        return fn()
    status = [None]  # rank 0's error, if any
    if rt.is_main:
        try:
            return fn()
        except BaseException as e:
            status[0] = f"{type(e).__name__}: {e}"
            raise
        finally:
            dist.broadcast_object_list(status, src=0, group=rt.host_group)
    try:  # waits up to PREPARE_TIMEOUT_ENV's seconds (the host group's timeout), not the collective timeout
        dist.broadcast_object_list(status, src=0, group=rt.host_group)
    except RuntimeError as e:
        raise TrainingError(f"rank {rt.rank}: rank 0 died or timed out while {what} ({first_line(e)})") from None
    if status[0] is not None:
        raise TrainingError(f"rank {rt.rank}: rank 0 failed while {what}: {status[0]}")
    return None


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def prepare_files(cfg: Config, run_dir: Path, cache: Path, max_len: int) -> tuple:
    """Rank 0's part: config.yaml, the tokenizer, the binarized train and valid sets (cached on disk)."""
    cfg, tokenizer = prepare_run_dir(cfg, run_dir)
    return cfg, tokenizer, binarize(cfg.data, "train", tokenizer, cache, max_len), valid_set(cfg, tokenizer, cache)


def prepare_data(cfg: Config, run_dir: Path, rt: Runtime) -> tuple[Config, TrainData]:
    """Tokenizer and binarized train and valid sets, made by rank 0 once while the others wait; then read by all."""
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "bin"
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    what = "training the tokenizer and binarizing the data"
    prepared = main_rank_first(rt, what, lambda: prepare_files(cfg, run_dir, cache, max_len))
    if prepared is None:  # another rank: it opens what rank 0 wrote
        saved = dataclasses.replace(load_config(run_dir / ckpt.CONFIG), train=cfg.train)  # train.init_from too
        cfg, tokenizer = saved, Tokenizer.load(run_dir / ckpt.TOKENIZER)
        corpus = binarize(cfg.data, "train", tokenizer, cache, max_len)
        prepared = cfg, tokenizer, corpus, valid_set(cfg, tokenizer, cache)
    cfg, tokenizer, corpus, valid = prepared
    if len(corpus) == 0:
        raise TrainingError("no training pairs left after filtering")
    output_vocab = {}
    if cfg.model.restrict_output:
        unk, eos = tokenizer.unk_id, cfg.model.eos_id
        output_vocab[False] = torch.from_numpy(output_ids(corpus, unk, eos))
        if cfg.train.bidirectional_epochs:  # a reversed epoch's targets are both sides' sentences
            output_vocab[True] = torch.from_numpy(output_ids(both_directions(corpus), unk, eos))
    return cfg, TrainData(
        tokenizer=tokenizer,
        corpus=corpus,
        valid=valid,
        max_len=max_len,
        texts=corpus_texts(corpus, tokenizer) if cfg.data.bpe_dropout else None,
        output_vocab=output_vocab,
    )


def seed_everything(seed: int) -> None:
    """Seed every RNG a run touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build(cfg: Config, rt: Runtime) -> tuple[Transformer, torch.optim.Optimizer, torch.amp.GradScaler | None]:
    """The model, initialized from train.seed, its AdamW, and fp16's loss scaler."""
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


# ---------------------------------------------------------------------------------------------------------
# The phases of the loop: an epoch's batches, one step, evaluation.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    """One epoch's corpus (re-segmented, reversed pairs added), this rank's batches, their padding fraction."""

    corpus: Corpus
    batches: list
    tokens: list[int]  # at each position, the target tokens of all ranks' batches there: the loss's denominator
    padding: float


def epoch_batches(data: TrainData, epoch: int, cfg: Config, rt: Runtime) -> Epoch:
    """Epoch `epoch`'s batches; a function of (seed, epoch) alone, so that a resumed run draws the same ones."""
    tc, c = cfg.train, data.corpus
    if data.texts is not None:  # a fresh BPE-dropout segmentation, seeded by (seed, epoch)
        c = resegment(c, data.texts, data.tokenizer, cfg.data.bpe_dropout, tc.seed * 100_003 + epoch, data.max_len)
    if isinstance(cfg.data.train, tuple):  # several corpora: this epoch's draw of each one's share
        c = Subset(c, mixture(data.corpus.sizes, [s.weight for s in cfg.data.train], tc.seed, epoch))
    if epoch < tc.bidirectional_epochs:
        c = both_directions(c)
    every = make_batches(c.src_lens, c.tgt_lens, tc.max_tokens, tc.seed, epoch, packed=tc.packed)
    shards = [shard(every, r, rt.world) for r in range(rt.world)]
    if not shards[rt.rank]:
        raise TrainingError(f"{len(every)} batches an epoch for {rt.world} processes; lower train.max_tokens")
    tgt_lens = c.tgt_lens
    tokens = [sum(int(tgt_lens[b].sum()) + len(b) for b in at) for at in zip(*shards, strict=True)]  # + EOS each
    batches = shards[rt.rank]
    return Epoch(c, batches, tokens, padding_fraction(batches, c.src_lens, c.tgt_lens))


def set_output_vocab(model: Transformer, data: TrainData, epoch: int, tc: TrainConfig) -> None:
    """restrict_output: the target ids epoch `epoch` scores (more of them while pairs are also reversed)."""
    if data.output_vocab:  # set at every epoch start, not only at the switch, so that a resumed run scores them
        model.set_output_vocab(data.output_vocab[epoch < tc.bidirectional_epochs])


PAD_MULTIPLE = 8  # on CUDA, batch widths a multiple of 8: tensor-core matmul shapes


def pad_width(b: Batch, multiple: int, pad_id: int) -> Batch:
    """The batch with its source and target widths padded (with pad_id) to a multiple of `multiple`."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, (0, -t.size(1) % multiple), value=pad_id)

    return dataclasses.replace(b, src=pad(b.src), tgt_in=pad(b.tgt_in), tgt_out=pad(b.tgt_out))


def pinned(b: Batch) -> Batch:
    """The batch in page-locked memory, which the GPU copies from without the host waiting."""
    return b.map(torch.Tensor.pin_memory)


def to_device(b: Batch, rt: Runtime) -> Batch:
    """The batch on the device: from pinned memory without waiting for the copy, on CUDA."""
    if rt.device.type == "cpu":
        return b
    return b.map(functools.partial(torch.Tensor.to, device=rt.device, non_blocking=True))


PACK_ROW_TOKENS_CPU = 128  # a CPU's packed row: its block-diagonal mask costs the whole row's attention


def collate_for_step(corpus: Corpus, indices, cfg: Config, rt: Runtime) -> Batch:
    """One step's batch as the device takes it: padded (to PAD_MULTIPLE on CUDA), or packed rows (train.packed);
    under train.compile, widths (and padded batches' rows) in `bucket` sizes, so that the compiled step meets a
    bounded number of shapes."""
    ids, cuda, compiled = cfg.model.special_ids, rt.device.type == "cuda", cfg.train.compile
    if cfg.train.packed:
        # One row where the varlen kernel runs (its cost: each sentence's own); elsewhere a dense mask costs the row's.
        varlen = (
            cuda
            and rt.precision in ("bf16", "fp16")
            and not cfg.model.attention_dropout
            and varlen_kernel() is not None
        )
        row_tokens = cfg.train.pack_row_tokens or (cfg.train.max_tokens + 1 if varlen else PACK_ROW_TOKENS_CPU)
        b = pack(corpus, indices, ids, row_tokens, PAD_MULTIPLE if cuda else 1, bucket if compiled else None)
    else:
        b = collate(corpus, indices, ids)
        if compiled:
            b = bucketed(b, ids.pad)
        elif cuda:
            b = pad_width(b, PAD_MULTIPLE, ids.pad)
    return pinned(b) if cuda else b


def bucketed(b: Batch, pad_id: int) -> Batch:
    """A padded batch grown to `bucket` widths (from 8) and rows (from 1; rows of padding, which the loss skips)."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        rows, width = bucket(t.size(0), minimum=1) - t.size(0), bucket(t.size(1)) - t.size(1)
        return F.pad(t, (0, width, 0, rows), value=pad_id)

    return dataclasses.replace(b, src=pad(b.src), tgt_in=pad(b.tgt_in), tgt_out=pad(b.tgt_out))


class BatchStream:
    """This rank's batches from (epoch, position) on, collated by a background thread a few batches ahead.

    The order is the plan's, a function of (seed, epoch) alone, so a resumed run takes the same batches. On CUDA
    they come padded to PAD_MULTIPLE (or packed, train.packed) and in pinned memory, so that their copy to the GPU
    overlaps the step.
    """

    AHEAD = 4

    def __init__(self, data: TrainData, epoch: int, pos: int, cfg: Config, rt: Runtime):
        self.queue: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        self.head = None  # an item peek() took from the queue and get() has not
        self.closed = threading.Event()
        args = (data, epoch, pos, cfg, rt)
        # Started by the first peek: a finished run that is started again draws no epoch to throw it away.
        self.thread = threading.Thread(target=self.fill, args=args, name="nanomt-collate", daemon=True)

    def fill(self, data: TrainData, epoch: int, pos: int, cfg: Config, rt: Runtime) -> None:
        try:
            while True:
                ep = epoch_batches(data, epoch, cfg, rt)
                if rt.is_main:
                    log.debug("epoch %d: padding fraction %.3f", epoch, ep.padding)
                for i in range(pos, len(ep.batches)):
                    b = collate_for_step(ep.corpus, ep.batches[i], cfg, rt)
                    if not self.put((epoch, i, ep, b)):
                        return
                epoch, pos = epoch + 1, 0
        except BaseException as e:  # the consumer raises it
            self.put(e)

    def put(self, item) -> bool:
        while not self.closed.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def peek(self) -> tuple[int, int, Epoch, Batch]:
        """The next (epoch, position, its Epoch, batch), left for get() to take."""
        if self.head is None:
            if self.thread.ident is None:  # not started yet
                self.thread.start()
            self.head = self.queue.get()
        if isinstance(self.head, BaseException):
            raise self.head
        return self.head

    def get(self) -> tuple[int, int, Epoch, Batch]:
        """The next (epoch, position, its Epoch, batch)."""
        item, self.head = self.peek(), None
        return item

    def close(self) -> None:
        self.closed.set()
        if self.thread.ident is not None:  # started
            self.thread.join()


@dataclass(frozen=True)
class Group:
    """The batches of one optimizer step on this rank, and the target tokens of the step on all ranks."""

    batches: list[Batch]
    tokens: int


def next_group(
    stream: BatchStream, state: TrainState, model: Transformer, data: TrainData, cfg: Config, rt: Runtime
) -> tuple[Group, Epoch]:
    """The next accum_steps batches on the device; the state's position moves past them, to a new epoch if one ends."""
    batches, tokens = [], 0
    for _ in range(cfg.train.accum_steps):
        if batches and finished(state, stream, cfg.train):  # the data ends within the group: a shorter last one
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


class Window:
    """The steps since the last log row; their losses and gradient norms stay on the device until read."""

    def __init__(self, step: int):
        self.mark = time.perf_counter()  # the run's clock: state.elapsed counts the time up to here
        self.reset(step)

    def reset(self, step: int) -> None:
        self.first_step, self.losses, self.norms, self.tokens = step + 1, [], [], 0
        self.start, self.paused = time.perf_counter(), 0.0

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int) -> None:
        self.losses.append(loss)
        self.norms.append(grad_norm)
        self.tokens += tokens

    @contextlib.contextmanager
    def pause(self):
        """Time in the block (evaluation, checkpoints) is not training time for tokens/s."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.paused += time.perf_counter() - t0

    def tick(self, state: TrainState, rt: Runtime) -> None:
        """One process: the clock moves every step (it needs no exchange), so max_minutes and the lr follow it."""
        if rt.world == 1:
            now = time.perf_counter()
            state.elapsed, self.mark = state.elapsed + now - self.mark, now

    def read(self, state: TrainState, stop: bool, rt: Runtime) -> tuple[list[float], list[float], bool]:
        """The losses (mean over the ranks) and gradient norms of the steps so far, and whether a rank stops.

        The loop's one wait for the device, and under DDP its one exchange of host values: state.elapsed
        becomes rank 0's clock, so that every rank computes the same lr and stops at the same step.
        """
        now = time.perf_counter()
        clock = state.elapsed + now - self.mark if rt.is_main else 0.0
        self.mark = now
        values = torch.stack([*self.losses, *self.norms]).double()
        values = torch.cat([values, torch.tensor([clock, float(stop)], dtype=torch.float64).to(rt.device)])
        if rt.world > 1:
            dist.all_reduce(values)  # sums: the other ranks' clocks are 0
        *values, state.elapsed, stops = values.tolist()
        n = len(self.losses)
        return [v / rt.world for v in values[:n]], [v / rt.world for v in values[n:]], stops > 0


def check_finite(losses: list[float], first_step: int, run_dir: Path) -> None:
    """A non-finite loss stops training, naming the last checkpoint written before it (all checked ones)."""
    bad = [(i, x) for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        good = ckpt.step_dirs(run_dir)
        raise TrainingError(
            f"loss is {bad[0][1]} at step {first_step + bad[0][0]}; stopping. The last good checkpoint is "
            f"{good[-1][1] if good else 'none'}; try a lower train.lr or train.precision=fp32"
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


def lost_ranks_fail_clearly(fn):
    """Under DDP, a collective that fails or times out (another rank died or hangs) is a TrainingError saying so."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:  # torch.distributed's errors (DistError and the backends') are RuntimeErrors
            if not (dist.is_initialized() and dist.get_world_size() > 1) or isinstance(e, TrainingError):
                raise
            if not (isinstance(e, dist.DistError) or any(w in str(e) for w in ("Gloo", "gloo", "NCCL", "nccl"))):
                raise
            timeout = runtime.env_seconds(runtime.COLLECTIVE_TIMEOUT_ENV, runtime.COLLECTIVE_TIMEOUT_S)
            raise TrainingError(
                f"rank {dist.get_rank()}: lost the other ranks: a collective failed, or waited longer than "
                f"{runtime.COLLECTIVE_TIMEOUT_ENV}={timeout:g} seconds; another rank died or hangs (its log says "
                f"why). {first_line(e)}"
            ) from e

    return wrapper


@lost_ranks_fail_clearly
def train(cfg: Config, run_dir: str | Path) -> Path:
    """Train (or resume) a run in `run_dir`; returns the run directory."""
    run_dir, tc = Path(run_dir), cfg.train
    rt = runtime.setup(tc.device, tc.precision, tc.num_threads)
    cfg, data = prepare_data(cfg, run_dir, rt)
    model, optimizer, scaler = build(cfg, rt)
    if tc.init_from and not ckpt.step_dirs(run_dir):  # a new run starts from the checkpoint's weights
        ckpt.load_weights(model, ckpt.checkpoint_weights(tc.init_from))
        if rt.is_main:
            log.info("starting from the weights of %s", tc.init_from)
    state, resumed_from = TrainState.resume_or_new(run_dir, model, optimizer, scaler, rt.rank)
    ddp_model = step_model(model, rt, tc.compile)
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

    def save() -> None:  # every rank: rank 0 writes, with every rank's RNG states
        state.save(run_dir, model, optimizer, scaler, tc.keep_last, rt.host_group)

    def evaluate_and_log() -> None:  # every rank evaluates its share; rank 0 logs
        row = evaluate(model, data, cfg, rt)
        if row is None:
            return
        row = {"step": state.step, "epoch": state.epoch, **row}
        metrics.write({**row, "elapsed_s": round(state.elapsed, 2)})
        keep_best(model, row, state, run_dir)
        bleu_text = f", valid BLEU {row['valid_bleu']:.2f}" if "valid_bleu" in row else ""
        log.info("step %d: valid loss %.3f%s", state.step, row["valid_loss"], bleu_text)

    start_step = state.step
    set_output_vocab(model, data, state.epoch, tc)
    # After the set-up (tokenizer, binarizing), whose freed memory the heap would otherwise keep for the whole run.
    if rt.device.type == "cpu" and runtime.keep_freed_memory():
        log.debug("malloc: no mmap for large blocks, no heap trimming, for the rest of this process")
    show_bar = rt.is_main and tc.progress and sys.stderr.isatty()
    bar = tqdm(total=tc.max_steps, initial=state.step, disable=not show_bar, dynamic_ncols=True, unit="step")
    stream = BatchStream(data, state.epoch, state.batch_pos, cfg, rt)
    window = Window(state.step)
    model.train()
    with sigint_requests_stop(True) as stop, contextlib.closing(bar), contextlib.closing(stream):
        while not done(state, stream, tc):
            group, ep = next_group(stream, state, model, data, cfg, rt)
            loss = backward(model, ddp_model, group, scaler, cfg, rt)
            lr = lr_at(state.step + 1, tc, cfg.model.d_model, state.elapsed)
            window.add(loss, update(model, optimizer, scaler, lr, tc.clip_norm), group.tokens)
            state.step += 1
            bar.update(1)
            logging_due = state.step % tc.log_every == 0 or finished(state, stream, tc)
            eval_due = data.valid is not None and state.step % tc.eval_every == 0
            save_due = state.step % tc.save_every == 0
            if not (logging_due or eval_due or save_due or (rt.world == 1 and stop.is_set())):
                window.tick(state, rt)
                continue  # no wait for the device: the next step is queued behind this one
            losses, norms, stopping = window.read(state, stop.is_set(), rt)
            check_finite(losses, window.first_step, run_dir)  # before any checkpoint of these steps
            if logging_due:
                seconds = time.perf_counter() - window.start - window.paused
                row = {
                    "step": state.step,
                    "epoch": state.epoch,
                    "loss": sum(losses) / len(losses),
                    "lr": lr,
                    "tokens_per_s": window.tokens / max(seconds, 1e-9),
                    "grad_norm": norms[-1],
                    "padding": ep.padding,
                    "elapsed_s": round(state.elapsed, 2),
                }
                metrics.write(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{row['tokens_per_s']:.0f}")
                if not show_bar and rt.is_main:
                    tok_s = row["tokens_per_s"]
                    log.info("step %d: loss %.3f, lr %.2e, %.0f tokens/s", state.step, row["loss"], lr, tok_s)
                window.reset(state.step)
            with window.pause():
                if eval_due:
                    evaluate_and_log()
                if save_due or stopping:
                    save()
            if stopping:
                log.warning("interrupted at step %d; checkpoint saved. Run the same command to resume.", state.step)
                raise KeyboardInterrupt
            window.tick(state, rt)
    # A finished run that is started again resumes, finds nothing to do and returns: no second final eval.
    has_weights = rank0_value((run_dir / ckpt.WEIGHTS).is_file(), rt)
    if state.step > start_step or not has_weights:
        if data.valid is None:  # nothing to choose by: the last weights
            if rt.is_main:
                ckpt.save_weights(model, run_dir / ckpt.WEIGHTS)
        elif state.step % tc.eval_every != 0 or not has_weights:
            evaluate_and_log()
        if state.step % tc.save_every != 0:
            save()
        if tc.calibrate and rt.is_main and data.valid is not None:
            calibrate_run(cfg, run_dir, rt)
    if rt.world > 1:
        dist.barrier()
    return run_dir


def calibrate_run(cfg: Config, run_dir: Path, rt: Runtime) -> None:
    """Fit the confidence on the whole validation set with the run's best weights (train.calibrate), where the set
    has enough sentences; never touching the weights."""
    pairs = [(s, t) for s, t in split_pairs(cfg.data, "valid") if s.strip() and t.strip()]
    if len(pairs) < calib.MIN_SENTENCES:
        log.info("confidence not calibrated: %d validation pairs, %d needed", len(pairs), calib.MIN_SENTENCES)
        return
    translator = Translator.from_checkpoint(run_dir, rt.device, calibrated=False)
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    fitted = calibrate(translator, srcs, refs, ckpt.checkpoint_weights(run_dir), data="validation set")
    log.info(
        "confidence calibrated on %d validation sentences: Pearson %.3f with sentence chrF (the raw score's %.3f)",
        fitted.fit["sentences"],
        fitted.fit["pearson"],
        fitted.fit["raw_score"]["pearson"],
    )


def rank0_value(value, rt: Runtime):
    """Rank 0's value of a (picklable) value, on every rank."""
    if rt.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=rt.host_group)
    return box[0]


def finished(state: TrainState, stream: BatchStream, tc: TrainConfig) -> bool:
    """Whether the step budget is spent, or the epoch budget: the next batch would be from epoch max_epochs."""
    return state.step >= tc.max_steps or (tc.max_epochs is not None and stream.peek()[0] >= tc.max_epochs)


def done(state: TrainState, stream: BatchStream, tc: TrainConfig) -> bool:
    """Whether a stopping criterion (steps, epochs, wall-clock minutes) is met."""
    # The clock (state.elapsed) moves every step in one process; under DDP at log intervals, evaluations and
    # checkpoints, where the ranks take rank 0's, so that all stop at the same step.
    return finished(state, stream, tc) or (tc.max_minutes is not None and state.elapsed >= tc.max_minutes * 60)


def train_from_file(config_path: str | Path, run_dir: str | Path | None, overrides: list[str]) -> Path:
    """The `nanomt train` entry: load YAML + overrides and train in run_dir (default runs/<config name>)."""
    cfg = load_config(config_path, overrides)
    run_dir = Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem
    return train(cfg, run_dir)
