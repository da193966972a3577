"""Confidence in the server's answers: each text's sentences with their Confident (nanomt.decoding.confident) turned
into the response fields both APIs share, and the min_confidence threshold's marks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import HTTPException

from nanomt.decoding.confident import Confident
from nanomt.documents.translation import text_confidence
from nanomt.serve.schemas import SentenceConfidence, WordProbability

Sentences = Sequence[tuple[str, Confident]]  # a text's (source sentence, its Confident), in order


@dataclass(frozen=True)
class Remembered(Confident):
    """A correction from the translation memory: a person's translation, of which the model made no estimate."""


def from_memory(translation: str) -> Confident:
    """A correction as the Confident of its sentence: no confidence, no raw score (none was computed)."""
    return Remembered(translation, score=0.0, confidence=None, raw=float("nan"))


def modelled(sentences: Sentences) -> list[tuple[str, Confident]]:
    """A text's sentences the model translated (not answered from the translation memory)."""
    return [(s, c) for s, c in sentences if not isinstance(c, Remembered)]


def sentence(source: str, c: Confident, threshold: float | None) -> SentenceConfidence:
    if isinstance(c, Remembered):
        return SentenceConfidence(
            source=source, translation=c.translation, confidence=None, confidence_raw=None, words=[], doubtful=[],
            memory=True,
        )  # fmt: skip
    low = None if threshold is None or c.confidence is None else c.confidence < threshold
    return SentenceConfidence(
        source=source,
        translation=c.translation,
        confidence=None if c.confidence is None else round(c.confidence, 4),
        confidence_raw=round(c.raw, 4),
        words=[WordProbability(word=w, probability=p) for w, p in c.words],
        doubtful=c.doubtful,
        low=low,
    )


def fields(texts: Sequence[Sentences], threshold: float | None, model: str) -> dict:
    """The response fields of texts' confidences: confidence, confidence_raw, calibrated, sentences and, with a
    threshold, low_confidence. A threshold with a model that has no calibration is a 400 naming the model. A
    sentence from the translation memory has no confidence (and is never low): a text's are its other sentences';
    a text all of whose sentences came from it has none (null)."""
    calibrated = all(c.confidence is not None for sentences in texts for _, c in modelled(sentences))
    if threshold is not None and not calibrated:
        raise HTTPException(
            400, f"min_confidence: the model {model} has no calibration to compare with (nanomt calibrate fits one)"
        )
    per_text = [
        text_confidence(modelled(sentences)) if modelled(sentences) or not sentences else (None, None)
        for sentences in texts
    ]
    rows = [[sentence(src, c, threshold) for src, c in sentences] for sentences in texts]
    low = [i for i, row in enumerate(rows) if any(s.low for s in row)] if threshold is not None else None
    return {
        "confidence": [None if conf is None else round(conf, 4) for conf, _ in per_text],
        "confidence_raw": [None if raw is None else round(raw, 4) for _, raw in per_text],
        "calibrated": calibrated,
        "sentences": rows,
        "low_confidence": low,
    }
