"""Beam search against an uncached reference written from nanomt/decoding/beam.py's rules, with pruning (k < the
search space).

Two models: a stand-in whose next-token distribution is drawn from (source, prefix), so that each sentence ends by
EOS at its own step and the batch shrinks mid-search (a wrong reorder of the cache or the encoder rows after a
sentence finishes reads another sentence's table), and a tiny random Transformer re-scored by full forward passes.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import zlib
from collections.abc import Callable

import pytest
import torch
from conftest import decoding, max_len_fn, random_transformer
from search_models import PrefixCache

from nanomt.core.config import ModelConfig
from nanomt.core.model import DecoderOutput, Encoded, padding_mask
from nanomt.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nanomt.decoding.beam import beam_search
from nanomt.decoding.steps import Hypothesis

V = 12  # the stand-in's vocabulary: PAD, UNK, BOS, EOS and 8 words
TRANSFORMER_V = 24
LENGTHS = [5, 1, 3, 6, 2, 4]
KINDS = [("none", 1.0), ("gnmt", 0.6), ("average", 1.0), ("gnmt", 0.0)]
MAX_LENS = {"int": 8, "fn": max_len_fn(1.0, 2)}  # fn: budgets 3..8, one per source length

pytestmark = pytest.mark.usefixtures("one_thread")

NextLogProbs = Callable[[list[int]], torch.Tensor]  # generated tokens (no BOS) -> (V,) log-probs


# ---------------------------------------------------------------------------------------------------------
# The reference: one sentence, every prefix re-scored from scratch, the rules of nanomt/decoding/beam.py's docstring.
# ---------------------------------------------------------------------------------------------------------


def penalty(length: int, alpha: float, kind: str) -> float:
    return {"gnmt": ((5 + length) / 6) ** alpha, "average": length**alpha, "none": 1.0}[kind]


def reference_beam_search(
    next_log_probs: NextLogProbs,
    ids: tuple[int, int, int],
    k: int,
    max_len: int,
    min_len: int,
    alpha: float,
    kind: str,
    early_stopping: bool,
) -> list[Hypothesis]:
    """The k kept hypotheses of one sentence, best first; ids = (pad, bos, eos)."""
    pad, bos, eos = ids
    monotone = kind == "none" or alpha == 0
    live: list[tuple[float, list[int]]] = [(0.0, [])]  # (log_prob, tokens) of the live beams, best first
    finished: list[Hypothesis] = []
    for step in range(max_len):
        candidates = []
        for log_prob, tokens in live:
            log_probs = next_log_probs(tokens).clone()
            log_probs[[t for t in (pad, bos) if t != eos]] = -math.inf  # never generated; the rest not renormalized
            if step < min_len:
                log_probs[eos] = -math.inf
            candidates += [(log_prob + x, [*tokens, t]) for t, x in enumerate(log_probs.tolist()) if x > -math.inf]
        candidates = sorted(candidates, key=lambda c: c[0], reverse=True)[: 2 * k]  # the 2k best extensions
        at_limit = step + 1 >= max_len
        ends = [at_limit or tokens[-1] == eos for _, tokens in candidates]
        for (log_prob, tokens), end in zip(candidates[:k], ends[:k]):  # only the best k may finish
            if end:
                kept = tokens[:-1] if tokens[-1] == eos else tokens
                finished.append(Hypothesis(kept, log_prob / penalty(step + 1, alpha, kind), log_prob))
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:k]
        live = [c for c, end in zip(candidates, ends) if not end][:k]
        if at_limit or not live:
            break
        if len(finished) == k:
            best, worst = live[0][0], finished[-1].score
            if monotone and best <= worst:  # extending a beam only lowers its log-prob: nothing can get in
                break
            if not monotone and (early_stopping or best / penalty(step + 1, alpha, kind) <= worst):
                break
    return finished


# ---------------------------------------------------------------------------------------------------------
# Models and their uncached scores.
# ---------------------------------------------------------------------------------------------------------


class SourceTable:
    """Transformer's encode/init_cache/decode over log-probs drawn from (source, prefix); records rows per step."""

    def __init__(self, bos_id: int = BOS_ID, eos_id: int = EOS_ID):
        self.cfg = ModelConfig(V, V, d_model=2, n_heads=1, max_positions=64, bos_id=bos_id, eos_id=eos_id)
        self.rows_per_step: list[int] = []

    def log_probs(self, source: tuple[int, ...], prefix: tuple[int, ...]) -> torch.Tensor:
        """(V,) next-token log-probs: random, with EOS likelier past a length set by the source."""
        g = torch.Generator().manual_seed(zlib.crc32(repr((source, prefix)).encode()))
        logits = torch.randn(V, generator=g) * 1.5
        ends_near = 1 + sum(source) % 5  # each source its own length, so sentences end at different steps
        logits[self.cfg.eos_id] += 1.5 * (len(prefix) - ends_near)
        return logits.log_softmax(dim=-1)

    def encode(self, src: torch.Tensor) -> Encoded:
        return Encoded(src[..., None].float(), padding_mask(src, self.cfg.pad_id))

    def init_cache(self, enc: Encoded, capacity: int = 0) -> PrefixCache:
        return PrefixCache(torch.zeros(enc.memory.size(0), 0, dtype=torch.long))

    def decode(self, tgt: torch.Tensor, enc: Encoded, cache: PrefixCache) -> DecoderOutput:
        assert tgt.shape == (enc.memory.size(0), 1) == (cache.prefixes.size(0), 1)
        prefixes = torch.cat([cache.prefixes, tgt], dim=1)  # (R, t+1)
        self.rows_per_step.append(tgt.size(0))
        # Each row reads its source from the encoder rows it was given: a row moved wrongly reads another's table.
        sources = [tuple(int(x) for x in row if x != self.cfg.pad_id) for row in enc.memory[..., 0].tolist()]
        rows = []
        for source, prefix in zip(sources, prefixes.tolist(), strict=True):
            assert prefix[0] == self.cfg.bos_id and self.cfg.eos_id not in prefix
            rows.append(self.log_probs(source, tuple(prefix[1:])))
        return DecoderOutput(torch.stack(rows)[:, None], PrefixCache(prefixes))  # (R, 1, V)

    def uncached(self, src: torch.Tensor) -> NextLogProbs:
        source = tuple(int(x) for x in src[0] if x != self.cfg.pad_id)
        return lambda tokens: self.log_probs(source, tuple(tokens))


