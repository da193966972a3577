"""Greedy decoding, batched beam search and sampling: token ids in, token ids out, on the KV cache.

Conventions shared by every function here:
- `src` is (B, S) ids, right-padded with `model.cfg.pad_id`, each sentence ending with EOS; the decoder
  starts from `bos_id`. Returned token lists exclude BOS and EOS. `bos_id`/`eos_id` None: the model's own
  (`model.cfg.bos_id`/`eos_id`).
- `max_len` bounds the generated tokens per sentence INCLUDING the final EOS: at most `max_len` tokens are
  generated, and a hypothesis that reaches `max_len` tokens without EOS is finished as it is (max_len tokens,
  no EOS). `max_len` is an int or a function of the source length (non-pad, non-EOS tokens), see
  `max_len_fn`; it is capped at `model.cfg.max_positions`, the positions the decoder has.
- `min_len`: EOS gets log-prob -inf until at least `min_len` non-EOS tokens have been generated (so
  `min_len >= max_len` forces exactly `max_len` tokens). PAD and BOS are never generated.
- Log-probs are the model's own (log_softmax in float32); masking a token does not renormalize the others.
- Everything runs under `torch.inference_mode()`. The train/eval mode is left alone: call `model.eval()`
  first, or dropout makes the output random.
- Sentences that have finished are dropped from the batch (cache and memory rows `index_select`-ed away).

Beam search:
- Scores: "gnmt" log_prob / ((5 + len) / 6)^alpha (Wu et al., 2016), "average" log_prob / len^alpha (the
  per-token average at alpha 1), "none" log_prob; alpha = `length_penalty`, len = generated tokens including
  EOS (a hypothesis cut at max_len has len = max_len). Live beams are ranked by log_prob, finished by score.
- Each step takes the 2k best (beam, token) extensions of a sentence; those among the best k that end (EOS,
  or max_len reached) are finished, keeping the best k per sentence; the first k that do not end live on.
- A sentence is done when it reaches its max_len, when no live beam has a finite log-prob, or when k
  hypotheses are finished and: with a length-independent score ("none", or alpha 0), no live beam's log-prob
  beats the worst kept score (exact: extending a beam only lowers it); otherwise, with `early_stopping`,
  straight away (fairseq's rule; with alpha > 0 the exact bound, log_prob / penalty(max_len), would almost
  never stop early), without it when the best live beam, scored at its current length, does not beat the
  worst kept score (Hugging Face's default heuristic).
- Sampling draws from a local generator seeded with `seed` (fresh entropy when None), never torch's global
  RNG; one seed gives one output for one batch (a sentence's sample depends on its batch neighbours).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from nanomt.core.decoding import LENGTH_PENALTIES, Decoding
from nanomt.core.model import DecoderCache, Encoded, Transformer
from nanomt.decoding.rules import Banned, ForcedPrefix, MinLength, NoRepeatNgram, RepetitionPenalty, Rule, Step

MaxLen = int | Callable[[int], int]


@dataclass(frozen=True)
class Hypothesis:
    """One finished beam-search output: tokens without BOS/EOS, length-penalized score, total log-prob."""

    tokens: list[int]
    score: float
    log_prob: float  # sum of the token log-probs, EOS included when the hypothesis ended with it
    terms_missed: bool = False  # a glossary's terms could not all be placed: the unconstrained search's output


def max_len_fn(a: float, b: int) -> Callable[[int], int]:
    """fairseq's --max-len-a/--max-len-b: max_len = int(a * src_len + b), src_len without padding and EOS."""

    def max_len(src_len: int) -> int:
        return int(a * src_len + b)

    return max_len


# ---------------------------------------------------------------------------------------------------------
# Shared steps.
# ---------------------------------------------------------------------------------------------------------


def _max_lens(model: Transformer, src: Tensor, max_len: MaxLen, eos_id: int) -> Tensor:
    """(B,) generation budget of each sentence, capped at the decoder's positions."""
    if callable(max_len):
        src_lens = ((src != model.cfg.pad_id) & (src != eos_id)).sum(dim=1).tolist()
        budgets = [int(max_len(n)) for n in src_lens]
    else:
        budgets = [int(max_len)] * src.size(0)
    if min(budgets) < 1:
        raise ValueError(f"max_len must be >= 1 for every sentence, got {min(budgets)}")
    # The last generated token is never fed back, so max_len tokens need max_len decoder positions.
    return torch.tensor([min(n, model.cfg.max_positions) for n in budgets], device=src.device)


