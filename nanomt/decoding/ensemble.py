"""Ensemble decoding: models that share a vocabulary, each next token scored by the mean of their probabilities."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from nanomt.core.model import DecoderCache, DecoderOutput, Encoded, Transformer


class Ensemble(nn.Module):
    """Transformer's encode/init_cache/decode over several models; `decode` returns log(mean of probabilities)."""

    # Averaging probabilities (not log-probabilities) is fairseq's and Marian's default: a token any member
    # finds likely stays likely. The decoding functions take an Ensemble wherever they take a Transformer.

    def __init__(self, models: Sequence[Transformer]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0].cfg
        theirs = (first.src_vocab_size, first.tgt_vocab_size, first.pad_id)
        for i, m in enumerate(models[1:], start=2):
            ours = (m.cfg.src_vocab_size, m.cfg.tgt_vocab_size, m.cfg.pad_id)
            if ours != theirs:
                raise ValueError(
                    f"model {i} has vocabularies {ours[0]}/{ours[1]} and pad id {ours[2]}, model 1 has "
                    f"{theirs[0]}/{theirs[1]} and {theirs[2]}: an ensemble's models must share one vocabulary"
                )
        self.members = nn.ModuleList(models)
        # Decoding (steps.budgets) reads pad_id and max_positions here: no member may be asked for a position it lacks.
        self.cfg = dataclasses.replace(first, max_positions=min(m.cfg.max_positions for m in models))
        self._widths = [m.cfg.d_model for m in models]
        # Member i's decoder layers in the joint cache, fixed by the members' depths.
        bounds = list(itertools.accumulate((len(m.decoder) for m in models), initial=0))
        self._layers = [slice(a, b) for a, b in zip(bounds, bounds[1:])]

    def _split(self, enc: Encoded) -> list[Encoded]:
        """Each member's part of the joint encoder output."""
        memories = torch.split(enc.memory, self._widths, dim=-1)  # per member (B, S, D_i)
        return [Encoded(memory, enc.src_mask) for memory in memories]

    def _split_cache(self, cache: DecoderCache) -> list[DecoderCache]:
        """Each member's layers of the joint cache."""
        return [DecoderCache(cache.layers[layers], cache.length, cache.beams) for layers in self._layers]

    def encode(self, src: Tensor, need_weights: bool = False) -> Encoded:
        """src (B, S) -> every member's memory, side by side on the feature axis: (B, S, D_1 + ... + D_M)."""
        if need_weights:
            raise ValueError("attention weights belong to one model: ask one checkpoint of the ensemble for them")
        # One tensor, so that decoding's row selection (index_select on the batch axis) moves every member's rows.
        encs = [m.encode(src) for m in self.members]
        return Encoded(torch.cat([e.memory for e in encs], dim=-1), encs[0].src_mask)  # (B, S, sum D)

    def init_cache(self, enc: Encoded, capacity: int = 0) -> DecoderCache:
        """Every member's decoder layers in one cache (member 1's layers first)."""
        caches = [m.init_cache(e, capacity) for m, e in zip(self.members, self._split(enc))]
        return DecoderCache(tuple(layer for c in caches for layer in c.layers), 0)

    def decode(
        self, tgt: Tensor, enc: Encoded, cache: DecoderCache | None = None, need_weights: bool = False
    ) -> DecoderOutput:
        """tgt (B, T) ids -> log of the members' mean next-token probabilities (B, T, V), float32."""
        if need_weights:
            raise ValueError("attention weights belong to one model: ask one checkpoint of the ensemble for them")
        caches = [None] * len(self.members) if cache is None else self._split_cache(cache)
        log_probs, layers = [], []
        for m, e, c in zip(self.members, self._split(enc), caches):
            out = m.decode(tgt, e, c)
            log_probs.append(out.logits.float().log_softmax(dim=-1))  # (B, T, V)
            if out.cache is not None:
                layers.extend(out.cache.layers)
        mean = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))  # (B, T, V)
        new_cache = None if cache is None else DecoderCache(tuple(layers), cache.length + tgt.size(1), cache.beams)
        return DecoderOutput(mean, new_cache)

    def forward(self, src: Tensor, tgt: Tensor, need_weights: bool = False) -> Tensor:
        """Teacher-forced log of the mean probabilities (B, T, V)."""
        return self.decode(tgt, self.encode(src, need_weights), need_weights=need_weights).logits
