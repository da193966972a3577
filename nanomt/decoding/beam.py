"""Batched beam search, with the cross-attention keys/values of a sentence shared by its beams.

- Scores: "gnmt" log_prob / ((5 + len) / 6)^alpha (Wu et al., 2016), "average" log_prob / len^alpha (the
  per-token average at alpha 1), "none" log_prob; alpha = `Decoding.length_penalty`, len = generated tokens including
  EOS (a hypothesis cut at its budget has len = budget). Live beams are ranked by log_prob, finished by score.
- Each step takes the 2k best (beam, token) extensions of a sentence; those among the best k that end (EOS,
  or the budget reached) are finished, keeping the best k per sentence; the first k that do not end live on.
- A sentence is done when it reaches its budget, when no live beam has a finite log-prob, or when k
  hypotheses are finished and: with a length-independent score ("none", or alpha 0), no live beam's log-prob
  beats the worst kept score (exact: extending a beam only lowers it); otherwise, with `early_stopping`,
  straight away (fairseq's rule; with alpha > 0 the exact bound, log_prob / penalty(max_len), would almost
  never stop early), without it when the best live beam, scored at its current length, does not beat the
  worst kept score (Hugging Face's default heuristic). steps.bound says which.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding
from nanomt.core.model import DecoderCache, Transformer
from nanomt.decoding.rules import Step, rules_for
from nanomt.decoding.steps import (
    Hypothesis,
    SearchSpace,
    Targets,
    bound,
    budgets,
    check_src,
    entropy,
    next_log_probs,
    score,
    search_space,
    select_encoded,
    select_rows,
)


class _Candidates(NamedTuple):
    """The 2k best one-token extensions of each sentence's live beams, best first."""

    log_probs: Tensor  # (N, 2k) total log-prob of the extended beam
    tokens: Tensor  # (N, 2k) the new token
    parent: Tensor  # (N, 2k) the row (n*k + beam) that it extends
    ends: Tensor  # (N, 2k) True when it ends with EOS or spends the sentence's max_len


def _candidates(
    live_log_probs: Tensor, log_probs: Tensor, at_limit: Tensor, eos_id: int, space: SearchSpace
) -> _Candidates:
    """Rank every (beam, token) extension by total log-prob and keep the best 2k per sentence."""
    n, k = live_log_probs.shape
    v = log_probs.size(-1)
    totals = (live_log_probs.view(-1, 1) + log_probs).view(n, k * v)  # (N, k*V)
    # 2k: even if k of them end with EOS, k remain to continue.
    top_log_probs, top = totals.topk(2 * k, dim=1)  # (N, 2k)
    tokens = space.to_ids(top % v)
    parent = torch.arange(n, device=top.device)[:, None] * k + top // v  # (N, 2k)
    ends = (tokens == eos_id) | at_limit[:, None]  # (N, 2k)
    return _Candidates(top_log_probs, tokens, parent, ends)


def _add_finished(
    finished: list[list[Hypothesis]],
    sentences: list[int],
    history: Tensor,
    cands: _Candidates,
    length: int,
    decoding: Decoding,
    eos_id: int,
    scores: tuple[Tensor, Tensor] | None = None,
) -> None:
    """Move candidates that end to their sentence's kept hypotheses (the best beam_size); `scores`: the kept token
    scores (each live beam's (N*k, t), and each candidate's (N, 2k), log-probs and entropies stacked)."""
    k = cands.log_probs.size(1) // 2
    # As in fairseq, only ending candidates among the k best extensions count: beam search keeps k, not 2k.
    mask = cands.ends[:, :k] & cands.log_probs[:, :k].isfinite()  # (N, k)
    n, j = mask.nonzero().unbind(dim=1)  # (F,) each
    if n.numel() == 0:
        return
    prefixes = history[cands.parent[n, j]].tolist()
    kept = _kept_scores(scores, cands.parent[n, j], n, j, len(prefixes))
    ends_with = zip(n.tolist(), cands.tokens[n, j].tolist(), cands.log_probs[n, j].tolist(), strict=True)
    for prefix, (i, token, log_prob), extra in zip(prefixes, ends_with, kept, strict=True):
        hyp_tokens = prefix if token == eos_id else [*prefix, token]
        hyps = finished[sentences[i]]
        hyps.append(Hypothesis(hyp_tokens, score(log_prob, length, decoding), log_prob, **extra))
        hyps.sort(key=lambda h: h.score, reverse=True)
        del hyps[k:]


