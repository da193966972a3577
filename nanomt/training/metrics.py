"""Corpus BLEU and chrF through sacreBLEU, with the signatures that make the numbers comparable."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from nanomt.core.tokenizer import language_of


@dataclass(frozen=True)
class Scores:
    """Corpus-level scores and the sacreBLEU signatures they were computed with."""

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int


def _check(hypotheses: list[str], references: list[str]) -> None:
    """Raise ValueError unless there is one reference per hypothesis and at least one pair."""
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses and references differ in length: {len(hypotheses)} hypotheses, {len(references)} references"
        )
    if not hypotheses:
        raise ValueError("cannot score an empty corpus: 0 hypotheses and 0 references")


def score(hypotheses: list[str], references: list[str]) -> Scores:
    """Corpus BLEU (13a, cased) and chrF (sacreBLEU defaults) of hypotheses against one reference each."""
    _check(hypotheses, references)
    # Fresh metric objects: the signature describes the settings of the object that produced the score.
    bleu_metric, chrf_metric = BLEU(), CHRF()
    refs = [list(references)]  # sacreBLEU takes a list of reference streams
    bleu_score = bleu_metric.corpus_score(list(hypotheses), refs)
    chrf_score = chrf_metric.corpus_score(list(hypotheses), refs)
    return Scores(
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        bleu_signature=str(bleu_metric.get_signature()),
        chrf_signature=str(chrf_metric.get_signature()),
        sentences=len(hypotheses),
    )


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (13a tokenization, cased) of hypotheses vs one reference each."""
    _check(hypotheses, references)
    return float(BLEU().corpus_score(list(hypotheses), [list(references)]).score)


# Below this share of distinct translations per distinct source, validation output hardly depends on the source: a
# decoder that learned a language model of the targets and ignores the encoder (docs/distill.md). Every one of
# Multi30k's 1,014 validation references is distinct.
COLLAPSED_BELOW = 0.5


def source_dependence(sources: list[str], hypotheses: list[str]) -> float:
    """Distinct translations per distinct source (1.0: every different source got a translation of its own)."""
    _check(hypotheses, sources)
    return len(set(hypotheses)) / len(set(sources))


def bleu_by_language(sources: list[str], hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """A multilingual validation set's BLEU for each target language, by the >>code<< its sources start with
    ({} where none does)."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for src, hyp, ref in zip(sources, hypotheses, references):
        if (code := language_of(src, None)) is not None:
            hyps, refs = groups.setdefault(code, ([], []))
            hyps.append(hyp)
            refs.append(ref)
    return {code: round(bleu(hyps, refs), 2) for code, (hyps, refs) in groups.items()}
