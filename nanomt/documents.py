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

import numpy as np

from nanomt.sentences import sentence_spans

# count_tokens(texts) -> the number of source tokens of each text (without EOS), as the model's tokenizer counts.
TokenCounter = Callable[[list[str]], list[int]]
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
_CLAUSE_END = re.compile(r"[,;:\u2013\u2014](?=\s)|[\uff0c\uff1b\uff1a\u3001]")
_WORD = re.compile(r"\S+")
# A line: a run of characters without a line break (every break str.splitlines knows).
_LINE = re.compile(r"[^\n\r\v\f\x1c-\x1e\x85\u2028\u2029]+")
# A SentencePiece piece is at most 16 characters long (max_sentencepiece_length): bounds a window's search.
_MAX_PIECE_CHARS = 16
_SPECIAL_PIECES = frozenset({"<s>", "</s>", "<pad>"})


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
        pieces = [(x, y, k) for x, y, _ in _cut(text, a, b, budget, count)]
        fitted += [(x, y, k) for x, y, _ in pieces if any(c.isalpha() for c in text[x:y])]
        if k not in cut:
            cut.append(k)
    return fitted, cut


def cut_sentence(text: str, max_tokens: int, count_tokens: TokenCounter) -> list[str]:
    """`text` in pieces of at most `max_tokens` tokens (a piece of one character excepted), holding every character
    but the whitespace between them: at clause punctuation where there is some, else between words, else by windows."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    a, b = _stripped(text, 0, len(text))
    if a == b:
        return []
    if count_tokens([text[a:b]])[0] <= max_tokens:
        return [text[a:b]]
    return [text[x:y] for x, y, _ in _cut(text, a, b, max_tokens, count_tokens)]


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
    parts = [_stripped(text, x, y) for x, y in zip(bounds[::2], bounds[1::2])]
    return [(x, y) for x, y in parts if any(c.isalpha() for c in text[x:y])]


def _stripped(text: str, a: int, b: int) -> tuple[int, int]:
    """text[a:b] without the whitespace around it, as (start, end); empty where it is all whitespace."""
    piece = text[a:b]
    left = a + len(piece) - len(piece.lstrip())
    return left, max(left, a + len(piece.rstrip()))


def _cut(text: str, a: int, b: int, budget: int, count: TokenCounter) -> list[tuple[int, int, int]]:
    """(start, end, tokens) pieces of at most `budget` tokens covering text[a:b]'s words, as few as packing allows."""
    # Cut at clause punctuation where there is some, else between words, else by windows of characters.
    chunks = _clauses(text, a, b)
    if len(chunks) < 2:
        chunks = [m.span() for m in _WORD.finditer(text, a, b)]
    if len(chunks) < 2:
        return _windows(text, a, b, budget, count)
    items = []
    for (x, y), n in zip(chunks, count([text[x:y] for x, y in chunks])):
        items += [(x, y, n)] if n <= budget else _cut(text, x, y, budget, count)
    return _verified(text, _pack(items, budget), budget, count)


def _clauses(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """text[a:b] cut after each clause mark, each part without the whitespace around it."""
    cuts = [a] + [m.end() for m in _CLAUSE_END.finditer(text, a, b)] + [b]
    parts = [_stripped(text, x, y) for x, y in zip(cuts, cuts[1:])]
    return [(x, y) for x, y in parts if x < y]


def _pack(items: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """Consecutive items grouped greedily while their summed tokens stay within `budget`."""
    groups, total = [[items[0]]], items[0][2]
    for item in items[1:]:
        if total + item[2] > budget:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += item[2]
    return groups


def _verified(
    text: str, groups: list[list[tuple[int, int, int]]], budget: int, count: TokenCounter
) -> list[tuple[int, int, int]]:
    """Each group as one piece, counted whole; a group over budget (subwords are not additive everywhere) halved."""
    pieces = []
    for group, n in zip(groups, count([text[g[0][0] : g[-1][1]] for g in groups])):
        if n <= budget or len(group) == 1:
            pieces.append((group[0][0], group[-1][1], n))
        else:
            half = len(group) // 2
            pieces += _verified(text, [group[:half], group[half:]], budget, count)
    return pieces


def _windows(text: str, a: int, b: int, budget: int, count: TokenCounter) -> list[tuple[int, int, int]]:
    """text[a:b] (no space or clause mark in it) as the longest character windows of at most `budget` tokens."""
    pieces = []
    while a < b:
        lo, hi = 1, min(b - a, budget * _MAX_PIECE_CHARS)
        n_hi = count([text[a : a + hi]])[0]
        if n_hi <= budget:
            lo, n_lo = hi, n_hi
        else:
            n_lo = count([text[a : a + 1]])[0]  # one character is taken even over budget: the text must advance
            while hi - lo > 1:
                mid = (lo + hi) // 2
                n = count([text[a : a + mid]])[0]
                lo, n_lo, hi = (mid, n, hi) if n <= budget else (lo, n_lo, mid)
        pieces.append((a, a + lo, n_lo))
        a += lo
    return pieces


def replace_unknowns(
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    attention: np.ndarray,
    src_unknown: Sequence[int] = (),
    unk: str = "<unk>",
) -> list[str]:
    """Target pieces with each `unk` the source piece it attends to most, and no unknown source piece dropped."""
    # CTranslate2's replace_unknowns, and more: each unknown source piece (positions `src_unknown`) that no target
    # `unk` took is put in before the target piece attending to it most. `attention` is (T, S): per target piece,
    # weights over the source pieces (Translator.attention's cross weights, one layer, heads averaged);
    # `src_pieces` are surface strings (SentencePiece's encode(..., out_type=str)).
    weights = np.asarray(attention, dtype=np.float64)
    if weights.shape != (len(tgt_pieces), len(src_pieces)):
        expected = (len(tgt_pieces), len(src_pieces))
        raise ValueError(f"attention is {weights.shape}, expected (target pieces, source pieces) = {expected}")
    real = np.array([p not in _SPECIAL_PIECES for p in src_pieces])
    if not real.any():
        return list(tgt_pieces)
    masked = np.where(real, weights, -np.inf)  # (T, S): never align to </s>
    out = list(tgt_pieces)
    taken = set()
    for i, piece in enumerate(tgt_pieces):
        if piece == unk:
            j = int(masked[i].argmax())
            out[i] = src_pieces[j]
            taken.add(j)
    insert_at = {}  # target position -> unknown source positions to put before it
    for j in sorted(set(src_unknown) - taken):
        insert_at.setdefault(int(weights[:, j].argmax()), []).append(j)
    result = []
    for i, piece in enumerate(out):
        result += [_word_piece(src_pieces, j) for j in insert_at.get(i, ())] + [piece]
    return result


def _word_piece(src_pieces: Sequence[str], j: int) -> str:
    """Source piece j, marked as a word's start (▁) where it starts one in the source."""
    starts_word = j == 0 or src_pieces[j - 1] == "\u2581" or src_pieces[j].startswith("\u2581")
    return "\u2581" + src_pieces[j].lstrip("\u2581") if starts_word else src_pieces[j]


def join_pieces(pieces: Sequence[str]) -> str:
    """SentencePiece pieces (▁ marks a word's start) as text, special pieces left out."""
    return "".join(p for p in pieces if p not in _SPECIAL_PIECES).replace("\u2581", " ").strip()


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
        out.append(TextTranslation(hyps[0][0], hyps[0][1], tuple(alts), bool(seg.cut)))
    return out