class RowRecorder:
    """A model as it is, recording how many rows each decoding step feeds it."""

    def __init__(self, model):
        self.model, self.rows_per_step = model, []

    def __getattr__(self, name):  # cfg, encode, init_cache, ...
        return getattr(self.model, name)

    def decode(self, tgt, *args, **kwargs):
        self.rows_per_step.append(tgt.size(0))
        return self.model.decode(tgt, *args, **kwargs)

    def uncached(self, src: torch.Tensor) -> NextLogProbs:
        """Full forward passes of the whole prefix: no cache."""
        bos = self.model.cfg.bos_id

        def next_log_probs(tokens: list[int]) -> torch.Tensor:
            with torch.inference_mode():
                return self.model(src, torch.tensor([[bos, *tokens]]))[0, -1].float().log_softmax(dim=-1)

        return next_log_probs


def words_src(lengths: list[int], vocab: int, eos_id: int = EOS_ID, first_word: int = 4) -> torch.Tensor:
    """Random word ids in [first_word, vocab) of the given lengths, each followed by eos_id, right-padded."""
    g = torch.Generator().manual_seed(sum(lengths))
    src = torch.full((len(lengths), max(lengths) + 1), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(first_word, vocab, (n,), generator=g)
        src[i, n] = eos_id
    return src


def transformer(bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> RowRecorder:
    model = random_transformer(4, TRANSFORMER_V)  # its sentences end at different steps under every setting here
    if (bos_id, eos_id) != (BOS_ID, EOS_ID):  # the same network, started from bos_id and ended at eos_id
        model.cfg = dataclasses.replace(model.cfg, bos_id=bos_id, eos_id=eos_id)
        with torch.no_grad():
            model.output.weight[eos_id].mul_(2.0)  # as random_transformer does for its EOS: some end early
    return RowRecorder(model)


def model_and_src(name: str, bos_id: int = BOS_ID, eos_id: int = EOS_ID) -> tuple:
    """The stand-in ('table') or the random Transformer, and a batch of sources for it."""
    # Custom ids: sources of words above both ids, so that BOS_ID and EOS_ID are free to be generated as words.
    first_word = 4 if (bos_id, eos_id) == (BOS_ID, EOS_ID) else max(bos_id, eos_id) + 1
    if name == "table":
        return SourceTable(bos_id, eos_id), words_src(LENGTHS, V, eos_id, first_word)
    return transformer(bos_id, eos_id), words_src(LENGTHS, TRANSFORMER_V, eos_id, first_word)


def check_against_reference(model, src, k, max_len, min_len=0, alpha=1.0, kind="gnmt", early_stopping=True):
    """beam_search on the batch == the reference on each sentence alone: tokens, scores and log-probs."""
    got = beam_search(
        model,
        src,
        decoding(
            max_len,
            k,
            min_len=min_len,
            length_penalty=alpha,
            length_penalty_kind=kind,
            n_best=k,
            early_stopping=early_stopping,
        ),
    )
    cfg = model.cfg
    for i, row in enumerate(src):
        alone = row[row != cfg.pad_id][None]  # (1, S_i)
        n = int(((alone != cfg.pad_id) & (alone != cfg.eos_id)).sum())
        limit = min(max_len(n) if callable(max_len) else max_len, cfg.max_positions)
        ids = (cfg.pad_id, cfg.bos_id, cfg.eos_id)
        want = reference_beam_search(model.uncached(alone), ids, k, limit, min_len, alpha, kind, early_stopping)
        assert [h.tokens for h in got[i]] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in got[i]] == pytest.approx([h.score for h in want], abs=1e-5), f"sentence {i}"
        assert [h.log_prob for h in got[i]] == pytest.approx([h.log_prob for h in want], abs=1e-5), f"sentence {i}"
    return got


def shrinks_mid_search(rows_per_step: list[int]) -> bool:
    """Some sentence left the batch while others were still searched."""
    return any(later < earlier for earlier, later in zip(rows_per_step, rows_per_step[1:]))


# ---------------------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["table", "transformer"])
@pytest.mark.parametrize("max_len", MAX_LENS.values(), ids=MAX_LENS.keys())
@pytest.mark.parametrize("early_stopping", [True, False], ids=["early", "late"])
@pytest.mark.parametrize(("kind", "alpha"), KINDS)
@pytest.mark.parametrize("k", [2, 3, 5])
def test_beam_search_equals_the_uncached_reference(name, k, kind, alpha, early_stopping, max_len):
    model, src = model_and_src(name)
    got = check_against_reference(model, src, k, max_len, 0, alpha, kind, early_stopping)
    assert shrinks_mid_search(model.rows_per_step), model.rows_per_step
    if name == "table" and not callable(max_len):  # sentences end by EOS, at different steps
        assert len({len(hyps[0].tokens) for hyps in got}) >= 3


@pytest.mark.parametrize("name", ["table", "transformer"])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_min_len_equals_the_uncached_reference(name, k):
    model, src = model_and_src(name)
    got = check_against_reference(model, src, k, 8, min_len=3)
    assert all(len(h.tokens) >= 3 for hyps in got for h in hyps)


@pytest.mark.parametrize("name", ["table", "transformer"])
@pytest.mark.parametrize("k", [2, 3])
def test_custom_bos_and_eos_ids_equal_the_reference_from_the_same_ids(name, k):
    model, src = model_and_src(name, bos_id=5, eos_id=7)
    got = check_against_reference(model, src, k, 8)
    assert all(7 not in h.tokens for hyps in got for h in hyps)
    if name == "transformer":  # the ids matter to this model: from BOS_ID to EOS_ID it translates otherwise
        mirror = copy.copy(model.model)  # the same network, started from BOS_ID and ended at EOS_ID
        mirror.cfg = dataclasses.replace(model.cfg, bos_id=BOS_ID, eos_id=EOS_ID)
        other = beam_search(mirror, src, decoding(8, k))
        assert [h[0].tokens for h in other] != [h[0].tokens for h in got]
