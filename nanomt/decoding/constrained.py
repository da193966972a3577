"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar, 2018): every translation contains
each of its sentence's target phrases (a glossary's terms, as token ids), each as whole words.

The search is beam.beam_search's, with three changes:
- each live beam tracks its progress through the phrases (`Progress`): the phrases met, and the tokens written so
  far of one being written. A phrase whose last token is written is pending: it is met only if the next token starts
  a new word, is punctuation or ends the sentence (`Targets.word_start`), so that a term 'hound' is not met by
  'hounding'. EOS is blocked until every phrase is met (or pending);
- the candidates of a sentence are the 2k best extensions, each beam's best token, and each beam's tokens that
  advance a phrase (the next token of the phrase it is writing, or the first of one not met);
- the k beams that live on are taken from the candidates grouped in banks by the phrase tokens they have met: the
  best of the fullest bank, then the best of the next, ... round after round (the dynamic allocation), so that
  hypotheses that met more of the phrases survive beside likelier ones that met fewer.
A finished hypothesis counts only if it met every phrase. A sentence whose phrases no hypothesis could meet within
its budget gets no hypothesis ([]): search then gives it the unconstrained search's, marked `terms_missed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.decoding.rules import Step, rules_for
from nanomt.decoding.steps import (
    Hypothesis,
    SearchSpace,
    Targets,
    bound,
    budgets,
    check_src,
    next_log_probs,
    score,
    search_space,
    select_rows,
)

Phrases = tuple[tuple[int, ...], ...]  # one sentence's constraints: target token ids of each phrase


@dataclass(frozen=True)
class Progress:
    """A hypothesis' progress through its sentence's phrases."""

    phrases: Phrases
    met: frozenset[int] = frozenset()
    # (phrase, tokens of it written) of the phrase being written; all its tokens: pending, the next must start a word
    partial: tuple[int, int] | None = None
    whole_words: bool = False  # False: a phrase is met with its last token, whatever follows

    @property
    def count(self) -> int:
        """Phrase tokens met: the bank of the hypothesis."""
        done = sum(len(self.phrases[i]) for i in self.met)
        return done + (self.partial[1] if self.partial else 0)

    @property
    def pending(self) -> bool:
        """A phrase is written whole and waits for the next token to start a word."""
        return self.partial is not None and self.partial[1] == len(self.phrases[self.partial[0]])

    @property
    def done(self) -> bool:
        """Every phrase met, if the sentence ends here (a pending phrase included: the end confirms it)."""
        return len(self.met) + self.pending == len(self.phrases)

    def next_tokens(self) -> set[int]:
        """The tokens that advance: the next of the phrase being written, the first of each one not met."""
        tokens = {p[0] for i, p in enumerate(self.phrases) if i not in self.met}
        if self.partial is not None and not self.pending:
            i, j = self.partial
            tokens.add(self.phrases[i][j])
        return tokens

    def advance(self, token: int, starts_word: bool = True) -> Progress:
        """The progress after `token`: a pending phrase met (`starts_word`) or broken, then one goes on or starts."""
        if self.pending:
            i = self.partial[0]
            return self._again(self.met | {i} if starts_word else self.met)._next(token)
        return self._next(token)

    def _next(self, token: int) -> Progress:
        if self.partial is not None:
            i, j = self.partial
            if self.phrases[i][j] == token:
                return self._written(i, j + 1)
        starts = [i for i, p in enumerate(self.phrases) if i not in self.met and p[0] == token]
        if starts:
            return self._written(starts[0], 1)
        return self._again(self.met) if self.partial is not None else self

    def _again(self, met: frozenset[int], partial: tuple[int, int] | None = None) -> Progress:
        return Progress(self.phrases, met, partial, self.whole_words)

    def _written(self, i: int, j: int) -> Progress:
        if j == len(self.phrases[i]) and not self.whole_words:
            return self._again(self.met | {i})
        return self._again(self.met, (i, j))


@dataclass(frozen=True)
class _Candidate:
    total: float  # log-prob of the extended beam
    row: int  # the beam (row) it extends
    token: int
    progress: Progress
    ends: bool


