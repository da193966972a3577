"""The steps every search shares, each written once: where it picks (the search space), the next token's scores with
every rule applied (the one place scores are masked), the rows it keeps, each sentence's length budget, and the score
and stopping bound of a finished hypothesis. greedy, sample, beam and constrained build on these, never on each other's
insides; search (nanomt.decoding.search) picks one of them for a Decoding.

Conventions shared by every search:
- `src` is (B, S) ids, right-padded with `model.cfg.pad_id`, each sentence ending with EOS; the decoder starts from
  `model.cfg.bos_id`. Returned token lists exclude BOS and EOS.
- A sentence's budget (`Decoding.max_len` of its source tokens, EOS and padding not counted, capped at the decoder's
  positions) counts the generated tokens INCLUDING the final EOS: a hypothesis that reaches it without EOS is finished
  as it is (no EOS).
- The scores go through the Decoding's rules (rules.rules_for: PAD and BOS never generated, EOS blocked before the
  minimum length, repetition guards, a forced prefix) at one place, `next_log_probs`.
- Log-probs are the model's own (log_softmax in float32); masking a token does not renormalize the others.
- Everything runs under `torch.inference_mode()`. The train/eval mode is left alone: call `model.eval()` first.
- Sentences that have finished are dropped from the batch (cache and memory rows `index_select`-ed away).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding
from nanomt.core.model import DecoderCache, Encoded, Transformer
from nanomt.decoding.rules import Rule, Step, rules_for


@dataclass(frozen=True)
class Hypothesis:
    """One finished output: tokens without BOS/EOS, length-penalized score, total log-prob."""

    tokens: list[int]
    score: float
    log_prob: float  # sum of the token log-probs, EOS included when the hypothesis ended with it
    terms_missed: bool = False  # a glossary's terms could not all be placed: the unconstrained search's output
    # With Decoding.token_scores: each token's log-prob and its distribution's entropy (EOS's last, if it ended)
    token_log_probs: tuple[float, ...] = ()
    entropies: tuple[float, ...] = ()


@dataclass(frozen=True)
class Targets:
    """What each sentence's translation must hold: a forced prefix and phrases (ids), and where a phrase may end."""

    prefixes: Sequence[Sequence[int]] = ()  # per sentence, the ids its translation starts with; (): none at all
    phrases: Sequence[Sequence[Sequence[int]]] = ()  # per sentence, the ids of each phrase it contains; (): none
    # (V,) True where an id starts a new word or is punctuation (and at EOS): a phrase is met only when the token after
    # it is one of these, so that a term is a whole word. None: a phrase is met as soon as its last token is written.
    word_start: Tensor | None = None

    def select(self, rows: Sequence[int]) -> Targets:
        """The targets of the sentences `rows`, in that order."""
        prefixes = [self.prefixes[i] for i in rows] if self.prefixes else ()
        phrases = [self.phrases[i] for i in rows] if self.phrases else ()
        return Targets(prefixes, phrases, self.word_start)


class SearchSpace(NamedTuple):
    """The scores decoding picks from: one per id, or one per id a pruned model scores (position p: ids[p])."""

    ids: Tensor | None  # (K,) the id at each position; None: positions are ids
    banned: list[int]  # positions never picked: PAD and BOS (unless one of them is also EOS)
    eos: int | None  # EOS's position; None: the model never scores it
    index: Tensor | None  # (V,) each id's position, -1 where not scored; None: positions are ids

    def to_ids(self, positions: Tensor) -> Tensor:
        return positions if self.ids is None else self.ids[positions]

    def positions(self, ids: Tensor) -> Tensor:
        return ids if self.index is None else self.index[ids]


def search_space(model: Transformer, kept_only: bool = True) -> SearchSpace:
    """Where decoding picks: a `prune_output` copy's K scores (kept_only), else all V ids."""
    eos_id = model.cfg.eos_id
    banned = sorted({model.cfg.pad_id, model.cfg.bos_id} - {eos_id})
    if not (kept_only and getattr(model, "pruned", False)):  # an Ensemble scores all ids
        return SearchSpace(None, banned, eos_id, None)
    # A log_softmax and top-k over the K scores the pruned projection computes, rather than over V with -inf at
    # the others: no (R, V) row to fill and scatter into at every step, and the same log-probs (-inf adds 0).
    position = {i: p for p, i in enumerate(model.output_ids.tolist())}
    banned = sorted(position[i] for i in banned if i in position)
    index = torch.full((model.cfg.tgt_vocab_size,), -1, dtype=torch.long, device=model.output_ids.device)
    index[model.output_ids] = torch.arange(len(position), device=index.device)
    return SearchSpace(model.output_ids, banned, position.get(eos_id), index)


