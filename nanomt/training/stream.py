"""Batch transport, from the binarized corpus to the device: an epoch's batches (the plan), the shapes a step's
batch takes (widths padded to PAD_MULTIPLE, bucketed for a compiled step, packed rows), page-locked memory and the
copy to the device, and a background thread that makes them a few ahead of the step."""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanomt.core.batches import bucket, make_batches
from nanomt.core.config import Config, DataConfig
from nanomt.core.model import varlen_kernel
from nanomt.core.runtime import Runtime
from nanomt.training.data import Batch, Corpus, Subset, both_directions, mixture, padding_fraction, resegment, shard
from nanomt.training.errors import TrainingError
from nanomt.training.prepare import TrainData


@dataclass(frozen=True)
class Epoch:
    """One epoch's corpus (re-segmented, reversed pairs added), this rank's batches, their padding fraction."""

    corpus: Corpus
    batches: list
    tokens: list[int]  # at each position, the target tokens of all ranks' batches there: the loss's denominator
    padding: float


def corpus_weights(data: DataConfig, sizes: list[int]) -> list[float]:
    """Each corpus' weight, times its pairs^(1/T) with temperature sampling (data.temperature)."""
    weights = [c.weight for c in data.train]
    if data.temperature is None:
        return weights
    return [w * n ** (1 / data.temperature) for w, n in zip(weights, sizes)]


def epoch_batches(data: TrainData, epoch: int, cfg: Config, rt: Runtime) -> Epoch:
    """Epoch `epoch`'s batches; a function of (seed, epoch) alone, so that a resumed run draws the same ones."""
    tc, c = cfg.train, data.corpus
    if data.texts is not None:  # a fresh BPE-dropout segmentation, seeded by (seed, epoch)
        c = resegment(c, data.texts, data.tokenizer, cfg.data.bpe_dropout, tc.seed * 100_003 + epoch, data.max_len)
    if isinstance(cfg.data.train, tuple):  # several corpora: this epoch's draw of each one's share
        c = Subset(c, mixture(data.corpus.sizes, corpus_weights(cfg.data, data.corpus.sizes), tc.seed, epoch))
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


@dataclass(frozen=True)
class Group:
    """The batches of one optimizer step on this rank, and the target tokens of the step on all ranks."""

    batches: list[Batch]
    tokens: int


PAD_MULTIPLE = 8  # on CUDA, batch widths a multiple of 8: tensor-core matmul shapes


def pad_width(b: Batch, multiple: int, pad_id: int) -> Batch:
    """The batch with its source and target widths padded (with pad_id) to a multiple of `multiple`."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, (0, -t.size(1) % multiple), value=pad_id)

    return dataclasses.replace(b, src=pad(b.src), tgt_in=pad(b.tgt_in), tgt_out=pad(b.tgt_out))


def bucketed(b: Batch, pad_id: int) -> Batch:
    """A padded batch grown to `bucket` widths (from 8) and rows (from 1; rows of padding, which the loss skips)."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        rows, width = bucket(t.size(0), minimum=1) - t.size(0), bucket(t.size(1)) - t.size(1)
        return F.pad(t, (0, width, 0, rows), value=pad_id)

    return dataclasses.replace(b, src=pad(b.src), tgt_in=pad(b.tgt_in), tgt_out=pad(b.tgt_out))


PACK_ROW_TOKENS_CPU = 128  # a CPU's packed row: its block-diagonal mask costs the whole row's attention


def pack_row_tokens(cfg: Config, rt: Runtime) -> int:
    """train.packed's row length: train.pack_row_tokens, else one row a batch where the varlen kernel runs (its
    cost: each sentence's own), else PACK_ROW_TOKENS_CPU (a dense mask costs the row's)."""
    varlen = (
        rt.device.type == "cuda"
        and rt.precision in ("bf16", "fp16")
        and not cfg.model.attention_dropout
        and varlen_kernel() is not None
    )
    return cfg.train.pack_row_tokens or (cfg.train.max_tokens + 1 if varlen else PACK_ROW_TOKENS_CPU)


def pinned(b: Batch) -> Batch:
    """The batch in page-locked memory, which the GPU copies from without the host waiting."""
    return b.map(torch.Tensor.pin_memory)


def to_device(b: Batch, rt: Runtime) -> Batch:
    """The batch on the device: from pinned memory without waiting for the copy, on CUDA."""
    if rt.device.type == "cpu":
        return b
    return b.map(functools.partial(torch.Tensor.to, device=rt.device, non_blocking=True))


class Prefetcher:
    """The items of an iterator, made by a background thread a few items ahead of the consumer.

    The thread starts at the first peek, so that an iterator nobody reads makes nothing; an exception raised in it
    is raised to the consumer, at the item it replaced.
    """

    AHEAD = 4

    def __init__(self, items: Iterator, name: str):
        self.queue: queue.Queue = queue.Queue(maxsize=self.AHEAD)
        self.head = None  # an item peek() took from the queue and get() has not
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.fill, args=(items,), name=name, daemon=True)

    def fill(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self.put(item):
                    return
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

    def peek(self):
        """The next item, left for get() to take."""
        if self.head is None:
            if self.thread.ident is None:  # not started yet
                self.thread.start()
            self.head = self.queue.get()
        if isinstance(self.head, BaseException):
            raise self.head
        return self.head

    def get(self):
        """The next item."""
        item, self.head = self.peek(), None
        return item

    def close(self) -> None:
        self.closed.set()
        if self.thread.ident is not None:  # started
            self.thread.join()