def _select_encoded(enc: Encoded, index: Tensor) -> Encoded:
    """Keep/reorder batch rows of the encoder output."""
    return Encoded(enc.memory.index_select(0, index), enc.src_mask.index_select(0, index))


def _select(enc: Encoded, cache: DecoderCache, index: Tensor) -> tuple[Encoded, DecoderCache]:
    """Keep/reorder batch rows of the encoder output and the decoder cache."""
    return _select_encoded(enc, index), cache.index_select(index)


class _Space(NamedTuple):
    """The scores decoding picks from: one per id, or one per id a pruned model scores (position p: ids[p])."""

    ids: Tensor | None  # (K,) the id at each position; None: positions are ids
    banned: list[int]  # positions never picked: PAD and BOS (unless one of them is also EOS)
    eos: int | None  # EOS's position; None: the model never scores it
    index: Tensor | None  # (V,) each id's position, -1 where not scored; None: positions are ids

    def to_ids(self, positions: Tensor) -> Tensor:
        return positions if self.ids is None else self.ids[positions]

    def positions(self, ids: Tensor) -> Tensor:
        return ids if self.index is None else self.index[ids]

    def rules(self, min_len: int) -> list[Rule]:
        """The rules every search applies: PAD and BOS never picked, EOS blocked until min_len tokens."""
        return [Banned(self.banned), MinLength(min_len, self.eos)] if min_len else [Banned(self.banned)]


def _space(model: Transformer, bos_id: int, eos_id: int, kept_only: bool = True) -> _Space:
    """Where decoding picks: a `prune_output` copy's K scores (kept_only), else all V ids."""
    banned = sorted({model.cfg.pad_id, bos_id} - {eos_id})
    if not (kept_only and getattr(model, "pruned", False)):  # an Ensemble scores all ids
        return _Space(None, banned, eos_id, None)
    # A log_softmax and top-k over the K scores the pruned projection computes, rather than over V with -inf at
    # the others: no (R, V) row to fill and scatter into at every step, and the same log-probs (-inf adds 0).
    position = {i: p for p, i in enumerate(model.output_ids.tolist())}
    banned = sorted(position[i] for i in banned if i in position)
    index = torch.full((model.cfg.tgt_vocab_size,), -1, dtype=torch.long, device=model.output_ids.device)
    index[model.output_ids] = torch.arange(len(position), device=index.device)
    return _Space(model.output_ids, banned, position.get(eos_id), index)


def _next_log_probs(
    model: Transformer,
    tokens: Tensor,
    enc: Encoded,
    cache: DecoderCache,
    rules: list[Rule],
    step: Step,
    normalize: bool = True,
) -> tuple[Tensor, DecoderCache]:
    """Feed the newest tokens (R, 1) (ids); return next-token log-probs (or masked logits) over the step's space,
    float32, with every rule applied: the one place where scores are masked."""
    # normalize=False returns the masked logits instead: log-probs up to a per-row constant, all that argmax
    # and softmax sampling need (it saves a log_softmax over the vocabulary at every step).
    pruned = step.space.ids is not None
    out = model.decode(tokens, enc, cache, restricted=True) if pruned else model.decode(tokens, enc, cache)
    # float32: logits may be bf16 under autocast, and beam scores add up many of these.
    scores = out.logits[:, -1].float()  # (R, V), or (R, K) over a pruned model's scored ids
    if normalize:
        scores = scores.log_softmax(dim=-1)
    if any(rule.needs_raw for rule in rules):
        step.raw = scores.clone()
    for rule in rules:
        rule.apply(scores, step)
    return scores, out.cache


def _special_ids(model: Transformer, bos_id: int | None, eos_id: int | None) -> tuple[int, int]:
    """The given BOS and EOS ids, or the model's own where None."""
    return (model.cfg.bos_id if bos_id is None else bos_id), (model.cfg.eos_id if eos_id is None else eos_id)


