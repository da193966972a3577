"""Sentence boundaries in running text, by language: nanomt's one use of sentencex (Wikimedia's segmenter)."""

from __future__ import annotations

import re

import sentencex

from nanomt.core.languages import base_code

# Chosen by measurement against pysbd, sentence-splitter and blingfire: docs/sentence-splitting.md.
DEFAULT_LANGUAGE = "en"
# Double quotation marks and guillemets (single ones are apostrophes too; masking them measured worse).
QUOTE_MARKS = '"\u201c\u201d\u201e\u00ab\u00bb\u2039\u203a'
_QUOTES = re.compile(f"[{QUOTE_MARKS}]")


def language_code(lang: str | None) -> str:
    """The language sentencex's rules are looked up by: 'de-DE' -> 'de'; None, '' or 'auto' -> DEFAULT_LANGUAGE."""
    # sentencex knows only bare codes: "de-DE" would silently get English rules ("3. Oktober" ends a sentence).
    # A code without rules of its own falls back inside sentencex, along related languages to English last.
    return base_code(lang) or DEFAULT_LANGUAGE


def sentence_spans(text: str, lang: str | None = None) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, without the whitespace around it; all other text is whitespace."""
    if not text.strip():
        return []
    # sentencex splits nowhere inside quotation marks, so one quotation running over several sentences, or one stray
    # mark, joins everything after it: it sees the marks as spaces (recall 0.97 -> 0.99, precision up too, on news
    # paragraphs: docs/sentence-splitting.md); the marks stay in the text.
    masked = _QUOTES.sub(" ", text)
    segments = sentencex.segment(language_code(lang), masked)
    if "".join(segments) != masked:  # never seen; a segmentation that lost text would lose it for the reader too
        segments = [masked]
    cuts, start = [], 0
    for segment in segments:
        if segment.strip():
            cuts.append(_opening_quotes_in(text, start + len(segment) - len(segment.lstrip())))
        start += len(segment)
    cuts[:1] = [0]  # the first sentence starts the text (and a text of quotation marks only is one sentence)
    spans = []
    for a, b in zip(cuts, cuts[1:] + [len(text)]):
        piece = text[a:b]
        if piece.strip():
            left = a + len(piece) - len(piece.lstrip())
            spans.append((left, left + len(piece.strip())))
    return spans


def _opening_quotes_in(text: str, cut: int) -> int:
    """`cut` moved back over quotation marks that open the sentence starting there (a space before, none after)."""
    while cut > 0 and text[cut - 1] in QUOTE_MARKS and (cut == 1 or text[cut - 2].isspace()):
        cut -= 1
    return cut


def split_sentences(text: str, lang: str | None = None) -> list[str]:
    """The sentences of `text`, each without the whitespace around it."""
    return [text[a:b] for a, b in sentence_spans(text, lang)]
