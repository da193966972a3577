"""The models the search tests decode with: a tiny random Transformer (the `model` fixture, and sources for it),
and a stand-in whose next-token distribution is a table indexed by the generated prefix (TableModel, with every
hypothesis its table can write, for exhaustive search)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from conftest import random_src, random_transformer

from nanomt.core.config import ModelConfig
from nanomt.core.model import DecoderOutput, Encoded, Transformer, padding_mask

PAD, UNK, BOS, EOS, A, B, C = range(7)
V = 24


# ---------------------------------------------------------------------------------------------------------
# A tiny random Transformer.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_transformer(2, V)


make_src = functools.partial(random_src, vocab=V)


LENGTHS = [7, 3, 5, 1, 6, 8, 2, 4]


# ---------------------------------------------------------------------------------------------------------
# A stand-in model whose next-token distribution is a table indexed by the generated prefix.
# ---------------------------------------------------------------------------------------------------------


Table = dict[tuple[int, ...], dict[int, float]]


@dataclass(frozen=True)
class PrefixCache:
    """The stub's decoder cache: every token fed so far, BOS first."""

    prefixes: torch.Tensor  # (R, t)

    @property
    def length(self) -> int:
        return self.prefixes.size(1)

    def index_select(self, index: torch.Tensor, cross: bool = True) -> PrefixCache:
        return PrefixCache(self.prefixes.index_select(0, index))


class TableModel:
    """Transformer's encode/init_cache/decode interface over a probability table; records rows per step."""

    def __init__(self, table: Table, default: dict[int, float] | None = None, max_positions: int = 64):
        self.cfg = ModelConfig(src_vocab_size=7, tgt_vocab_size=7, d_model=2, n_heads=1, max_positions=max_positions)
        self.table = table
        self.default = default if default is not None else {EOS: 1.0}
        self.rows_per_step: list[int] = []

    def encode(self, src: torch.Tensor) -> Encoded:
        return Encoded(src[..., None].float(), padding_mask(src, PAD))

    def init_cache(self, enc: Encoded, capacity: int = 0) -> PrefixCache:
        return PrefixCache(torch.zeros(enc.memory.size(0), 0, dtype=torch.long))

    def decode(self, tgt: torch.Tensor, enc: Encoded, cache: PrefixCache) -> DecoderOutput:
        assert tgt.shape == (enc.memory.size(0), 1) == (cache.prefixes.size(0), 1)
        prefixes = torch.cat([cache.prefixes, tgt], dim=1)  # (R, t+1)
        self.rows_per_step.append(tgt.size(0))
        logits = torch.full((tgt.size(0), 1, 7), -math.inf)
        for r, prefix in enumerate(prefixes.tolist()):
            assert prefix[0] == BOS and EOS not in prefix
            for token, p in self.table.get(tuple(prefix[1:]), self.default).items():
                if p > 0:
                    logits[r, 0, token] = math.log(p)
        return DecoderOutput(logits, PrefixCache(prefixes))


def table_src(lengths: list[int]) -> torch.Tensor:
    """Sources for the stub (it ignores them, except for their lengths)."""
    src = torch.full((len(lengths), max(lengths) + 1), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = A
        src[i, n] = EOS
    return src


def penalized(log_prob: float, length: int, kind: str, alpha: float) -> float:
    if kind == "gnmt":
        return log_prob / ((5 + length) / 6) ** alpha
    if kind == "average":
        return log_prob / length**alpha
    return log_prob


def all_hypotheses(model: TableModel, max_len: int) -> list[tuple[list[int], float, int]]:
    """Every sequence the table can produce within max_len: (tokens, log_prob, length incl. EOS)."""
    out = []

    def extend(prefix: tuple[int, ...], log_prob: float) -> None:
        for token, p in model.table.get(prefix, model.default).items():
            lp = log_prob + math.log(p)
            if token == EOS:
                out.append((list(prefix), lp, len(prefix) + 1))
            elif len(prefix) + 1 == max_len:
                out.append(([*prefix, token], lp, max_len))
            else:
                extend((*prefix, token), lp)

    extend((), 0.0)
    return out


def random_table(seed: int, max_len: int) -> Table:
    g = torch.Generator().manual_seed(seed)
    table = {}
    for n in range(max_len):
        for prefix in itertools.product((A, B, C), repeat=n):
            probs = (torch.randn(4, generator=g) * 1.5).softmax(0).tolist()
            table[prefix] = dict(zip((EOS, A, B, C), probs, strict=True))
    return table


# k=2. Step 1 finishes [] (0.5); step 2 finishes [B] (0.18) while A C (0.27) is live; step 3 finishes A C.
STOP_TABLE = {(): {EOS: 0.5, A: 0.3, B: 0.2}, (A,): {EOS: 0.1, C: 0.9}, (B,): {EOS: 0.9, C: 0.1}}
