"""nanomt.training.metrics against sacreBLEU's own functions."""

import dataclasses

import pytest
import sacrebleu

from nanomt.training.metrics import Scores, bleu, score

HYPS = [
    "The cat sat on the mat.",
    "A dog is running in the park today.",
    "She reads a book every evening .",
]
REFS = [
    "The cat is sitting on the mat.",
    "A dog runs in the park.",
    "She reads a book every evening.",
]


def test_identical_is_perfect():
    s = score(HYPS, HYPS)
    assert s.bleu == pytest.approx(100.0)
    assert s.chrf == pytest.approx(100.0)
    assert s.sentences == 3
    assert bleu(HYPS, HYPS) == pytest.approx(100.0)


def test_matches_sacrebleu_directly():
    s = score(HYPS, REFS)
    expected_bleu = sacrebleu.corpus_bleu(HYPS, [REFS]).score
    expected_chrf = sacrebleu.corpus_chrf(HYPS, [REFS]).score
    assert 0.0 < s.bleu < 100.0
    assert s.bleu == pytest.approx(expected_bleu, abs=1e-9)
    assert s.chrf == pytest.approx(expected_chrf, abs=1e-9)
    assert bleu(HYPS, REFS) == pytest.approx(expected_bleu, abs=1e-9)


def test_case_matters():
    # Cased BLEU: lowercasing the hypotheses must cost points.
    assert bleu([h.lower() for h in REFS], REFS) < 100.0


def test_signatures():
    s = score(HYPS, REFS)
    assert "tok:13a" in s.bleu_signature
    assert "case:mixed" in s.bleu_signature
    assert "nrefs:1" in s.bleu_signature
    assert "case:mixed" in s.chrf_signature
    assert "nc:6" in s.chrf_signature


def test_scores_frozen():
    s = score(HYPS, REFS)
    assert isinstance(s, Scores)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.bleu = 0.0  # type: ignore[misc]


def test_mismatched_lengths():
    with pytest.raises(ValueError, match=r"3 hypotheses.*2 references"):
        score(HYPS, REFS[:2])
    with pytest.raises(ValueError, match=r"2 hypotheses.*3 references"):
        bleu(HYPS[:2], REFS)


def test_empty_corpus():
    with pytest.raises(ValueError, match="empty"):
        score([], [])
