"""Documents on the server: paragraphs, HTML and files translated in a worker thread whose model calls are queued,
through the event loop, with every other request's (nanomt.documents.translation does the segmenting and joining)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import Request

from nanomt.core.decoding import Decoding
from nanomt.documents import markup
from nanomt.documents import translation as dt
from nanomt.documents.segmentation import TextTranslation
from nanomt.serve.models import Model


def job_key(kind: str, decoding: Decoding) -> tuple:
    """The batch key of a job: equal kinds and settings share a batch; a seeded sample is a batch of its own."""
    return (kind, decoding, object() if decoding.decode_alone else None)


class Route:
    """One request's way to its translations: through one model, or two through the pivot language, each with its
    decoding settings (the last one gives the n-best lists and alignments)."""

    def __init__(self, server, request: Request, models: list[Model], decodings: list[Decoding]):
        self.server, self.request, self.models, self.decodings = server, request, models, decodings
        self.source = dt.Source.of(models[0].cfg, models[0].tokenizer, models[0].source)

    async def _pivot(self, texts: list[str]) -> list[str]:
        """The texts through every model but the last (the pivot language's translations)."""
        for model, decoding in zip(self.models[:-1], self.decodings):
            key = job_key("translate", decoding)
            texts = await self.server.decode(self.request, model, key, [(t, None) for t in texts])
        return texts

    async def n_best(self, units: list[str]) -> list[list[tuple[str, float]]]:
        """Each unit's hypotheses, best first (the last model's n-best list, unknown source pieces copied)."""
        texts = await self._pivot(units)
        return await self.server.decode(
            self.request, self.models[-1], job_key("n_best", self.decodings[-1]), [(t, None) for t in texts]
        )

    async def align(self, sentences: list[str]) -> list[markup.Alignment]:
        """Each sentence's translation and its alignment to the source; through a pivot, the words align by
        position (two models have no one attention)."""
        if len(self.models) > 1:
            return [markup.Alignment(h[0][0]) for h in await self.n_best(sentences)]
        return await self.server.decode(self.request, self.models[0], job_key("align", self.decodings[-1]), sentences)

    def blocking(self, loop: asyncio.AbstractEventLoop) -> tuple[markup.Translate, Callable]:
        """`align` and `n_best` for a worker thread: each call queued on the event loop, waited for in the thread."""
        run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result()  # noqa: E731
        return (lambda sentences: run(self.align(sentences))), (lambda units: run(self.n_best(units)))

    async def confident(self, units: list[str], kind: str = "confident_units", prefixes=None) -> list:
        """Each unit's best translation with its confidence: the last model's, reading the pivot's translation."""
        texts = await self._pivot(units)
        items = list(zip(texts, prefixes or [None] * len(texts)))
        return await self.server.decode(self.request, self.models[-1], job_key(kind, self.decodings[-1]), items)

    async def paragraphs_confident(self, texts: list[str], split: bool) -> list[tuple[TextTranslation, list]]:
        """`paragraphs` with each text's units and their Confident (dt.Confidences), best translations only."""
        loop = asyncio.get_running_loop()
        run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result()  # noqa: E731
        recorder = dt.Confidences(lambda units: run(self.confident(units)))
        results = await asyncio.to_thread(dt.paragraphs, texts, recorder, self.source, split)
        return [(r, recorder.sentences(r)) for r in results]

    async def paragraphs(self, texts: list[str], split: bool, n_alternatives: int = 0) -> list[TextTranslation]:
        """Texts as documents (split) or as one sentence each; see document_translation.paragraphs."""
        _, n_best = self.blocking(asyncio.get_running_loop())
        return await asyncio.to_thread(dt.paragraphs, texts, n_best, self.source, split, n_alternatives)

    async def html(self, docs: list[str]) -> list[str]:
        """HTML documents with their inline tags put back by alignment."""
        align, n_best = self.blocking(asyncio.get_running_loop())
        return await asyncio.to_thread(dt.html, docs, align, n_best, self.source)

    async def file(self, data: bytes, fmt: str) -> bytes:
        """A file translated into one of the same format (files.FileError when it cannot be)."""
        align, n_best = self.blocking(asyncio.get_running_loop())
        return await asyncio.to_thread(dt.document_file, data, fmt, align, n_best, self.source)
