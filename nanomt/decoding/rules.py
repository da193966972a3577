"""Rules on the next token's scores, applied at the one place decoding masks them (steps.next_log_probs), so that a
search mode never masks a score itself and a new rule is a Decoding field, a class here and a line in `rules_for`.

Each rule is one small class: `apply(scores, step)` changes the (R, K) scores of the R live rows in place, and
`select(rows)` gives the rule for rows kept or reordered (a beam's parents, sentences dropped once finished), so
that a rule holding per-row data follows its rows. Scores are over the search space's K positions (all V ids, or
a pruned model's kept ids: `Step.space` maps ids to positions); `Step.history` holds the ids generated so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding


class Space(Protocol):
    """Where decoding picks (steps.SearchSpace): positions of the scores and the ids they stand for."""

    banned: list[int]  # positions never picked: PAD and BOS
    eos: int | None  # EOS's position; None where the model never scores it

    def positions(self, ids: Tensor) -> Tensor: ...  # -1 where an id is not scored


@dataclass
class Step:
    """What a rule may read at a step: its index, each row's generated ids (R, t), the unmasked scores."""

    index: int
    history: Tensor  # (R, t) ids, t = index
    space: Space
    bos_id: int
    raw: Tensor | None = None  # (R, K) the scores before any rule, for the rules that ask (needs_raw)

    def sequences(self) -> Tensor:
        """(R, t + 1) each row's decoder input so far: BOS, then the generated ids (transformers' input_ids)."""
        bos = self.history.new_full((self.history.size(0), 1), self.bos_id)
        return torch.cat([bos, self.history], dim=1)


class Rule:
    """A rule on the scores; stateless rules need not override `select`."""

    needs_raw = False

    def apply(self, scores: Tensor, step: Step) -> None:
        raise NotImplementedError

    def select(self, rows: Tensor) -> Rule:
        return self


@dataclass
class Banned(Rule):
    """Positions never picked: PAD and BOS."""

    positions: list[int]

    def apply(self, scores: Tensor, step: Step) -> None:
        scores[:, self.positions] = -math.inf


@dataclass
class MinLength(Rule):
    """EOS is blocked until `min_len` tokens are generated."""

    min_len: int
    eos: int | None  # EOS's position; None where the model never scores it

    def apply(self, scores: Tensor, step: Step) -> None:
        if step.index < self.min_len and self.eos is not None:
            scores[:, self.eos] = -math.inf


@dataclass
class ForcedPrefix(Rule):
    """Each row's translation starts with its prefix ids (-1 past a row's prefix), scored by the model."""

    prefix: Tensor  # (R, P) ids, -1 padded
    needs_raw = True

    def apply(self, scores: Tensor, step: Step) -> None:
        if step.index >= self.prefix.size(1):
            return
        forced = self.prefix[:, step.index]  # (R,)
        rows = (forced >= 0).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        positions = step.space.positions(forced[rows])  # (F,) -1: the model cannot produce it
        kept = step.raw[rows, positions.clamp(min=0)].masked_fill(positions < 0, -math.inf)  # the model's own score
        scores[rows] = -math.inf
        scores[rows, positions.clamp(min=0)] = kept

    def select(self, rows: Tensor) -> Rule:
        return ForcedPrefix(self.prefix.index_select(0, rows))

    @classmethod
    def table(cls, prefixes: Sequence[Sequence[int]], device: torch.device) -> ForcedPrefix:
        """The rule for one prefix a sentence ([] for none)."""
        width = max(map(len, prefixes))
        table = torch.full((len(prefixes), width), -1, dtype=torch.long, device=device)  # (B, P)
        for row, ids in enumerate(prefixes):
            table[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return cls(table)


@dataclass
class NoRepeatNgram(Rule):
    """No n-gram twice in a row's sequence (BOS included), as transformers' NoRepeatNGramLogitsProcessor."""

    n: int

    def apply(self, scores: Tensor, step: Step) -> None:
        seq = step.sequences()  # (R, L)
        n, length = self.n, seq.size(1)
        if length < n:  # fewer than n - 1 tokens before the next one: no complete n-gram yet
            return
        grams = seq.unfold(1, n, 1)  # (R, G, n): every n-gram so far
        seen = (grams[:, :, :-1] == seq[:, length - n + 1 :].unsqueeze(1)).all(dim=-1)  # (R, G) same n-1 prefix
        rows, at = seen.nonzero().unbind(dim=1)  # (F,) each
        positions = step.space.positions(grams[rows, at, -1])  # the token that completed it then
        hit = positions >= 0
        scores[rows[hit], positions[hit]] = -math.inf


@dataclass
class RepetitionPenalty(Rule):
    """Scores of ids in a row's sequence (BOS included) divided by `penalty` if positive, else multiplied by it,
    as transformers' RepetitionPenaltyLogitsProcessor (CTRL, Keskar et al., 2019)."""

    penalty: float

    def apply(self, scores: Tensor, step: Step) -> None:
        positions = step.space.positions(step.sequences())  # (R, L), -1 where not scored
        rows, at = (positions >= 0).nonzero().unbind(dim=1)
        seen = torch.zeros_like(scores, dtype=torch.bool)  # (R, K): an id twice in a row is penalized once
        seen[rows, positions[rows, at]] = True
        penalized = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        scores.copy_(torch.where(seen, penalized, scores))


def rules_for(decoding: Decoding, space: Space, prefixes: Sequence[Sequence[int]], device: torch.device) -> list[Rule]:
    """Every rule `decoding` asks for, in the order they apply, for a batch whose sentences start with `prefixes`."""
    rules: list[Rule] = [Banned(space.banned)]
    if decoding.min_len:
        rules.append(MinLength(decoding.min_len, space.eos))
    if decoding.no_repeat_ngram_size:
        rules.append(NoRepeatNgram(decoding.no_repeat_ngram_size))
    if decoding.repetition_penalty != 1.0:
        rules.append(RepetitionPenalty(decoding.repetition_penalty))
    if any(prefixes):  # last: a forced token keeps the model's score whatever the rules before it did
        rules.append(ForcedPrefix.table(prefixes, device))
    return rules
