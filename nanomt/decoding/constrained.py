"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar, 2018): every translation contains
each of its sentence's target phrases (a glossary's terms, as token ids).

The search is decode.beam_search's, with three changes:
- each live beam tracks its progress through the phrases (`Progress`): the phrases met, and the tokens written so
  far of one being written. EOS is blocked until every phrase is met;
- the candidates of a sentence are the 2k best extensions, each beam's best token, and each beam's tokens that
  advance a phrase (the next token of the phrase it is writing, or the first of one not met);
- the k beams that live on are taken from the candidates grouped in banks by the phrase tokens they have met: the
  best of the fullest bank, then the best of the next, ... round after round (the dynamic allocation), so that
  hypotheses that met more of the phrases survive beside likelier ones that met fewer.
A finished hypothesis counts only if it met every phrase. A sentence whose phrases no hypothesis could meet within
its length budget is reported unmet (`met` False), and its hypotheses are those of the unconstrained search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nanomt.core.model import Transformer
from nanomt.decoding.rules import Rule, Step
from nanomt.decoding.search import (
    Hypothesis,
    MaxLen,
    _check_beam_args,
    _length_penalty,
    _max_lens,
    _next_log_probs,
    _select,
    _space,
    _special_ids,
    beam_search,
)

Phrases = tuple[tuple[int, ...], ...]  # one sentence's constraints: target token ids of each phrase


@dataclass(frozen=True)
class Progress:
    """A hypothesis' progress through its sentence's phrases."""

    phrases: Phrases
    met: frozenset[int] = frozenset()
    partial: tuple[int, int] | None = None  # (phrase, tokens of it written) of the phrase being written

    @property
    def count(self) -> int:
        """Phrase tokens met: the bank of the hypothesis."""
        done = sum(len(self.phrases[i]) for i in self.met)
        return done + (self.partial[1] if self.partial else 0)

    @property
    def done(self) -> bool:
        return len(self.met) == len(self.phrases)

    def next_tokens(self) -> set[int]:
        """The tokens that advance: the next of the phrase being written, the first of each one not met."""
        tokens = {p[0] for i, p in enumerate(self.phrases) if i not in self.met}
        if self.partial is not None:
            i, j = self.partial
            tokens.add(self.phrases[i][j])
        return tokens

    def advance(self, token: int) -> Progress:
        """The progress after writing `token`: a phrase goes on, starts, is met, or the one being written is broken."""
        if self.partial is not None:
            i, j = self.partial
            if self.phrases[i][j] == token:
                return self._written(i, j + 1)
        starts = [i for i, p in enumerate(self.phrases) if i not in self.met and p[0] == token]
        if starts:
            return self._written(starts[0], 1)
        return Progress(self.phrases, self.met) if self.partial is not None else self

    def _written(self, i: int, j: int) -> Progress:
        if j == len(self.phrases[i]):
            return Progress(self.phrases, self.met | {i})
        return Progress(self.phrases, self.met, (i, j))


@dataclass(frozen=True)
class _Candidate:
    total: float  # log-prob of the extended beam
    row: int  # the beam (row) it extends
    token: int
    progress: Progress
    ends: bool


