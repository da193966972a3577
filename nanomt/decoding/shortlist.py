"""A vocabulary shortlist (CTranslate2's vocabulary map, Marian's lexical shortlist): per batch, decode over only the
target pieces its source pieces are seen translated into, plus the most frequent ones, instead of the whole output.

The table is learned from a parallel corpus without alignments: for each source piece, the target pieces that most
often share a sentence pair with it, ranked by the Dice coefficient 2 c(s, t) / (c(s) + c(t)) (which, unlike the
raw count, does not rank "the" first for every word). It is written as shortlist.json beside the weights, with the
tokenizer's fingerprint: a table for another tokenizer is refused. Decoding with it is opt-in (Decoding.shortlist);
without it every output is exactly what it was.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nanomt.core.model import Transformer

SHORTLIST = "shortlist.json"
TOP = 20  # target pieces kept for each source piece
FREQUENT = 100  # the most frequent target pieces, always kept


class ShortlistError(ValueError):
    """A shortlist file that cannot be read, or that belongs to another tokenizer."""


@dataclass(frozen=True)
class Shortlist:
    """Per source id, the target ids it allows; and the target ids every batch allows."""

    table: dict[int, tuple[int, ...]]
    frequent: tuple[int, ...]
    tokenizer: str  # the fingerprint of the tokenizer whose ids these are

    def allowed(self, src_ids: list[list[int]], extra: list[int] = ()) -> list[int]:
        """The sorted target ids a batch of sources may be translated into (and `extra`: specials, forced ids)."""
        out = set(self.frequent) | set(extra)
        for ids in src_ids:
            for s in set(ids):
                out.update(self.table.get(s, ()))
        return sorted(out)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / SHORTLIST
        body = {"tokenizer": self.tokenizer, "frequent": list(self.frequent),
                "table": {str(s): list(t) for s, t in sorted(self.table.items())}}  # fmt: skip
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(body) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, directory: str | Path, tokenizer: str) -> Shortlist:
        path = Path(directory) / SHORTLIST
        if not path.is_file():
            raise ShortlistError(f"{path} not found: build it with nanomt shortlist (or train with train.shortlist)")
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            table = {int(s): tuple(map(int, t)) for s, t in body["table"].items()}
            found = cls(table, tuple(map(int, body["frequent"])), str(body["tokenizer"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ShortlistError(f"{path}: cannot read the shortlist: {str(e).splitlines()[0]}") from None
        if found.tokenizer != tokenizer:
            raise ShortlistError(f"{path} was built for tokenizer {found.tokenizer[:12]}, not {tokenizer[:12]}")
        return found


def build(src: list[list[int]], tgt: list[list[int]], tgt_vocab: int, tokenizer: str, top: int = TOP,
          frequent: int = FREQUENT) -> Shortlist:  # fmt: skip
    """The table of a parallel corpus given as ids (one list a sentence a side)."""
    if len(src) != len(tgt) or not src:
        raise ValueError(f"a shortlist needs sentence pairs: {len(src)} sources, {len(tgt)} targets")
    if top < 1 or frequent < 0:  # top 0 would leave a source piece no translation but the frequent ones
        raise ValueError(f"--top must be >= 1 and --frequent >= 0, got {top} and {frequent}")
    s_sets = [np.unique(np.asarray(s, dtype=np.int64)) for s in src]
    t_sets = [np.unique(np.asarray(t, dtype=np.int64)) for t in tgt]
    s_count = np.bincount(np.concatenate(s_sets))  # sentences each source id occurs in
    t_count = np.bincount(np.concatenate(t_sets), minlength=tgt_vocab)
    pairs, counts = _cooccurrences(s_sets, t_sets, tgt_vocab)
    s_of, t_of = pairs // tgt_vocab, pairs % tgt_vocab
    dice = 2 * counts / (s_count[s_of] + t_count[t_of])
    order = np.lexsort((-dice, s_of))  # by source id, then best first
    s_sorted, t_sorted = s_of[order], t_of[order]
    ids, starts, sizes = np.unique(s_sorted, return_index=True, return_counts=True)
    table = {int(s): tuple(int(t) for t in t_sorted[a : a + min(n, top)]) for s, a, n in zip(ids, starts, sizes)}
    common = tuple(int(t) for t in np.argsort(-t_count, kind="stable")[:frequent] if t_count[t] > 0)
    return Shortlist(table, common, tokenizer)


def _cooccurrences(s_sets: list, t_sets: list, tgt_vocab: int, chunk: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Every (s, t) sharing a sentence pair as a key s * V + t, and in how many pairs: counted a chunk of pairs at a
    time (np.unique, no Python loop per pair of ids), the chunks' counts then added up."""
    keys, counts = [], []
    for a in range(0, len(s_sets), chunk):
        part = [
            (s[:, None] * tgt_vocab + t[None, :]).ravel() for s, t in zip(s_sets[a : a + chunk], t_sets[a : a + chunk])
        ]
        k, c = np.unique(np.concatenate(part), return_counts=True)
        keys.append(k)
        counts.append(c)
    k, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return k, np.bincount(inverse, weights=np.concatenate(counts)).astype(np.int64)


@torch.no_grad()
def restrict(model: Transformer, ids: list[int]) -> Transformer:
    """A view of `model` that scores only `ids` (its other parameters shared, not copied): decoding over it picks
    among them as over a pruned model (nanomt.decoding.steps.search_space)."""
    v = model.cfg.tgt_vocab_size
    keep = torch.tensor(ids, dtype=torch.long, device=next(model.parameters()).device)
    if model.output_mask is not None and getattr(model, "pruned", False):
        keep = keep[model.output_mask[keep]]  # a restricted model never scores the ids it left out
        rows = model.output_index[keep]  # their rows in the pruned projection
    else:
        rows = keep
    view = copy.copy(model)
    view.__dict__.pop("output_mask", None)  # an unrestricted model's is a plain None, which would hide the buffer
    view._modules = dict(model._modules)
    view._buffers = dict(model._buffers)
    view.output = _rows(model.output, rows)
    mask = torch.zeros(v, dtype=torch.bool, device=keep.device)
    mask[keep] = True
    index = torch.zeros(v, dtype=torch.long, device=keep.device)
    index[keep] = torch.arange(len(keep), device=keep.device)
    view._buffers.update(output_mask=mask, output_ids=keep, output_index=index)
    return view


def _rows(linear: nn.Module, rows: torch.Tensor) -> nn.Module:
    """A linear layer of the given output rows of `linear` (float or int8)."""
    from nanomt.decoding.quantize import Int8Linear

    if isinstance(linear, Int8Linear):
        bias = None if linear.bias is None else linear.bias[rows]
        return Int8Linear(linear.weight_int8[rows].contiguous(), linear.weight_scale[rows].contiguous(), bias)
    out = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None)
    out.weight = nn.Parameter(linear.weight[rows].contiguous(), requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias[rows].contiguous(), requires_grad=False)
    return out