def _candidates(
    totals: Tensor,
    log_probs: Tensor,
    rows: range,
    progress: list[Progress],
    ends: tuple[bool, int],
    starts: list[bool] | None,
    space: SearchSpace,
) -> list[_Candidate]:
    """A sentence's candidates: the 2k best extensions, each beam's best, each beam's advancing tokens; best first."""
    # ends: (whether the budget is spent, EOS's id); starts: per id, whether it starts a word (None: any id does)
    (at_limit, eos_id), k, width = ends, len(rows), totals.size(1)
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
        word = token == eos_id or starts is None or starts[token]
        out.append(_Candidate(total, r, token, progress[r].advance(token, word), token == eos_id or at_limit))
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
    model: Transformer, src: Tensor, decoding: Decoding, targets: Targets | None = None
) -> list[list[Hypothesis]]:
    """Per sentence the n_best hypotheses that contain every phrase of `targets`, best first ([]: none could)."""
    check_src(src)
    targets = targets or Targets()
    bos_id, eos_id = model.cfg.bos_id, model.cfg.eos_id
    k, n, device = decoding.beam_size, src.size(0), src.device
    starts = None if targets.word_start is None else targets.word_start.tolist()
    phrases = targets.phrases or [()] * n
    limits = budgets(model, src, decoding).tolist()
    space = search_space(model)
    to_beams = torch.arange(n, device=device).repeat_interleave(k)  # (N*k,) row n*k + j: beam j of sentence n
    rules = [rule.select(to_beams) for rule in rules_for(decoding, space, targets.prefixes, device)]
    enc = model.encode(src)
    enc, cache = select_rows(enc, model.init_cache(enc), to_beams)
    live = torch.full((n, k), -math.inf, device=device)  # (N, k) log-probs of the live beams
    live[:, 0] = 0.0
    first = [Progress(tuple(map(tuple, p)), whole_words=starts is not None) for p in phrases]
    progress = [p for p in first for _ in range(k)]  # (N*k,) a beam's progress
    history = src.new_empty((n * k, 0))  # (N*k, t)
    tokens = src.new_full((n * k, 1), bos_id)  # (N*k, 1)
    sentences, finished = list(range(n)), [[] for _ in range(n)]
    for step in range(max(limits, default=0)):
        log_probs, cache = next_log_probs(model, tokens, enc, cache, rules, Step(step, history, space, bos_id))
        if space.eos is not None:  # EOS once every phrase is met
            log_probs[[r for r, p in enumerate(progress) if not p.done], space.eos] = -math.inf
        totals = live.view(-1, 1) + log_probs  # (R, K)
        rows, parents, next_tokens, next_progress, keep = [], [], [], [], []
        for i, s in enumerate(sentences):
            span, ends = range(i * k, (i + 1) * k), (limits[s] <= step + 1, eos_id)
            cands = _candidates(totals, log_probs, span, progress, ends, starts, space)
            finished[s] = _finish(finished[s], cands, history, k, step + 1, decoding, eos_id)
            chosen = _allocate(cands, k)
            if _done(finished[s], chosen, k, ends[0], bound(decoding, step)):
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
        enc, cache = select_rows(enc, cache, index)
        rules = [rule.select(index) for rule in rules]
        tokens = torch.tensor(next_tokens, device=device).view(-1, 1)  # (N'*k, 1)
        history = torch.cat([history[index], tokens], dim=1)  # (N'*k, t+1)
        live = torch.tensor(parents, device=device).view(-1, k)  # (N', k)
        progress = next_progress
        sentences = [sentences[i] for i in keep]
    return [h[: decoding.n_best] for h in finished]


def _finish(
    hyps: list[Hypothesis], cands: list[_Candidate], history: Tensor, k: int, length: int, decoding: Decoding, eos: int
) -> list[Hypothesis]:
    """The sentence's best k finished hypotheses, with the candidates that end having met every phrase."""
    for c in cands:
        if c.ends and c.progress.done:
            ended = history[c.row].tolist() + ([] if c.token == eos else [c.token])
            hyps.append(Hypothesis(ended, score(c.total, length, decoding), c.total))
    return sorted(hyps, key=lambda h: -h.score)[:k]


def _done(hyps: list[Hypothesis], live: list[_Candidate], k: int, at_limit: bool, bound) -> bool:
    """A sentence's search is over: its budget is spent, no beam lives, or k hypotheses met every phrase and no live
    beam is taken to beat the worst of them (`bound`: steps.bound, as beam search; None: stop at once)."""
    if at_limit or not live:
        return True
    if len(hyps) < k:
        return False
    return bound is None or bound(live[0].total) <= hyps[-1].score
