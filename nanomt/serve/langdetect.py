"""Language detection for LibreTranslate's `source: auto` and /detect, restricted to the languages the server
translates from: lingua (lingua-language-detector, its models in its wheel), loaded once, on first use.

docs/language-detection.md says why lingua (accuracy on texts of a few words, measured by
benchmarks/experiments/langdetect.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import cache, lru_cache

from nanomt.core.languages import base_code

INSTALL_HINT = "pip install 'nanomt[serve]'"
# LibreTranslate's codes that are no ISO 639-1 code: Traditional Chinese, Brazilian Portuguese; and Norwegian,
# which lingua knows as Bokmål.
ALIASES = {"zt": "zh", "pb": "pt", "no": "nb"}
_lock = threading.Lock()


class LanguageDetectionError(ValueError):
    """Candidates the detector cannot choose among."""


def _lingua():
    try:
        import lingua
    except ImportError:
        raise ImportError(f"language detection needs the lingua-language-detector package: {INSTALL_HINT}") from None
    return lingua


@cache
def _language(code: str):
    """lingua's Language for a served code ('de', 'deu', 'pt-BR', LibreTranslate's 'zt'), or None."""
    base = base_code(code)
    base = ALIASES.get(base, base)
    if base is None:
        return None
    lingua = _lingua()
    try:
        if len(base) == 2:
            return lingua.Language.from_iso_code_639_1(lingua.IsoCode639_1.from_str(base))
        return lingua.Language.from_iso_code_639_3(lingua.IsoCode639_3.from_str(base))
    except ValueError:
        return None


def detectable(candidates: Iterable[str]) -> list[str]:
    """The candidates the detector knows the language of (a toy pair's 'src' is none)."""
    return [c for c in candidates if _language(c) is not None]


@lru_cache(maxsize=64)
def _detector(languages: frozenset):
    """One lingua detector per set of languages (its models are shared between detectors, loaded on first use)."""
    return _lingua().LanguageDetectorBuilder.from_languages(*languages).build()


def preload(candidates: Iterable[str]) -> None:
    """Load the models for these candidates now (at start), rather than on the first request."""
    for code in detectable(candidates):
        detect("preload " + code, candidates)


def detect(text: str, candidates: Iterable[str]) -> list[tuple[str, float]]:
    """(code, confidence 0-100) of each candidate the text may be in, best first, as LibreTranslate's /detect
    answers; [] for text without letters. Candidates the detector does not know are left out."""
    candidates = list(dict.fromkeys(candidates))
    if not candidates:
        raise LanguageDetectionError("no candidate languages to detect")
    if len(candidates) == 1:  # nothing to choose
        return [(candidates[0], 100.0)] if any(ch.isalpha() for ch in text) else []
    known = {c: _language(c) for c in detectable(candidates)}
    if not known:
        raise LanguageDetectionError(f"cannot tell {', '.join(candidates)} apart: no language the detector knows")
    if not any(ch.isalpha() for ch in text):
        return []
    languages = frozenset(known.values())
    if len(languages) == 1:
        confidence = dict.fromkeys(languages, 1.0)
    else:
        with _lock:  # one build of each detector, whichever request comes first
            detector = _detector(languages)
        confidence = {v.language: v.value for v in detector.compute_language_confidence_values(text)}
    order = {c: i for i, c in enumerate(candidates)}
    found = [(c, round(100 * confidence[lang], 2)) for c, lang in known.items()]
    return sorted(found, key=lambda x: (-x[1], order[x[0]]))
