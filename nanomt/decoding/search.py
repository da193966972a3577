"""One entry for every search mode: `search` gives a batch the greedy, sampled, beam or constrained beam search its
Decoding asks for, so that the Translator (and a test) never chooses among them nor passes a Decoding's fields one by
one. The modes are siblings over nanomt.decoding.steps; a sentence with phrases goes through the constrained search,
the others through the plain one, each group as a batch of its own."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.constrained import constrained_beam_search
from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample
from nanomt.decoding.steps import Hypothesis, Targets, budgets, on_rows

__all__ = ["Hypothesis", "Targets", "beam_search", "constrained_beam_search", "greedy", "sample", "search"]


def search(
    model: Transformer, src: Tensor, decoding: Decoding, targets: Targets | None = None
) -> list[list[Hypothesis]]:
    """The search or sampling `decoding` asks for: n_best hypotheses a sentence, holding its `targets`."""
    targets = targets or Targets()
    if any(targets.prefixes):
        limits = budgets(model, src, decoding).tolist()
        over = [(len(p), n) for p, n in zip(targets.prefixes, limits) if len(p) >= n]
        if over:
            raise ValueError(f"a prefix of {over[0][0]} tokens does not fit the length limit ({over[0][1]} tokens)")
    if decoding.sampling is not None:
        return sample(model, src, decoding, targets)
    if any(targets.phrases):
        return _with_phrases(model, src, decoding, targets)
    if decoding.beam_size == 1 and decoding.n_best == 1:
        return greedy(model, src, decoding, targets)
    return beam_search(model, src, decoding, targets)


def _with_phrases(model: Transformer, src: Tensor, decoding: Decoding, targets: Targets) -> list[list[Hypothesis]]:
    """Sentences with phrases through the constrained search, the others through the plain one, each group alone."""
    out: list[list[Hypothesis]] = [[] for _ in targets.phrases]
    plain = [i for i, p in enumerate(targets.phrases) if not p]
    constrained = [i for i, p in enumerate(targets.phrases) if p]
    if plain:
        for i, hyps in zip(plain, on_rows(beam_search, model, src, decoding, targets, plain)):
            out[i] = hyps
    for i, hyps in zip(constrained, on_rows(constrained_beam_search, model, src, decoding, targets, constrained)):
        out[i] = hyps
    unmet = [i for i in constrained if not out[i]]  # the best the model can do without the phrases, said so
    if unmet:
        for i, hyps in zip(unmet, on_rows(beam_search, model, src, decoding, targets, unmet)):
            out[i] = [dataclasses.replace(h, terms_missed=True) for h in hyps]
    return out
