"""Text in documents: sentences and their separators, long sentences in pieces, pass-through spans, unknown pieces,
alternatives.

A text becomes a `Segmentation`: the units the model translates (sentences, or pieces of one) and the text kept as it
is between them (whitespace, line breaks, URLs, e-mail addresses, inline code, emojis, parts without a letter), so
that `text == gaps[0] + units[0] + gaps[1] + ... + units[-1] + gaps[-1]` and joining the translations of the units
with the same gaps gives the document back in its shape. Nothing is dropped: every character of the text is in a
unit or a gap. Why pass-through spans are translated around rather than replaced by placeholders, and how the
splitter was chosen: docs/sentence-splitting.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nanomt.decoding.pieces import (
    TokenCounter,
    cut_span,
    stripped,
)
from nanomt.documents.sentences import sentence_spans

# translate(units) -> per unit its hypotheses (text, score), best first: Translator.translate_n_best's shape.
NBestTranslate = Callable[[list[str]], list[list[tuple[str, float]]]]

# Emoji blocks: pictographs, symbols and dingbats (U+2600-27BF), and the few others drawn as emojis by default.
_EMOJI = "\u231a\u231b\u23e9-\u23f3\u23f8-\u23fa\u2600-\u27bf\u2b1b\u2b1c\u2b50\u2b55\U0001f000-\U0001faff"
# Symbols that are text (© ® ™ ‼ ⁉ ℹ arrows, squares) unless an emoji presentation selector (U+FE0F) follows.
_TEXT_SYMBOL = (
    "\u00a9\u00ae\u203c\u2049\u2122\u2139\u2194-\u2199\u21a9\u21aa\u24c2\u25aa-\u25fe\u2934\u2935\u2b05-\u2b07"
)
# What may follow an emoji inside one: text/emoji presentation selectors, skin tones, tag characters (flags of
# regions), and a zero-width joiner with the next emoji (family, profession sequences).
_EMOJI_TAIL = rf"(?:[\ufe0e\ufe0f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f]|\u200d[{_EMOJI}])"
_QUOTES = "\"'`\u201c\u201d\u201e\u2018\u2019\u201a\u00ab\u00bb\u2039\u203a"
_URL_START = r"(?:\b(?:https?|ftp)://|\bwww\.)"
_URL_CHAR = rf"[^\s<>{_QUOTES}]"  # quotation marks around a URL are not part of it
PASS_THROUGH = re.compile(
    "|".join(
        [
            # URLs: a scheme or www., up to whitespace; punctuation that ends a sentence after one is not part of it,
            # a closing parenthesis only where the URL opened one (Wikipedia's links)
            rf"{_URL_START}{_URL_CHAR}*\([^\s()]*\)",
            rf"{_URL_START}{_URL_CHAR}*[^\s<>{_QUOTES}.,;:!?)\]}}]",
            r"\b[\w.%+-]+@[\w-]+(?:\.[\w-]+)+",  # e-mail addresses
            r"(`+)[^`\n](?:[^\n]*?[^`\n])?\1(?!`)",  # inline code, in Markdown's backticks
            rf"(?:[#*0-9]\ufe0f?\u20e3|[{_TEXT_SYMBOL}]\ufe0f|[{_EMOJI}]{_EMOJI_TAIL}*)+",  # emojis, keycaps, runs
        ]
    )
)
# Where a long sentence is cut first: after a comma, semicolon, colon or dash before a space; after ideographic
# clause marks anywhere (no space follows them).
# A line: a run of characters without a line break (every break str.splitlines knows).
_LINE = re.compile(r"[^\n\r\v\f\x1c-\x1e\x85\u2028\u2029]+")


@dataclass(frozen=True)
class Segmentation:
    """A text as `units` to translate and the `gaps` kept between them: gaps[0] + units[0] + ... + gaps[-1]."""

    units: tuple[str, ...]
    gaps: tuple[str, ...]  # len(units) + 1
    sentence_of: tuple[int, ...]  # per unit, its sentence: the pieces of a cut sentence, or of one cut by a span
    cut: tuple[int, ...]  # the sentences longer than the token budget, translated in pieces

    def __post_init__(self):
        if len(self.gaps) != len(self.units) + 1 or len(self.sentence_of) != len(self.units):
            raise ValueError("a segmentation has one gap more than units, and one sentence index a unit")

    def join(self, translations: Sequence[str]) -> str:
        """The translations of the units put back between the gaps (each stripped: the gaps hold the spacing)."""
        if len(translations) != len(self.units):
            raise ValueError(f"{len(translations)} translations for {len(self.units)} units")
        parts = [self.gaps[0]]
        for translation, gap in zip(translations, self.gaps[1:]):
            parts += [translation.strip(), gap]
        return "".join(parts)


def segment(
    text: str, lang: str | None = None, max_tokens: int | None = None, count_tokens: TokenCounter | None = None
) -> Segmentation:
    """`text` as units to translate (sentences, parts between spans, pieces within `max_tokens`) and gaps."""
    # Sentences are found per line by the rules of language `lang`; the parts of a sentence between pass-through spans
    # that hold a letter are units; a unit longer than `max_tokens` tokens (as `count_tokens` counts) is cut.
    if not isinstance(text, str):
        raise ValueError(f"a text must be a string, not {type(text).__name__}")
    if max_tokens is not None and (count_tokens is None or max_tokens < 1):
        raise ValueError(f"max_tokens must be >= 1 and come with count_tokens, got {max_tokens}")
    spans = pass_through_spans(text)
    parts = []  # (start, end, sentence)
    for k, (a, b) in enumerate(_sentences(text, spans, lang)):
        parts += [(x, y, k) for x, y in _translatable(text, a, b, spans)]
    cut: list[int] = []
    if max_tokens is not None and parts:
        parts, cut = _fit(text, parts, max_tokens, count_tokens)
    ends = [0] + [b for _, b, _ in parts]
    starts = [a for a, _, _ in parts] + [len(text)]
    return Segmentation(
        units=tuple(text[a:b] for a, b, _ in parts),
        gaps=tuple(text[e:s] for e, s in zip(ends, starts)),
        sentence_of=tuple(k for _, _, k in parts),
        cut=tuple(cut),
    )


def _fit(
    text: str, parts: list[tuple[int, int, int]], budget: int, count: TokenCounter
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Parts over `budget` tokens cut into pieces (those without a letter stay in the gaps); the cut sentences."""
    fitted, cut = [], []
    for (a, b, k), n in zip(parts, count([text[a:b] for a, b, _ in parts])):
        if n <= budget:
            fitted.append((a, b, k))
            continue
        pieces = [(x, y, k) for x, y, _ in cut_span(text, a, b, budget, count)]
        fitted += [(x, y, k) for x, y, _ in pieces if any(c.isalpha() for c in text[x:y])]
        if k not in cut:
            cut.append(k)
    return fitted, cut


