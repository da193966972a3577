"""Lexically constrained beam search against exhaustive search on probability tables (test_decode's TableModel)."""

import math

import pytest
from test_decode import A, B, C, TableModel, all_hypotheses, penalized, random_table, table_src

from nanomt.core.decoding import Decoding
from nanomt.decoding.constrained import Progress, constrained_beam_search
from nanomt.decoding.search import beam_search, search

MAX_LEN = 4


def contains(tokens: list[int], phrase: list[int]) -> bool:
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def best_containing(stub: TableModel, phrases: list[list[int]], kind: str, alpha: float) -> list:
    """Every sequence the table can write within MAX_LEN that contains every phrase, best score first."""
    found = [
        (penalized(lp, n, kind, alpha), tokens)
        for tokens, lp, n in all_hypotheses(stub, MAX_LEN)
        if all(contains(tokens, p) for p in phrases)
    ]
    return sorted(found, key=lambda x: -x[0])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("phrases", [[[C]], [[B, C]], [[A], [C]], [[C, A], [B]]])
@pytest.mark.parametrize(("kind", "alpha"), [("none", 1.0), ("gnmt", 1.0), ("average", 1.0)])
def test_a_wide_constrained_beam_is_the_best_sequence_with_every_phrase(seed, phrases, kind, alpha):
    stub = TableModel(random_table(seed, MAX_LEN))
    expected = best_containing(stub, phrases, kind, alpha)
    (hyps,), (met,) = constrained_beam_search(
        stub, table_src([2]), 128, MAX_LEN, [phrases], length_penalty=alpha, length_penalty_kind=kind, n_best=3
    )
    assert met and [h.tokens for h in hyps] == [tokens for _, tokens in expected[:3]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected[:3]], abs=1e-5)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("beam", [2, 3, 5])
def test_a_narrow_constrained_beam_writes_every_phrase(seed, beam):
    """Dynamic beam allocation keeps hypotheses that met the phrases: every output contains them."""
    stub = TableModel(random_table(seed, MAX_LEN))
    phrases = [[C, A], [B]]
    (hyps,), (met,) = constrained_beam_search(
        stub, table_src([2]), beam, MAX_LEN, [phrases], length_penalty_kind="none"
    )
    assert met and all(contains(hyps[0].tokens, p) for p in phrases)
    scores = [s for s, _ in best_containing(stub, phrases, "none", 1.0)]
    assert hyps[0].score <= scores[0] + 1e-6  # never better than the exhaustive best


def test_a_phrase_that_cannot_fit_gives_the_unconstrained_result_and_says_so():
    stub = TableModel(random_table(0, MAX_LEN))
    src = table_src([2, 3])
    too_long = [[A, B, C, A, B]]  # five tokens: more than MAX_LEN
    hyps, met = constrained_beam_search(stub, src, 3, MAX_LEN, [too_long, [[C]]], n_best=2)
    assert met == [False, True]
    plain = beam_search(stub, src, 3, MAX_LEN, n_best=2)
    assert [h.tokens for h in hyps[0]] == [h.tokens for h in plain[0]]
    assert contains(hyps[1][0].tokens, [C])
    out = search(stub, src, Decoding(beam_size=3, n_best=2, max_len_a=0, max_len_b=MAX_LEN), None, [too_long, [[C]]])
    assert [h.terms_missed for h in out[0]] == [True, True] and not any(h.terms_missed for h in out[1])


def test_sentences_without_phrases_decode_as_plain_beam_search():
    stub = TableModel(random_table(3, MAX_LEN))
    src = table_src([1, 2, 3])
    d = Decoding(beam_size=3, n_best=3, max_len_a=0, max_len_b=MAX_LEN, length_penalty_kind="none")
    out = search(stub, src, d, None, [[], [[C]], []])
    plain = beam_search(stub, src, 3, MAX_LEN, n_best=3, length_penalty_kind="none")
    assert out[0] == plain[0] and out[2] == plain[2]
    assert contains(out[1][0].tokens, [C])


def test_progress_through_phrases():
    p = Progress(((A, B), (C,)))
    assert (p.count, p.done, p.next_tokens()) == (0, False, {A, C})
    p = p.advance(A)
    assert (p.count, p.next_tokens()) == (1, {A, B, C})
    assert p.advance(C).count == 1  # C met, the A B under way broken
    p = p.advance(B)
    assert (p.count, p.met, p.next_tokens()) == (2, frozenset({0}), {C})
    p = p.advance(C)
    assert p.done and p.count == 3 and p.next_tokens() == set()
    assert p.advance(A) == p  # nothing more to meet
    assert math.isfinite(p.count)
