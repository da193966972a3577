"""Beam search: beam 1 is greedy, a hypothesis' score is teacher forcing's with its length penalty, n-best lists,
a wide beam over a probability table is exhaustive search, a beam of two escapes greedy's trap, the stopping rule."""

from __future__ import annotations

import math

import pytest
import search_models
import torch
from conftest import decoding, tokens
from search_models import (
    BOS,
    EOS,
    LENGTHS,
    STOP_TABLE,
    A,
    B,
    C,
    TableModel,
    all_hypotheses,
    make_src,
    penalized,
    random_table,
    table_src,
)

from nanomt.core.model import Transformer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy

model = search_models.model  # the tiny random Transformer, a fixture of this module too

pytestmark = pytest.mark.usefixtures("one_thread")


def teacher_forced_log_prob(model: Transformer, src: torch.Tensor, targets: list[int]) -> float:
    """Sum of log p(target_i | BOS, targets_<i) for one (1, S) sentence."""
    with torch.no_grad():
        logits = model(src, torch.tensor([[BOS, *targets[:-1]]]))[0]  # (T, V)
    return float(logits.log_softmax(-1).gather(1, torch.tensor(targets)[:, None]).sum())


@pytest.mark.parametrize(("kind", "alpha"), [("gnmt", 1.0), ("average", 1.0), ("none", 1.0)])
@pytest.mark.parametrize("min_len", [0, 2])
def test_beam_size_one_equals_greedy(model, kind, alpha, min_len):
    src = make_src(LENGTHS, extra_pad=2)
    hyps = beam_search(model, src, decoding(12, 1, min_len=min_len, length_penalty=alpha, length_penalty_kind=kind))
    assert [h[0].tokens for h in hyps] == tokens(greedy(model, src, decoding(12, min_len=min_len)))


@pytest.mark.parametrize(("kind", "alpha"), [("gnmt", 0.6), ("average", 1.0), ("none", 0.0)])
def test_hypothesis_log_prob_and_score_match_teacher_forcing(model, kind, alpha):
    src = make_src(LENGTHS[:4])
    max_len = 8
    hyps = beam_search(model, src, decoding(max_len, 4, length_penalty=alpha, length_penalty_kind=kind, n_best=4))
    for i, n in enumerate(LENGTHS[:4]):
        for h in hyps[i]:
            ended = len(h.tokens) < max_len  # shorter than the budget: it ended with EOS
            targets = h.tokens + [EOS] if ended else h.tokens
            assert h.log_prob == pytest.approx(
                teacher_forced_log_prob(model, src[i : i + 1, : n + 1], targets), abs=1e-4
            )
            length = len(targets)
            penalty = {"gnmt": ((5 + length) / 6) ** alpha, "average": length**alpha, "none": 1.0}[kind]
            assert h.score == pytest.approx(h.log_prob / penalty, rel=1e-6)


def test_n_best_distinct_and_sorted(model):
    src = make_src(LENGTHS[:4])
    hyps = beam_search(model, src, decoding(10, 5, n_best=5))
    best = beam_search(model, src, decoding(10, 5, n_best=1))
    for sentence, top in zip(hyps, best, strict=True):
        assert len(sentence) == 5
        assert len({tuple(h.tokens) for h in sentence}) == 5
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        assert sentence[0] == top[0]


# ---------------------------------------------------------------------------------------------------------
# On a stand-in model whose next-token distribution is a table (search_models.TableModel).
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("kind", "alpha"), [("none", 1.0), ("gnmt", 0.6), ("gnmt", 2.0), ("average", 1.0), ("average", 0.5)]
)
def test_wide_beam_matches_exhaustive_search(seed, kind, alpha):
    max_len = 4
    stub = TableModel(random_table(seed, max_len))
    # 3^4 sequences cut at max_len + 1 + 3 + 9 + 27 ending with EOS: a beam of 128 keeps them all.
    exhaustive = sorted(
        ((penalized(lp, n, kind, alpha), lp, tokens) for tokens, lp, n in all_hypotheses(stub, max_len)),
        key=lambda x: x[0],
        reverse=True,
    )
    hyps = beam_search(
        stub, table_src([1, 3]), decoding(max_len, 128, length_penalty=alpha, length_penalty_kind=kind, n_best=5)
    )
    for sentence in hyps:
        assert [h.tokens for h in sentence] == [tokens for _, _, tokens in exhaustive[:5]]
        assert [h.score for h in sentence] == pytest.approx([s for s, _, _ in exhaustive[:5]], abs=1e-5)
        assert [h.log_prob for h in sentence] == pytest.approx([lp for _, lp, _ in exhaustive[:5]], abs=1e-5)


# Greedy takes A (0.5) then A (0.36): 0.18. The best sequence is B EOS: 0.4 * 0.9 = 0.36.
GREEDY_TRAP = {(): {A: 0.5, B: 0.4, EOS: 0.1}, (A,): {A: 0.36, B: 0.34, C: 0.3}, (B,): {EOS: 0.9, C: 0.1}}


@pytest.mark.parametrize("kind", ["gnmt", "none"])
def test_beam_two_beats_greedy(kind):
    stub = TableModel(GREEDY_TRAP)
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(4))) == [[A, A]]
    (best,) = beam_search(stub, src, decoding(4, 2, length_penalty_kind=kind))[0]
    assert best.tokens == [B]
    assert best.log_prob == pytest.approx(math.log(0.36))


def test_stopping_rule():
    stub = TableModel(STOP_TABLE)
    src = table_src([2])
    # Without a length penalty the search goes on while a live beam can still beat the worst kept hypothesis.
    hyps = beam_search(stub, src, decoding(4, 2, length_penalty_kind="none", n_best=2))[0]
    assert [h.tokens for h in hyps] == [[], [A, C]]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.5), math.log(0.27)])
    # With alpha > 0 it stops at beam_size finished hypotheses (fairseq's rule), though A C scores higher.
    hyps = beam_search(stub, src, decoding(4, 2, length_penalty=1.0, length_penalty_kind="gnmt", n_best=2))[0]
    assert [h.tokens for h in hyps] == [[], [B]]