def pass_through_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every URL, e-mail address, inline code and emoji run in `text`, in order."""
    return [m.span() for m in PASS_THROUGH.finditer(text)]


def _sentences(text: str, spans: list[tuple[int, int]], lang: str | None) -> list[tuple[int, int]]:
    """Sentence spans of every line; the splitter sees each pass-through span as one plain word of its length."""
    # "https://example.com/a.b" or "😀" could end a sentence to the splitter: it sees "xxxxxxxxxxxxxxxxxxxxxxx".
    masked = list(text)
    for a, b in spans:
        masked[a:b] = "x" * (b - a)
    masked = "".join(masked)
    found = []
    for line in _LINE.finditer(masked):
        found += [(line.start() + a, line.start() + b) for a, b in sentence_spans(line.group(), lang)]
    return found


def _translatable(text: str, a: int, b: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of text[a:b] between pass-through spans that hold a letter, without the whitespace around them."""
    inside = [(max(a, x), min(b, y)) for x, y in spans if x < b and y > a]
    bounds = [a] + [p for span in inside for p in span] + [b]
    parts = [stripped(text, x, y) for x, y in zip(bounds[::2], bounds[1::2])]
    return [(x, y) for x, y in parts if any(c.isalpha() for c in text[x:y])]


def join_hypotheses(seg: Segmentation, n_best: Sequence[Sequence[tuple[str, float]]]) -> list[tuple[str, float]]:
    """The text's hypotheses, best first: the k-th joins every unit's k-th (or its last), scores summed."""
    # As argos-translate builds a paragraph's hypotheses; a text without units has one: itself, score 0.
    if len(n_best) != len(seg.units):
        raise ValueError(f"{len(n_best)} hypothesis lists for {len(seg.units)} units")
    if any(not hyps for hyps in n_best):
        raise ValueError("every unit needs at least one hypothesis")
    depth = max((len(hyps) for hyps in n_best), default=1)
    out = []
    for k in range(depth):
        chosen = [hyps[min(k, len(hyps) - 1)] for hyps in n_best]
        out.append((seg.join([text for text, _ in chosen]), float(sum(score for _, score in chosen))))
    return out


def alternatives(hypotheses: Sequence[str], n: int) -> list[str]:
    """LibreTranslate's `alternatives`: up to `n` of the texts after the best (hypotheses[0]), repeats left out."""
    if n < 0:
        raise ValueError(f"alternatives must be >= 0, got {n}")
    seen, out = set(hypotheses[:1]), []
    for text in hypotheses[1:]:
        if len(out) == n:
            break
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


@dataclass(frozen=True)
class TextTranslation:
    """One text's translation: its score (summed over its units), alternatives, and whether a sentence was cut."""

    text: str
    score: float
    alternatives: tuple[str, ...]
    cut: bool  # some sentence exceeded the token budget and was translated in pieces, joined here
    units: tuple[str, ...] = ()  # what was decoded, in order: its sentences (a long one in pieces)


def translate_texts(
    texts: Sequence[str],
    translate: NBestTranslate,
    lang: str | None = None,
    max_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
    n_alternatives: int = 0,
) -> list[TextTranslation]:
    """Whole texts translated: every unit of every text in one `translate` call, joined back in each text's shape."""
    # `translate` gives at least n_alternatives + 1 hypotheses a unit where alternatives are asked for.
    segs = [segment(text, lang, max_tokens, count_tokens) for text in texts]
    units = [u for seg in segs for u in seg.units]
    n_best = translate(units) if units else []
    if len(n_best) != len(units):
        raise ValueError(f"translate returned {len(n_best)} results for {len(units)} units")
    out, i = [], 0
    for seg in segs:
        hyps = join_hypotheses(seg, n_best[i : i + len(seg.units)])
        i += len(seg.units)
        alts = alternatives([text for text, _ in hyps], n_alternatives)
        out.append(TextTranslation(hyps[0][0], hyps[0][1], tuple(alts), bool(seg.cut), tuple(seg.units)))
    return out