def _kept_scores(scores, parents: Tensor, n: Tensor, j: Tensor, count: int) -> list[dict]:
    """Each finished candidate's token scores (its beam's, then its last token's), as Hypothesis fields."""
    if scores is None:
        return [{}] * count
    history, new = scores
    past = history[:, parents].tolist()  # (2, F, t)
    last = new[:, n, j].tolist()  # (2, F)
    return [
        {"token_log_probs": (*past[0][f], last[0][f]), "entropies": (*past[1][f], last[1][f])} for f in range(count)
    ]


def _live_beams(cands: _Candidates) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The first k candidates that do not end, in score order: log-probs, parent rows, tokens, and their places
    among the candidates, each (N, k)."""
    two_k = cands.ends.size(1)
    # Ending candidates are ranked after all the others; within each group the score order stays.
    rank = cands.ends.long() * two_k + torch.arange(two_k, device=cands.ends.device)  # (N, 2k)
    live = rank.topk(two_k // 2, dim=1, largest=False).indices  # (N, k)
    return cands.log_probs.gather(1, live), cands.parent.gather(1, live), cands.tokens.gather(1, live), live


def _sentences_done(
    finished: list[list[Hypothesis]],
    sentences: list[int],
    live_log_probs: Tensor,
    at_limit: Tensor,
    bound: Callable[[float], float] | None,
) -> list[bool]:
    """Whether each active sentence's search is over (the rule is in the module docstring)."""
    # `bound` maps the best live log-prob to the score a live beam is taken to reach at best; None: stop
    # as soon as k hypotheses are finished.
    k = live_log_probs.size(1)
    best_live = live_log_probs.max(dim=1).values.tolist()  # (N,)
    done = []
    for i, limit_reached in enumerate(at_limit.tolist()):
        hyps = finished[sentences[i]]
        if limit_reached or best_live[i] == -math.inf:
            done.append(True)
        elif len(hyps) < k:
            done.append(False)
        else:
            done.append(bound is None or bound(best_live[i]) <= hyps[-1].score)
    return done


def _candidate_scores(cands: _Candidates, raw: Tensor, space: SearchSpace) -> Tensor:
    """(2, N, 2k) each candidate's new token's log-prob and its beam's entropy, from the model's own log-probs
    `raw` (N*k, V), before any rule masked or changed them."""
    token_lp = raw[cands.parent, space.positions(cands.tokens)]  # (N, 2k)
    return torch.stack([token_lp, entropy(raw)[cands.parent]])