def next_log_probs(
    model: Transformer,
    tokens: Tensor,
    enc: Encoded,
    cache: DecoderCache,
    rules: list[Rule],
    step: Step,
    normalize: bool = True,
    keep_raw: bool = False,
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
    if keep_raw or any(rule.needs_raw for rule in rules):  # keep_raw: the model's own scores, for token_scores
        step.raw = scores.clone()
    for rule in rules:
        rule.apply(scores, step)
    return scores, out.cache


def entropy(log_probs: Tensor) -> Tensor:
    """(R,) the entropy of each row's distribution, given as log-probs (R, V) with -inf where masked."""
    # A masked id gives 0 * -inf = nan: nansum leaves it out (no copy of the scores with the -inf replaced).
    return -(log_probs.exp() * log_probs).nansum(-1)


def recorded(seq: list[int], log_probs: list[float], entropies: list[float], eos_id: int, budget: int) -> dict:
    """A generated row's Hypothesis fields: its tokens before EOS, and (if kept) the scores of those and of EOS."""
    tokens = until_eos(seq, eos_id)
    if not log_probs:
        return {"tokens": tokens}
    n = len(tokens) + 1 if len(tokens) < budget else len(tokens)  # EOS's scores too, where it was generated
    lps = tuple(log_probs[:n])
    return {"tokens": tokens, "log_prob": float(sum(lps)), "token_log_probs": lps, "entropies": tuple(entropies[:n])}


def select_encoded(enc: Encoded, index: Tensor) -> Encoded:
    """Keep/reorder batch rows of the encoder output."""
    return Encoded(enc.memory.index_select(0, index), enc.src_mask.index_select(0, index))


def select_rows(enc: Encoded, cache: DecoderCache, index: Tensor) -> tuple[Encoded, DecoderCache]:
    """Keep/reorder batch rows of the encoder output and the decoder cache."""
    return select_encoded(enc, index), cache.index_select(index)


def budgets(model: Transformer, src: Tensor, decoding: Decoding) -> Tensor:
    """(B,) each sentence's budget of generated tokens (EOS included), capped at the decoder's positions."""
    # The last generated token is never fed back, so max_len tokens need max_len decoder positions.
    src_lens = ((src != model.cfg.pad_id) & (src != model.cfg.eos_id)).sum(dim=1).tolist()
    return torch.tensor([decoding.max_len(n, model.cfg.max_positions) for n in src_lens], device=src.device)


def score(log_prob: float, length: int, decoding: Decoding) -> float:
    """A finished hypothesis' score: its log-prob over the length penalty."""
    return log_prob / decoding.penalty(length)


def bound(decoding: Decoding, step: int) -> Callable[[float], float] | None:
    """The score a live beam's log-prob is taken to reach at best after `step`; None: stop at k finished."""
    if decoding.length_penalty_kind == "none" or decoding.length_penalty == 0:
        return lambda log_prob: log_prob  # extending a live beam can only lower its score: exact
    return None if decoding.early_stopping else lambda log_prob: score(log_prob, step + 1, decoding)


def check_src(src: Tensor) -> None:
    """Raise ValueError unless `src` is a (B, S) batch of ids."""
    if src.dim() != 2:
        raise ValueError(f"src must be (B, S) token ids, got shape {tuple(src.shape)}")


Search = Callable[[Transformer, Tensor, Decoding, Targets | None], list[list[Hypothesis]]]


def on_rows(search: Search, model: Transformer, src: Tensor, decoding: Decoding, targets: Targets, rows: list[int]):
    """`search` on the sentences `rows` of the batch, as if they were a batch of their own."""
    index = torch.tensor(rows, device=src.device)
    return search(model, src.index_select(0, index), decoding, targets.select(rows))


def until_eos(tokens: list[int], eos_id: int) -> list[int]:
    """The tokens before the first EOS."""
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def generate(
    model: Transformer,
    src: Tensor,
    decoding: Decoding,
    targets: Targets,
    pick: Callable[[Tensor], Tensor],
    kept_only: bool = True,
) -> list[list[Hypothesis]]:
    """Extend each sentence by the token `pick` chooses from its masked logits until EOS or its budget."""
    bos_id, eos_id = model.cfg.bos_id, model.cfg.eos_id
    limits = budgets(model, src, decoding)  # (B,)
    space = search_space(model, kept_only)
    rules = rules_for(decoding, space, targets.prefixes, src.device)
    enc = model.encode(src)
    cache = model.init_cache(enc, capacity=int(limits.max()))  # room for every step: no cache regrowth
    rows = torch.arange(src.size(0), device=src.device)  # (R,) the sentence of each active row
    # Positions never written stay EOS, so a sentence's output is its row up to the first EOS.
    out = src.new_full((src.size(0), int(limits.max())), eos_id)  # (B, L)
    scores = out.new_zeros((2, *out.shape), dtype=torch.float32) if decoding.token_scores else None  # (2, B, L)
    tokens = src.new_full((src.size(0), 1), bos_id)  # (R, 1)
    for step in range(out.size(1)):
        # Unnormalized: argmax and softmax sampling give the same tokens from log-probs and from logits.
        at = Step(step, out[rows, :step], space, bos_id)
        logits, cache = next_log_probs(
            model, tokens, enc, cache, rules, at, normalize=False, keep_raw=scores is not None
        )
        picked = pick(logits)  # (R,) positions in the search space
        next_tokens = space.to_ids(picked)  # (R,)
        out[rows, step] = next_tokens
        if scores is not None:  # the model's log-probs, before any rule masked or changed them (as beam search's)
            log_probs = at.raw.log_softmax(-1)  # (R, V)
            scores[0, rows, step] = log_probs.gather(1, picked[:, None]).squeeze(1)
            scores[1, rows, step] = entropy(log_probs)
        alive = (next_tokens != eos_id) & (limits[rows] > step + 1)  # (R,)
        if not alive.all():
            keep = alive.nonzero().squeeze(1)  # (R',)
            if keep.numel() == 0:
                break
            rows, next_tokens = rows[keep], next_tokens[keep]
            enc, cache = select_rows(enc, cache, keep)
            rules = [rule.select(keep) for rule in rules]
        tokens = next_tokens[:, None]  # (R, 1)
    kept = scores.tolist() if scores is not None else [[[]] * out.size(0)] * 2
    rows_out = zip(out.tolist(), kept[0], kept[1], limits.tolist())
    return [
        [Hypothesis(**{"score": 0.0, "log_prob": 0.0, **recorded(seq, lps, ents, eos_id, n)})]
        for seq, lps, ents, n in rows_out
    ]
