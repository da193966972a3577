"""Translations with how far to trust them: each sentence's best translation, its confidence (a calibrated estimate
of its sentence chrF / 100) and each word's probability, from the token scores the search keeps (nanomt.decoding.quality
computes the features, nanomt.decoding.calibration maps them to a confidence)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nanomt.core.decoding import Decoding
from nanomt.core.tokenizer import language_of
from nanomt.decoding import calibration as calib
from nanomt.decoding.calibration import Calibration
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.quality import DOUBTFUL, TokenScores, read_back, word_probabilities
from nanomt.decoding.rows import joined, prepare
from nanomt.decoding.steps import Hypothesis

if TYPE_CHECKING:
    from nanomt.decoding.translate import Translator

log = logging.getLogger("nanomt")


@dataclass(frozen=True)
class Confident:
    """A translation with how far to trust it: its confidence (the calibrated estimate of its sentence chrF / 100;
    None when the model has no calibration), the raw score it comes from, and each word's probability."""

    translation: str
    score: float  # the search's score of the translation (length-penalized log-probability)
    confidence: float | None
    raw: float  # the mean log-probability of its tokens, EOS included
    words: tuple[tuple[str, float], ...] = ()  # (word, probability) in order
    features: dict | None = None  # what `confidence` was estimated from (None for an empty line)

    @property
    def doubtful(self) -> list[str]:
        """The words whose probability is under one half."""
        return [word for word, p in self.words if p < DOUBTFUL]


def load_calibration(directory: Path, weights: Path) -> Calibration | None:
    """A checkpoint's calibration, or None: a damaged file is no calibration, as a missing one is (said once, where a
    confidence is first asked for, rather than as an error in every batch that asks)."""
    try:
        return calib.load(directory, weights)
    except calib.CalibrationError as e:
        log.warning("%s: confidence uncalibrated (run nanomt calibrate)", e)
        return None


@torch.inference_mode()
def translate_confident(
    translator: Translator,
    sentences: list[str],
    decoding: Decoding,
    max_tokens: int | None = None,
    prefixes: list[str] | None = None,
    replace_unknowns: bool = False,
) -> list[Confident]:
    """Each sentence's best translation (as Translator.translate gives it) with its confidence and word
    probabilities, from the token scores the search keeps (a glossary's search keeps none: its translations are read
    back by one teacher-forced pass of the model; nanomt.decoding.quality)."""
    t = translator
    if isinstance(t.model, Ensemble):
        raise ValueError("confidence is one model's estimate: an ensemble has none (translate with one checkpoint)")
    decoding = decoding.replace(n_best=1, token_scores=True)
    prepared = prepare(t.tokenizer, t.cfg, sentences, decoding, prefixes)
    rows = t.decode_rows(prepared, decoding, max_tokens)
    hyps = joined(rows, prepared.sentence_of, len(sentences))
    texts = [[text] for text in t.tokenizer.decode_tgt([h[0].tokens for h in hyps])]
    if replace_unknowns:
        t.restore_unknowns(sentences, [h[:1] for h in hyps], texts, decoding)
    read = token_scores(t, prepared.src, [h[0] for h in rows])  # per row; None: an empty one
    parts: list[list[int]] = [[] for _ in sentences]
    for k, i in enumerate(prepared.sentence_of):
        parts[i].append(k)
    out = []
    for i, h in enumerate(hyps):
        best = h[0]
        if read[parts[i][0]] is None:  # an empty line's empty translation
            out.append(Confident(texts[i][0], best.score, 1.0, 0.0))
            continue
        whole = TokenScores.join([read[k] for k in parts[i]])
        words = [w for k in parts[i] for w in word_list(t, rows[k][0].tokens, read[k])]
        features = whole.features()
        language = [language_of(sentences[i], decoding.target_lang)]  # a multilingual model's fit for it
        confidence = None if t.calibration is None else float(t.calibration.predict([features], language)[0])
        out.append(Confident(texts[i][0], best.score, confidence, whole.mean_log_prob, tuple(words), features))
    return out


def token_scores(t: Translator, src: list[list[int]], best: list[Hypothesis]) -> list[TokenScores | None]:
    """Each row's token scores: the search's, else read back by the model (None for an empty row)."""
    unk = t.tokenizer.unk_id
    out = [TokenScores.of(h, s, unk) if s else None for s, h in zip(src, best)]
    todo = [k for k, (s, r) in enumerate(zip(src, out)) if s and r is None]
    for k, r in zip(todo, read_back(t.model, [src[k] for k in todo], [best[k].tokens for k in todo], unk)):
        out[k] = r
    return out


def word_list(t: Translator, tokens: list[int], read: TokenScores) -> list[tuple[str, float]]:
    """A row's target words, each with its probability (EOS is no word)."""
    words = word_probabilities(t.tokenizer.tgt_pieces(tokens), read.log_probs[: len(tokens)])
    texts = t.tokenizer.decode_tgt([[tokens[k] for k in positions] for positions, _ in words])
    return [(text.strip(), round(p, 4)) for text, (_, p) in zip(texts, words) if text.strip()]