def _until_eos(tokens: list[int], eos_id: int) -> list[int]:
    """The tokens before the first EOS."""
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def _check_src(src: Tensor, min_len: int) -> None:
    """Raise ValueError on arguments every decoding function shares."""
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")


# ---------------------------------------------------------------------------------------------------------
# One hypothesis per sentence: greedy and sampling.
# ---------------------------------------------------------------------------------------------------------


def _generate(
    model: Transformer,
    src: Tensor,
    max_len: MaxLen,
    min_len: int,
    bos_id: int | None,
    eos_id: int | None,
    pick: Callable[[Tensor], Tensor],
    kept_only: bool = True,
    rules: Sequence[Rule] = (),
) -> list[list[int]]:
    """Extend each sentence by the token `pick` chooses from its masked logits until EOS or max_len."""
    bos_id, eos_id = _special_ids(model, bos_id, eos_id)
    limits = _max_lens(model, src, max_len, eos_id)  # (B,)
    space = _space(model, bos_id, eos_id, kept_only)
    rules = space.rules(min_len) + list(rules)
    enc = model.encode(src)
    cache = model.init_cache(enc, capacity=int(limits.max()))  # room for every step: no cache regrowth
    rows = torch.arange(src.size(0), device=src.device)  # (R,) the sentence of each active row
    # Positions never written stay EOS, so a sentence's output is its row up to the first EOS.
    out = src.new_full((src.size(0), int(limits.max())), eos_id)  # (B, L)
    tokens = src.new_full((src.size(0), 1), bos_id)  # (R, 1)
    for step in range(out.size(1)):
        # Unnormalized: argmax and softmax sampling give the same tokens from log-probs and from logits.
        at = Step(step, out[rows, :step], space, bos_id)
        logits, cache = _next_log_probs(model, tokens, enc, cache, rules, at, normalize=False)
        next_tokens = space.to_ids(pick(logits))  # (R,)
        out[rows, step] = next_tokens
        alive = (next_tokens != eos_id) & (limits[rows] > step + 1)  # (R,)
        if not alive.all():
            keep = alive.nonzero().squeeze(1)  # (R',)
            if keep.numel() == 0:
                break
            rows, next_tokens = rows[keep], next_tokens[keep]
            enc, cache = _select(enc, cache, keep)
            rules = [rule.select(keep) for rule in rules]
        tokens = next_tokens[:, None]  # (R, 1)
    return [_until_eos(seq, eos_id) for seq in out.tolist()]


@torch.inference_mode()
def greedy(
    model: Transformer,
    src: Tensor,
    max_len: MaxLen,
    min_len: int = 0,
    bos_id: int | None = None,
    eos_id: int | None = None,
    rules: Sequence[Rule] = (),
) -> list[list[int]]:
    """The most probable next token at every step; one token list per sentence."""
    _check_src(src, min_len)
    if src.size(0) == 0:
        return []
    # max(dim).indices, not argmax: the same first-maximum index, and 3x faster on a CPU (180 vs 60 us at 32 x 8k).
    pick = lambda logits: logits.max(dim=-1).indices  # noqa: E731
    return _generate(model, src, max_len, min_len, bos_id, eos_id, pick, rules=rules)


def _top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus sampling (Holtzman et al., 2020): keep the fewest most probable tokens with mass >= top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (R, V)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p; the most probable one always stays.
    drop = probs.cumsum(dim=-1) - probs >= top_p  # (R, V)
    return logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)


