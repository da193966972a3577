"""Documents through a model: paragraphs, HTML and files, segmented, every sentence decoded, joined in their shape.

The model is reached through two functions, so that a server can queue their calls with other requests: `n_best`
(units -> each unit's hypotheses, best first) and `align` (sentences -> each one's translation and soft alignment,
for inline markup). `for_translator` builds both from a Translator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nanomt.core.config import Config
from nanomt.core.decoding import Decoding
from nanomt.core.languages import PLACEHOLDERS, language_pair
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.confident import Confident
from nanomt.decoding.rows import src_limit
from nanomt.decoding.translate import Translator
from nanomt.documents import files, markup
from nanomt.documents.segmentation import (
    NBestTranslate,
    TextTranslation,
    TokenCounter,
    alternatives,
    segment,
    translate_texts,
)
from nanomt.documents.sentences import split_sentences


@dataclass(frozen=True)
class Source:
    """What segmenting a model's input needs: the source language, the model's length limit, its token counter."""

    lang: str | None  # sentence rules; None: sentences.DEFAULT_LANGUAGE's
    max_tokens: int
    count_tokens: TokenCounter

    @classmethod
    def of(cls, cfg: Config, tokenizer: Tokenizer, lang: str | None = None) -> Source:
        """A run's source side: its language (`lang`, else its config's), its positions, its tokenizer."""
        code = lang or (language_pair(cfg.data) or (None, None))[0]
        count = lambda texts: [len(ids) for ids in tokenizer.encode_src(texts)]  # noqa: E731
        return cls(None if code in PLACEHOLDERS else code, src_limit(cfg), count)

    def split(self, text: str) -> list[str]:
        return split_sentences(text, self.lang)


def paragraphs(
    texts: Sequence[str], n_best: NBestTranslate, source: Source, split: bool = True, n_alternatives: int = 0
) -> list[TextTranslation]:
    """Each text translated whole: with `split`, as a document (sentences, their spacing and line breaks kept, URLs,
    e-mail addresses, inline code and emojis kept as they are); without, as one sentence. A sentence longer than the
    model's limit is translated in pieces either way (TextTranslation.cut says so); nothing is left out."""
    if split:
        return translate_texts(texts, n_best, source.lang, source.max_tokens, source.count_tokens, n_alternatives)
    texts = list(texts)
    results = n_best(texts) if texts else []
    counts = source.count_tokens(texts) if texts else []
    out = []
    for text, hyps, count in zip(texts, results, counts):
        alts = alternatives([t for t, _ in hyps], n_alternatives)
        out.append(TextTranslation(hyps[0][0], float(hyps[0][1]), tuple(alts), count > source.max_tokens, (text,)))
    return out


def sentences(align: markup.Translate, n_best: NBestTranslate, source: Source) -> markup.Translate:
    """markup's translate function: a sentence that is one unit goes to `align` (its tags are then placed by the
    model's attention); one with URLs, code or emojis inside, or too long for the model, is translated around those
    or in pieces and aligned by position."""

    def run(texts: list[str]) -> list[markup.Alignment]:
        segs = [segment(t, source.lang, source.max_tokens, source.count_tokens) for t in texts]
        whole = [i for i, seg in enumerate(segs) if len(seg.units) == 1 and seg.gaps == ("", "")]
        rest = [i for i in range(len(texts)) if i not in set(whole)]
        out: list[markup.Alignment | None] = [None] * len(texts)
        for i, al in zip(whole, align([texts[i] for i in whole]) if whole else []):
            out[i] = al
        units = [u for i in rest for u in segs[i].units]
        done = iter(n_best(units) if units else [])
        for i in rest:
            out[i] = markup.Alignment(segs[i].join([next(done)[0][0] for _ in segs[i].units]))
        return out

    return run


def html(docs: Sequence[str], align: markup.Translate, n_best: NBestTranslate, source: Source) -> list[str]:
    """HTML documents or fragments: sentences translated whole, inline tags put back by alignment (markup)."""
    return markup.translate_html(list(docs), sentences(align, n_best, source), source.split)


def document_file(
    data: bytes,
    fmt: str,
    align: markup.Translate,
    n_best: NBestTranslate,
    source: Source,
    max_bytes: int | None = None,
    max_chars: int | None = None,
    target: str | None = None,
    progress: files.Progress | None = None,
) -> bytes:
    """A file (files.FORMATS) translated into a file of the same format, its language tags set to `target` (a code;
    None leaves them); files.FileError if it cannot be (past `max_bytes` or `max_chars` of text, each
    files.translate_file's default when None). `progress` hears (sentences done, in all) as it goes."""
    translate = sentences(align, n_best, source)
    return files.translate_file(
        data, fmt, translate, source.split, max_chars=max_chars, max_bytes=max_bytes, target=target, progress=progress
    )


def for_translator(
    translator: Translator, decoding: Decoding | None = None, max_tokens: int | None = None
) -> tuple[markup.Translate, NBestTranslate, Source]:
    """`align`, `n_best` and `source` of a Translator, decoding with `decoding` (default: the checkpoint's); pieces
    the vocabulary lacks are copied into the translations (Translator.translate_n_best's replace_unknowns)."""
    decoding = decoding or translator.default_decoding
    align = lambda texts: translator.alignments(texts, decoding, max_tokens)  # noqa: E731
    n_best = lambda texts: translator.translate_n_best(  # noqa: E731
        texts, decoding=decoding, max_tokens=max_tokens, replace_unknowns=True
    )
    return align, n_best, Source.of(translator.cfg, translator.tokenizer)


class Confidences:
    """An NBestTranslate that decodes through a `confident` function (units -> each one's Confident) and keeps
    what it returned, so that each text's sentences and their confidence can be read once the text is joined."""

    def __init__(self, confident: Callable[[list[str]], list[Confident]]):
        self.confident, self.found = confident, {}

    def __call__(self, units: list[str]) -> list[list[tuple[str, float]]]:
        results = self.confident(units)
        self.found.update(zip(units, results))
        return [[(c.translation, c.score)] for c in results]

    def sentences(self, t: TextTranslation) -> list[tuple[str, Confident]]:
        """A translated text's units with their Confident, in order."""
        return [(unit, self.found[unit]) for unit in t.units]


def text_confidence(sentences: Sequence[tuple[str, Confident]]) -> tuple[float | None, float]:
    """A text's confidence and raw score: its sentences', weighted by their characters (None if any sentence's
    confidence is None: an uncalibrated model). A text without sentences is translated as it is: 1 and 0."""
    if not sentences:
        return 1.0, 0.0
    weights = [max(len(unit), 1) for unit, _ in sentences]
    mean = lambda values: sum(w * v for w, v in zip(weights, values)) / sum(weights)  # noqa: E731
    confidences = [c.confidence for _, c in sentences]
    raw = mean([c.raw for _, c in sentences])
    return (None if None in confidences else mean(confidences)), raw