def _candidates(
    totals: Tensor, log_probs: Tensor, rows: range, progress: list[Progress], at_limit: bool, eos_id: int, space
) -> list[_Candidate]:
    """A sentence's candidates: the 2k best extensions, each beam's best, each beam's advancing tokens; best first."""
    k, width = len(rows), totals.size(1)
    block = totals[rows.start : rows.stop]  # (k, K)
    pairs = {}
    top = block.reshape(-1).topk(min(2 * k, block.numel()))
    for value, flat in zip(top.values.tolist(), top.indices.tolist()):
        pairs[(rows.start + flat // width, flat % width)] = value
    best = log_probs[rows.start : rows.stop].max(dim=1).indices.tolist()
    for j, r in enumerate(rows):
        pairs[(r, best[j])] = float(block[j, best[j]])
        wanted = torch.tensor(sorted(progress[r].next_tokens()), dtype=torch.long, device=totals.device)
        positions = space.positions(wanted).tolist() if len(wanted) else []
        for p in positions:
            if p >= 0:
                pairs[(r, p)] = float(block[j, p])
    out = []
    for (r, p), total in pairs.items():
        if total == -math.inf:
            continue
        token = int(space.to_ids(torch.tensor(p)))
        out.append(_Candidate(total, r, token, progress[r].advance(token), token == eos_id or at_limit))
    return sorted(out, key=lambda c: -c.total)


def _allocate(cands: list[_Candidate], k: int) -> list[_Candidate]:
    """k live beams from the non-ending candidates: round after round, the best left of each bank, fullest first."""
    banks: dict[int, list[_Candidate]] = {}
    for c in cands:
        if not c.ends:
            banks.setdefault(c.progress.count, []).append(c)
    order = sorted(banks, reverse=True)
    chosen, depth = [], 0
    while len(chosen) < k and any(depth < len(banks[b]) for b in order):
        chosen += [banks[b][depth] for b in order if depth < len(banks[b])][: k - len(chosen)]
        depth += 1
    return sorted(chosen, key=lambda c: -c.total)


@torch.inference_mode()
def constrained_beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int,
    max_len: MaxLen,
    phrases: Sequence[Phrases],
    min_len: int = 0,
    length_penalty: float = 1.0,
    length_penalty_kind: str = "gnmt",
    n_best: int = 1,
    early_stopping: bool = True,
    rules: Sequence[Rule] = (),
) -> tuple[list[list[Hypothesis]], list[bool]]:
    """Per sentence the n_best hypotheses that contain every phrase, and whether they could (else: unconstrained)."""
    _check_beam_args(src, beam_size, min_len, length_penalty_kind, n_best)
    bos_id, eos_id = _special_ids(model, None, None)
    k, n, device = beam_size, src.size(0), src.device

    def score(log_prob: float, length: int) -> float:
        return log_prob / _length_penalty(length, length_penalty, length_penalty_kind)

    def bound(step: int):
        if length_penalty_kind == "none" or length_penalty == 0:  # extending a beam only lowers it: exact
            return lambda log_prob: log_prob
        return None if early_stopping else lambda log_prob: score(log_prob, step + 1)

    extra = list(rules)
    limits = _max_lens(model, src, max_len, eos_id).tolist()
    space = _space(model, bos_id, eos_id)
    to_beams = torch.arange(n, device=device).repeat_interleave(k)  # (N*k,) row n*k + j: beam j of sentence n
    rules = space.rules(min_len) + [rule.select(to_beams) for rule in rules]
    enc = model.encode(src)
    enc, cache = _select(enc, model.init_cache(enc), to_beams)
    live = torch.full((n, k), -math.inf, device=device)  # (N, k) log-probs of the live beams
    live[:, 0] = 0.0
    progress = [Progress(tuple(map(tuple, phrases[i]))) for i in range(n) for _ in range(k)]
    history = src.new_empty((n * k, 0))  # (N*k, t)
    tokens = src.new_full((n * k, 1), bos_id)  # (N*k, 1)
    sentences, finished = list(range(n)), [[] for _ in range(n)]
    for step in range(max(limits)):
        log_probs, cache = _next_log_probs(model, tokens, enc, cache, rules, Step(step, history, space, bos_id))
        if space.eos is not None:  # EOS once every phrase is met
            log_probs[[r for r, p in enumerate(progress) if not p.done], space.eos] = -math.inf
        totals = live.view(-1, 1) + log_probs  # (R, K)
        rows, parents, next_tokens, next_progress, keep = [], [], [], [], []
        for i, s in enumerate(sentences):
            span, at_limit = range(i * k, (i + 1) * k), limits[s] <= step + 1
            cands = _candidates(totals, log_probs, span, progress, at_limit, eos_id, space)
            finished[s] = _finish(finished[s], cands, history, k, lambda lp, n=step + 1: score(lp, n), eos_id)
            chosen = _allocate(cands, k)
            if _done(finished[s], chosen, k, at_limit, bound(step)):
                continue
            chosen += [None] * (k - len(chosen))  # dead beams: -inf, any parent
            keep.append(i)
            for c in chosen:
                rows.append(span.start if c is None else c.row)
                parents.append(-math.inf if c is None else c.total)
                next_tokens.append(bos_id if c is None else c.token)
                next_progress.append(progress[span.start] if c is None else c.progress)
        if not keep:
            break
        index = torch.tensor(rows, device=device)  # (N'*k,)
        enc, cache = _select(enc, cache, index)
        rules = [rule.select(index) for rule in rules]
        tokens = torch.tensor(next_tokens, device=device).view(-1, 1)  # (N'*k, 1)
        history = torch.cat([history[index], tokens], dim=1)
        live = torch.tensor(parents, device=device).view(-1, k)  # (N', k)
        progress = next_progress
        sentences = [sentences[i] for i in keep]
    met = [bool(h) for h in finished]
    out = [h[:n_best] for h in finished]
    unmet = [i for i, ok in enumerate(met) if not ok]
    if unmet:  # the best the model can do without the phrases, said so by `met`
        index = torch.tensor(unmet, device=device)
        settings = (min_len, length_penalty, length_penalty_kind, n_best)
        part, part_rules = src.index_select(0, index), [rule.select(index) for rule in extra]
        plain = beam_search(model, part, beam_size, max_len, *settings, early_stopping=early_stopping, rules=part_rules)
        for i, hyps in zip(unmet, plain):
            out[i] = hyps
    return out, met


def _finish(hyps: list[Hypothesis], cands: list[_Candidate], history: Tensor, k: int, score, eos_id: int) -> list:
    """The sentence's best k finished hypotheses, with the candidates that end having met every phrase."""
    for c in cands:
        if c.ends and c.progress.done:
            ended = history[c.row].tolist() + ([] if c.token == eos_id else [c.token])
            hyps.append(Hypothesis(ended, score(c.total), c.total))
    return sorted(hyps, key=lambda h: -h.score)[:k]


def _done(hyps: list[Hypothesis], live: list[_Candidate], k: int, at_limit: bool, bound) -> bool:
    """A sentence's search is over: its budget is spent, no beam lives, or k hypotheses met every phrase and no live
    beam is taken to beat the worst of them (`bound`: decode.beam_search's rule; None: stop at once)."""
    if at_limit or not live:
        return True
    if len(hyps) < k:
        return False
    return bound is None or bound(live[0].total) <= hyps[-1].score
