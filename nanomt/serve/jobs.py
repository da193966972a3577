"""The jobs the server's batcher runs: a frozen key (the model, the kind of answer, the decoding settings) that
decides which jobs may share a batch, and one table from each kind to the Translator call that does its work."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from nanomt.core.decoding import Decoding
from nanomt.decoding.translate import Translator


class Kind(enum.Enum):
    """What a job answers for each of its items."""

    TRANSLATE = "translate"  # (text, forced prefix or None) -> a translation
    N_BEST = "n_best"  # documents' units, (text, None) -> hypotheses, best first, unknown source pieces copied
    CONFIDENT = "confident"  # (text, forced prefix or None) -> a Confident
    CONFIDENT_UNITS = "confident_units"  # documents' units, as N_BEST's -> a Confident
    ALIGN = "align"  # a sentence -> its translation and soft alignment (inline markup)
    ATTENTION = "attention"  # one sentence -> its attention, decoded alone

    @property
    def cacheable(self) -> bool:
        """Whether the sentence cache may answer it (an alignment holds the attention, a Confident the words)."""
        return self in (Kind.TRANSLATE, Kind.N_BEST)

    @property
    def remembered(self) -> bool:
        """Whether a correction of the translation memory may answer it."""
        return self is not Kind.ATTENTION


@dataclass(frozen=True)
class JobKey:
    """Jobs with equal keys share a batch. `alone` is a token of its own where a job must be decoded alone: a seeded
    sample (the sampler reseeds every batch) and an attention."""

    model: str
    kind: Kind
    decoding: Decoding
    alone: object = None

    @classmethod
    def of(cls, model: str, kind: Kind, decoding: Decoding) -> JobKey:
        alone = kind is Kind.ATTENTION or decoding.decode_alone
        return cls(model, kind, decoding, object() if alone else None)


def _texts(items: list) -> tuple[list[str], list | None]:
    """(text, prefix) items as texts and their prefixes (None where no item has one)."""
    prefixes = [p for _, p in items]
    return [t for t, _ in items], prefixes if any(prefixes) else None


def _translate(t: Translator, items: list, d: Decoding, max_tokens: int | None) -> list:
    texts, prefixes = _texts(items)
    return t.translate(texts, decoding=d, max_tokens=max_tokens, prefixes=prefixes)


def _n_best(t: Translator, items: list, d: Decoding, max_tokens: int | None) -> list:
    texts, prefixes = _texts(items)
    return t.translate_n_best(texts, decoding=d, max_tokens=max_tokens, prefixes=prefixes, replace_unknowns=True)


def _confident(units: bool) -> Callable:
    def run(t: Translator, items: list, d: Decoding, max_tokens: int | None) -> list:
        texts, prefixes = _texts(items)
        return t.translate_confident(texts, d, max_tokens, prefixes, replace_unknowns=units)  # as documents' n-best

    return run


def _align(t: Translator, items: list, d: Decoding, max_tokens: int | None) -> list:
    return t.alignments(items, d, max_tokens)


def _attention(t: Translator, items: list, d: Decoding, max_tokens: int | None) -> list:
    return [t.attention(items[0], decoding=d)]


WORK: dict[Kind, Callable[[Translator, list, Decoding, int | None], list]] = {
    Kind.TRANSLATE: _translate,
    Kind.N_BEST: _n_best,
    Kind.CONFIDENT: _confident(units=False),
    Kind.CONFIDENT_UNITS: _confident(units=True),
    Kind.ALIGN: _align,
    Kind.ATTENTION: _attention,
}