def _sampler(temperature: float, top_k: int, top_p: float, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
    """A `pick` that samples from the tempered, top-k and top-p filtered distribution."""

    def pick(logits: Tensor) -> Tensor:
        logits = logits / temperature  # (R, V)
        if 0 < top_k < logits.size(-1):
            kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (R, 1)
            logits = logits.masked_fill(logits < kth, -math.inf)
        if top_p < 1.0:
            logits = _top_p_filter(logits, top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (R,)

    return pick


@torch.inference_mode()
def sample(
    model: Transformer,
    src: Tensor,
    max_len: MaxLen,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    min_len: int = 0,
    bos_id: int | None = None,
    eos_id: int | None = None,
    rules: Sequence[Rule] = (),
) -> list[list[int]]:
    """Ancestral sampling with temperature, top-k (0: off) and nucleus top-p (1.0: off); a list a sentence."""
    _check_src(src, min_len)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if src.size(0) == 0:
        return []
    generator = torch.Generator(device=src.device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    pick = _sampler(temperature, top_k, top_p, generator)
    # Over all V ids, -inf where a restricted model does not score: the draws a seed gives stay what they were.
    return _generate(model, src, max_len, min_len, bos_id, eos_id, pick, kept_only=False, rules=rules)


# ---------------------------------------------------------------------------------------------------------
# Beam search.
# ---------------------------------------------------------------------------------------------------------


def _check_beam_args(src: Tensor, beam_size: int, min_len: int, length_penalty_kind: str, n_best: int) -> None:
    _check_src(src, min_len)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be in [1, beam_size={beam_size}], got {n_best}")
    if length_penalty_kind not in LENGTH_PENALTIES:
        raise ValueError(f"length_penalty_kind must be one of {LENGTH_PENALTIES}, got {length_penalty_kind!r}")


def _length_penalty(length: int, alpha: float, kind: str) -> float:
    """What a hypothesis' log-prob is divided by; `length` counts generated tokens including EOS."""
    if kind == "gnmt":  # Wu et al. (2016), eq. 14
        return ((5 + length) / 6) ** alpha
    if kind == "average":
        return length**alpha
    return 1.0


class _Candidates(NamedTuple):
    """The 2k best one-token extensions of each sentence's live beams, best first."""

    log_probs: Tensor  # (N, 2k) total log-prob of the extended beam
    tokens: Tensor  # (N, 2k) the new token
    parent: Tensor  # (N, 2k) the row (n*k + beam) that it extends
    ends: Tensor  # (N, 2k) True when it ends with EOS or spends the sentence's max_len


def _candidates(live_log_probs: Tensor, log_probs: Tensor, at_limit: Tensor, eos_id: int, space: _Space) -> _Candidates:
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
    score: Callable[[float, int], float],
    eos_id: int,
) -> None:
    """Move candidates that end to their sentence's kept hypotheses (the best beam_size)."""
    k = cands.log_probs.size(1) // 2
    # As in fairseq, only ending candidates among the k best extensions count: beam search keeps k, not 2k.
    mask = cands.ends[:, :k] & cands.log_probs[:, :k].isfinite()  # (N, k)
    n, j = mask.nonzero().unbind(dim=1)  # (F,) each
    if n.numel() == 0:
        return
    prefixes = history[cands.parent[n, j]].tolist()
    ends_with = zip(n.tolist(), cands.tokens[n, j].tolist(), cands.log_probs[n, j].tolist(), strict=True)
    for prefix, (i, token, log_prob) in zip(prefixes, ends_with, strict=True):
        hyp_tokens = prefix if token == eos_id else [*prefix, token]
        hyps = finished[sentences[i]]
        hyps.append(Hypothesis(hyp_tokens, score(log_prob, length), log_prob))
        hyps.sort(key=lambda h: h.score, reverse=True)
        del hyps[k:]


def _live_beams(cands: _Candidates) -> tuple[Tensor, Tensor, Tensor]:
    """The first k candidates that do not end, in score order: log-probs, parent rows, tokens, each (N, k)."""
    two_k = cands.ends.size(1)
    # Ending candidates are ranked after all the others; within each group the score order stays.
    rank = cands.ends.long() * two_k + torch.arange(two_k, device=cands.ends.device)  # (N, 2k)
    live = rank.topk(two_k // 2, dim=1, largest=False).indices  # (N, k)
    return cands.log_probs.gather(1, live), cands.parent.gather(1, live), cands.tokens.gather(1, live)


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


@torch.inference_mode()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int,
    max_len: MaxLen,
    min_len: int = 0,
    length_penalty: float = 1.0,
    length_penalty_kind: str = "gnmt",
    n_best: int = 1,
    bos_id: int | None = None,
    eos_id: int | None = None,
    early_stopping: bool = True,
    rules: Sequence[Rule] = (),
) -> list[list[Hypothesis]]:
    """Batched beam search (rules in the module docstring): per sentence the n_best hypotheses, best first."""
    _check_beam_args(src, beam_size, min_len, length_penalty_kind, n_best)
    if src.size(0) == 0:
        return []
    bos_id, eos_id = _special_ids(model, bos_id, eos_id)
    k, device = beam_size, src.device
    monotone = length_penalty_kind == "none" or length_penalty == 0

    def score(log_prob: float, length: int) -> float:
        return log_prob / _length_penalty(length, length_penalty, length_penalty_kind)

    def bound(step: int) -> Callable[[float], float] | None:
        if monotone:  # extending a live beam can only lower its score: exact
            return lambda log_prob: log_prob
        return None if early_stopping else lambda log_prob: score(log_prob, step + 1)

    limits = _max_lens(model, src, max_len, eos_id)  # (N,)
    space = _space(model, bos_id, eos_id)
    enc = model.encode(src)
    # Decoder rows are sentence-major: row n*k + j is beam j of active sentence n.
    to_beams = torch.arange(src.size(0), device=device).repeat_interleave(k)  # (N*k,)
    first_rules = space.rules(min_len) + list(rules)
    rules = [rule.select(to_beams) for rule in first_rules]
    # No preallocated capacity: every step's index_select copies the whole buffer, so it grows as it fills.
    cache = model.init_cache(enc)
    # A DecoderCache keeps one row a sentence of cross-attention keys/values, which its beams share (the beams
    # on the query axis); another model's cache gets a row a beam, as does the encoder output for it.
    shared = isinstance(cache, DecoderCache)
    if not shared:
        enc, cache = _select(enc, cache, to_beams)
    live_log_probs = torch.full((src.size(0), k), -math.inf, device=device)  # (N, k)
    live_log_probs[:, 0] = 0.0  # one live beam at first: k copies of BOS would give k equal candidates
    history = src.new_empty((src.size(0) * k, 0))  # (N*k, t) generated tokens of each live beam
    tokens = src.new_full((src.size(0) * (1 if shared else k), 1), bos_id)  # shared: the first step on one beam
    sentences = list(range(src.size(0)))  # the original index of each active sentence
    finished: list[list[Hypothesis]] = [[] for _ in sentences]
    for step in range(int(limits.max())):
        if step == 0 and shared:  # the one live beam of each sentence, then its row copied to its k beams
            at = Step(0, history[::k], space, bos_id)
            log_probs, cache = _next_log_probs(model, tokens, enc, cache, first_rules, at)
            log_probs, cache = log_probs.repeat_interleave(k, dim=0), cache.expand(k)  # (N*k, V)
        else:
            log_probs, cache = _next_log_probs(model, tokens, enc, cache, rules, Step(step, history, space, bos_id))
        at_limit = limits <= step + 1  # (N,)
        cands = _candidates(live_log_probs, log_probs, at_limit, eos_id, space)
        _add_finished(finished, sentences, history, cands, step + 1, score, eos_id)
        live_log_probs, parent, live_tokens = _live_beams(cands)  # (N, k) each
        done = _sentences_done(finished, sentences, live_log_probs, at_limit, bound(step))
        keep_list = [i for i, d in enumerate(done) if not d]
        if not keep_list:
            break
        keep = torch.tensor(keep_list, device=device)  # (N',)
        rows = parent[keep].view(-1)  # (N'*k,) the beams that live on, in their new order
        if len(keep_list) < len(done) and shared:  # the sentences that go on keep their memory and cross K/V
            enc, cache = _select_encoded(enc, keep), cache.index_select(rows, sentences=keep)
        elif len(keep_list) < len(done):  # beams of one sentence share its memory, so `rows` selects it too
            enc, cache = _select(enc, cache, rows)
        else:  # beams only move within their sentence: the cross-attention keys/values stay where they are
            cache = cache.index_select(rows, cross=False)
        rules = [rule.select(rows) for rule in rules]
        tokens = live_tokens[keep].view(-1, 1)  # (N'*k, 1)
        history = torch.cat([history[rows], tokens], dim=1)  # (N'*k, t+1)
        live_log_probs, limits = live_log_probs[keep], limits[keep]
        sentences = [sentences[i] for i in keep_list]
    return [hyps[:n_best] for hyps in finished]


# ---------------------------------------------------------------------------------------------------------
# A Decoding, whole.
# ---------------------------------------------------------------------------------------------------------


def guards(decoding: Decoding, prefixes: list[list[int]], device: torch.device) -> list[Rule]:
    """The rules a Decoding adds to every search's own: repetition guards, then each sentence's forced prefix."""
    rules: list[Rule] = []
    if decoding.no_repeat_ngram_size:
        rules.append(NoRepeatNgram(decoding.no_repeat_ngram_size))
    if decoding.repetition_penalty != 1.0:
        rules.append(RepetitionPenalty(decoding.repetition_penalty))
    if any(prefixes):  # last: a forced token keeps the model's score whatever the rules before it did
        width = max(map(len, prefixes))
        table = torch.full((len(prefixes), width), -1, dtype=torch.long, device=device)  # (B, P)
        for row, ids in enumerate(prefixes):
            table[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        rules.append(ForcedPrefix(table))
    return rules


def search(
    model: Transformer,
    src: Tensor,
    decoding: Decoding,
    prefixes: list[list[int]] | None = None,
    phrases: list[list[list[int]]] | None = None,
) -> list[list[Hypothesis]]:
    """The search or sampling `decoding` asks for: n_best hypotheses a sentence, each starting with its prefix ids
    and containing its target phrases (lexically constrained beam search: nanomt.decoding.constrained)."""
    prefixes = prefixes or [[] for _ in range(src.size(0))]
    d = decoding
    max_len = functools.partial(_budget, d, model.cfg.max_positions)
    longest = max(map(len, prefixes), default=0)
    if longest:
        limits = _max_lens(model, src, max_len, model.cfg.eos_id).tolist()
        over = [(len(p), n) for p, n in zip(prefixes, limits) if len(p) >= n]
        if over:
            raise ValueError(f"a prefix of {over[0][0]} tokens does not fit the length limit ({over[0][1]} tokens)")
    rules = guards(d, prefixes, src.device)
    if d.sampling is not None:
        s = d.sampling
        outs = sample(model, src, max_len, s.temperature, s.top_k, s.top_p, s.seed, d.min_len, rules=rules)
        return [[Hypothesis(o, 0.0, 0.0)] for o in outs]
    if phrases and any(phrases):
        return _with_phrases(model, src, d, max_len, phrases, rules)
    if d.beam_size == 1 and d.n_best == 1:
        return [[Hypothesis(o, 0.0, 0.0)] for o in greedy(model, src, max_len, d.min_len, rules=rules)]
    return beam_search(
        model,
        src,
        d.beam_size,
        max_len,
        min_len=d.min_len,
        length_penalty=d.length_penalty,
        length_penalty_kind=d.length_penalty_kind,
        n_best=d.n_best,
        early_stopping=d.early_stopping,
        rules=rules,
    )


def _with_phrases(
    model: Transformer, src: Tensor, d: Decoding, max_len: MaxLen, phrases: list, rules: list[Rule]
) -> list[list[Hypothesis]]:
    """Sentences with phrases through the constrained search, the others through the plain one, as if alone."""
    from nanomt.decoding.constrained import constrained_beam_search  # it builds on this module

    out: list[list[Hypothesis]] = [[] for _ in phrases]
    settings = (d.min_len, d.length_penalty, d.length_penalty_kind, d.n_best)
    for constrained in (False, True):
        rows = [i for i, p in enumerate(phrases) if bool(p) == constrained]
        if not rows:
            continue
        index = torch.tensor(rows, device=src.device)
        part, part_rules = src.index_select(0, index), [rule.select(index) for rule in rules]
        if constrained:
            chosen = [phrases[i] for i in rows]
            hyps, met = constrained_beam_search(
                model, part, d.beam_size, max_len, chosen, *settings, d.early_stopping, rules=part_rules
            )
            hyps = [h if ok else [dataclasses.replace(x, terms_missed=True) for x in h] for h, ok in zip(hyps, met)]
        else:
            hyps = beam_search(model, part, d.beam_size, max_len, *settings, early_stopping=d.early_stopping,
                               rules=part_rules)  # fmt: skip
        for i, h in zip(rows, hyps):
            out[i] = h
    return out


def _budget(decoding: Decoding, max_positions: int, src_len: int) -> int:
    return decoding.max_len(src_len, max_positions)