@torch.inference_mode()
def beam_search(
    model: Transformer, src: Tensor, decoding: Decoding, targets: Targets | None = None
) -> list[list[Hypothesis]]:
    """Batched beam search (rules in the module docstring): per sentence the n_best hypotheses, best first."""
    check_src(src)
    if src.size(0) == 0:
        return []
    bos_id, eos_id = model.cfg.bos_id, model.cfg.eos_id
    k, device = decoding.beam_size, src.device
    limits = budgets(model, src, decoding)  # (N,)
    space = search_space(model)
    enc = model.encode(src)
    # Decoder rows are sentence-major: row n*k + j is beam j of active sentence n.
    to_beams = torch.arange(src.size(0), device=device).repeat_interleave(k)  # (N*k,)
    first_rules = rules_for(decoding, space, (targets or Targets()).prefixes, device)
    rules = [rule.select(to_beams) for rule in first_rules]
    # No preallocated capacity: every step's index_select copies the whole buffer, so it grows as it fills.
    cache = model.init_cache(enc)
    # A DecoderCache keeps one row a sentence of cross-attention keys/values, which its beams share (the beams
    # on the query axis); another model's cache gets a row a beam, as does the encoder output for it.
    shared = isinstance(cache, DecoderCache)
    if not shared:
        enc, cache = select_rows(enc, cache, to_beams)
    live_log_probs = torch.full((src.size(0), k), -math.inf, device=device)  # (N, k)
    live_log_probs[:, 0] = 0.0  # one live beam at first: k copies of BOS would give k equal candidates
    history = src.new_empty((src.size(0) * k, 0))  # (N*k, t) generated tokens of each live beam
    # With token_scores: each live beam's token log-probs and entropies, (2, N*k, t), moved as `history` is.
    kept = live_log_probs.new_empty((2, src.size(0) * k, 0)) if decoding.token_scores else None
    tokens = src.new_full((src.size(0) * (1 if shared else k), 1), bos_id)  # shared: the first step on one beam
    sentences = list(range(src.size(0)))  # the original index of each active sentence
    finished: list[list[Hypothesis]] = [[] for _ in sentences]
    for step in range(int(limits.max())):
        record = kept is not None
        if step == 0 and shared:  # the one live beam of each sentence, then its row copied to its k beams
            at = Step(0, history[::k], space, bos_id)
            log_probs, cache = next_log_probs(model, tokens, enc, cache, first_rules, at, keep_raw=record)
            log_probs, cache = log_probs.repeat_interleave(k, dim=0), cache.expand(k)  # (N*k, V)
            if record:
                at.raw = at.raw.repeat_interleave(k, dim=0)
        else:
            at = Step(step, history, space, bos_id)
            log_probs, cache = next_log_probs(model, tokens, enc, cache, rules, at, keep_raw=record)
        at_limit = limits <= step + 1  # (N,)
        cands = _candidates(live_log_probs, log_probs, at_limit, eos_id, space)
        new = None if kept is None else _candidate_scores(cands, at.raw, space)  # (2, N, 2k)
        _add_finished(
            finished, sentences, history, cands, step + 1, decoding, eos_id, None if new is None else (kept, new)
        )
        live_log_probs, parent, live_tokens, live = _live_beams(cands)  # (N, k) each
        done = _sentences_done(finished, sentences, live_log_probs, at_limit, bound(decoding, step))
        keep_list = [i for i, d in enumerate(done) if not d]
        if not keep_list:
            break
        keep = torch.tensor(keep_list, device=device)  # (N',)
        rows = parent[keep].view(-1)  # (N'*k,) the beams that live on, in their new order
        if len(keep_list) < len(done) and shared:  # the sentences that go on keep their memory and cross K/V
            enc, cache = select_encoded(enc, keep), cache.index_select(rows, sentences=keep)
        elif len(keep_list) < len(done):  # beams of one sentence share its memory, so `rows` selects it too
            enc, cache = select_rows(enc, cache, rows)
        else:  # beams only move within their sentence: the cross-attention keys/values stay where they are
            cache = cache.index_select(rows, cross=False)
        rules = [rule.select(rows) for rule in rules]
        tokens = live_tokens[keep].view(-1, 1)  # (N'*k, 1)
        history = torch.cat([history[rows], tokens], dim=1)  # (N'*k, t+1)
        if kept is not None:
            moved = new.gather(2, live[None].expand(2, -1, -1))[:, keep].reshape(2, -1, 1)  # (2, N'*k, 1)
            kept = torch.cat([kept[:, rows], moved], dim=2)  # (2, N'*k, t+1)
        live_log_probs, limits = live_log_probs[keep], limits[keep]
        sentences = [sentences[i] for i in keep_list]
    return [hyps[: decoding.n_best] for hyps in finished]
