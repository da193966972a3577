"""Lexically constrained beam search against exhaustive search on probability tables (search_models.TableModel)."""

import math

import pytest
import torch
from conftest import decoding
from search_models import EOS, A, B, C, TableModel, all_hypotheses, penalized, random_table, table_src

from nanomt.core.decoding import Decoding
from nanomt.decoding.beam import beam_search
from nanomt.decoding.constrained import Progress, constrained_beam_search
from nanomt.decoding.search import search
from nanomt.decoding.steps import Targets

MAX_LEN = 4
# Which of the table's ids (PAD, UNK, BOS, EOS, A, B, C) start a word: A is a piece that continues one ("ing").
WORD_START = torch.tensor([False, False, False, True, False, True, True])


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
    d = decoding(MAX_LEN, 128, length_penalty=alpha, length_penalty_kind=kind, n_best=3)
    (hyps,) = constrained_beam_search(stub, table_src([2]), d, Targets(phrases=[phrases]))
    met = bool(hyps)
    assert met and [h.tokens for h in hyps] == [tokens for _, tokens in expected[:3]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected[:3]], abs=1e-5)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("beam", [2, 3, 5])
def test_a_narrow_constrained_beam_writes_every_phrase(seed, beam):
    """Dynamic beam allocation keeps hypotheses that met the phrases: every output contains them."""
    stub = TableModel(random_table(seed, MAX_LEN))
    phrases = [[C, A], [B]]
    d = decoding(MAX_LEN, beam, length_penalty_kind="none")
    (hyps,) = constrained_beam_search(stub, table_src([2]), d, Targets(phrases=[phrases]))
    met = bool(hyps)
    assert met and all(contains(hyps[0].tokens, p) for p in phrases)
    scores = [s for s, _ in best_containing(stub, phrases, "none", 1.0)]
    assert hyps[0].score <= scores[0] + 1e-6  # never better than the exhaustive best


def test_a_phrase_that_cannot_fit_gives_the_unconstrained_result_and_says_so():
    stub = TableModel(random_table(0, MAX_LEN))
    src = table_src([2, 3])
    too_long = [[A, B, C, A, B]]  # five tokens: more than MAX_LEN
    targets = Targets(phrases=[too_long, [[C]]])
    hyps = constrained_beam_search(stub, src, decoding(MAX_LEN, 3, n_best=2), targets)
    met = [bool(h) for h in hyps]  # no hypothesis: the phrases could not be met
    assert met == [False, True]
    plain = beam_search(stub, src, decoding(MAX_LEN, 3, n_best=2))
    out = search(stub, src, Decoding(beam_size=3, n_best=2, max_len_a=0, max_len_b=MAX_LEN), targets)
    assert [h.tokens for h in out[0]] == [h.tokens for h in plain[0]]
    assert contains(hyps[1][0].tokens, [C]) and out[1] == hyps[1]
    assert [h.terms_missed for h in out[0]] == [True, True] and not any(h.terms_missed for h in out[1])


@pytest.mark.parametrize("word_start", [None, WORD_START], ids=["any_end", "whole_words"])
def test_sentences_without_phrases_decode_as_plain_beam_search(word_start):
    stub = TableModel(random_table(3, MAX_LEN))
    src = table_src([1, 2, 3])
    d = Decoding(beam_size=3, n_best=3, max_len_a=0, max_len_b=MAX_LEN, length_penalty_kind="none")
    out = search(stub, src, d, Targets(phrases=[[], [[C]], []], word_start=word_start))
    plain = beam_search(stub, src, decoding(MAX_LEN, 3, n_best=3, length_penalty_kind="none"))
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


# ---------------------------------------------------------------------------------------------------------
# Whole words: a phrase is met only where the token after it starts a word, is punctuation or ends the sentence.
# ---------------------------------------------------------------------------------------------------------


def contains_word(tokens: list[int], phrase: list[int]) -> bool:
    """The phrase occurs in `tokens` followed by a word start (WORD_START) or by the end of the translation."""
    n = len(phrase)
    after = lambda i: i + n == len(tokens) or bool(WORD_START[tokens[i + n]])  # noqa: E731
    return any(tokens[i : i + n] == phrase and after(i) for i in range(len(tokens) - n + 1))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("phrases", [[[C]], [[B, C]], [[A], [C]], [[C, A], [B]]])
@pytest.mark.parametrize(("kind", "alpha"), [("none", 1.0), ("gnmt", 1.0)])
def test_a_wide_constrained_beam_is_the_best_sequence_with_every_phrase_as_whole_words(seed, phrases, kind, alpha):
    stub = TableModel(random_table(seed, MAX_LEN))
    found = [
        (penalized(lp, n, kind, alpha), tokens)
        for tokens, lp, n in all_hypotheses(stub, MAX_LEN)
        if all(contains_word(tokens, p) for p in phrases)
    ]
    expected = sorted(found, key=lambda x: -x[0])
    d = decoding(MAX_LEN, 128, length_penalty=alpha, length_penalty_kind=kind, n_best=3)
    (hyps,) = constrained_beam_search(stub, table_src([2]), d, Targets(phrases=[phrases], word_start=WORD_START))
    assert [h.tokens for h in hyps] == [tokens for _, tokens in expected[:3]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected[:3]], abs=1e-5)


# C is the term's one piece ("▁hound"), A a piece that goes on with its word ("ing"), B a word ("▁the"). The
# likeliest sequence with C is "hounding" (C A: 0.63); as a whole word the best is C EOS (0.07), above B C EOS (0.054).
HOUND = {(): {C: 0.7, B: 0.3}, (C,): {A: 0.9, EOS: 0.1}, (C, A): {EOS: 1.0}, (B,): {C: 0.6, EOS: 0.4}}
HOUND[(B, C)] = {A: 0.6, EOS: 0.3, B: 0.1}


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_a_term_that_would_open_a_longer_word_is_placed_as_a_whole_word(beam):
    stub = TableModel(HOUND)
    src = table_src([2])
    d = decoding(MAX_LEN, beam, length_penalty_kind="none")
    assert beam_search(stub, src, d)[0][0].tokens == [C, A]  # unconstrained: "hounding"
    (anywhere,) = constrained_beam_search(stub, src, d, Targets(phrases=[[[C]]]))
    assert anywhere[0].tokens == [C, A]  # a phrase met by its pieces alone: "hounding" has them
    (whole,) = constrained_beam_search(stub, src, d, Targets(phrases=[[[C]]], word_start=WORD_START))
    assert whole[0].tokens == [C] and whole[0].log_prob == pytest.approx(math.log(0.07))
    (out,) = search(stub, src, d, Targets(phrases=[[[C]]], word_start=WORD_START))
    assert out[0].tokens == [C] and not out[0].terms_missed


def test_progress_waits_for_the_next_token_to_start_a_word():
    p = Progress(((A, B), (C,)), whole_words=True).advance(A).advance(B)
    assert p.pending and p.met == frozenset() and p.count == 2 and not p.done
    q = p.advance(C, starts_word=True)  # A B met; C, written whole, waits in its turn
    assert q.met == frozenset({0}) and q.pending and q.done  # done: the end of the sentence would confirm C
    broken = p.advance(A, starts_word=False)  # "A B" went on as a longer word
    assert broken.met == frozenset() and not broken.done and broken.partial == (0, 1)  # A opens the phrase again
