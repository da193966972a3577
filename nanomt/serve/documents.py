"""Documents on the server: paragraphs, HTML and files translated in a pool's thread whose model calls are queued,
through the event loop, with every other request's (nanomt.documents.translation does the segmenting and joining).

A route through the pivot language is that many whole translations, one after the other: each model gets the text
the one before it wrote, as a client sending it on would (segmented, split and cut by its own rules).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from fastapi import Request

from nanomt.core.decoding import Decoding
from nanomt.documents import markup
from nanomt.documents import translation as dt
from nanomt.documents.segmentation import TextTranslation
from nanomt.serve.jobs import Kind
from nanomt.serve.models import Model
from nanomt.serve.workers import wait


class Hop:
    """One model of a route with its decoding settings, as a pool's thread reaches it: each call queued on the event
    loop with every other request's, waited for until the request's deadline."""

    def __init__(self, route: Route, model: Model, decoding: Decoding, loop: asyncio.AbstractEventLoop):
        self.route, self.model, self.decoding, self.loop = route, model, decoding, loop
        self.source = dt.Source.of(model.cfg, model.tokenizer, model.source)

    def _call(self, kind: Kind, items: list) -> list:
        route = self.route
        coro = route.server.decode(route.request, self.model, kind, self.decoding, items)
        return wait(asyncio.run_coroutine_threadsafe(coro, self.loop), route.deadline)

    def n_best(self, units: list[str]) -> list[list[tuple[str, float]]]:
        """Each unit's hypotheses, best first (unknown source pieces copied)."""
        return self._call(Kind.N_BEST, [(t, None) for t in units])

    def align(self, sentences: list[str]) -> list[markup.Alignment]:
        """Each sentence's translation and its alignment to the source (for inline markup)."""
        return self._call(Kind.ALIGN, sentences)

    def confident(self, units: list[str]) -> list:
        """Each unit's best translation with its confidence (as documents' n-best lists, unknown pieces copied)."""
        return self._call(Kind.CONFIDENT_UNITS, [(t, None) for t in units])


class Route:
    """One request's way to its translations: through one model, or several through the pivot language, each with
    its decoding settings (the last one gives the n-best lists, alignments and confidences)."""

    def __init__(self, server, request: Request, models: list[Model], decodings: list[Decoding]):
        self.server, self.request, self.models, self.decodings = server, request, models, decodings
        self.deadline = server.deadline(request)

    def _hops(self) -> list[Hop]:
        loop = asyncio.get_running_loop()
        return [Hop(self, m, d, loop) for m, d in zip(self.models, self.decodings)]

    async def _each(self, pool, texts, step: Callable, last: Callable | None = None):
        """texts through every hop in turn, each in a thread of `pool`: `step(hop, texts)` gives the next hop's
        texts; the last hop's answer is `last(hop, texts)`'s (step's when None)."""
        hops = self._hops()
        for hop in hops[:-1]:
            texts = await self.server.offload(pool, step, hop, texts, deadline=self.deadline)
        return await self.server.offload(pool, last or step, hops[-1], texts, deadline=self.deadline)

    async def paragraphs(self, texts: list[str], split: bool, n_alternatives: int = 0) -> list[TextTranslation]:
        """Texts as documents (split) or as one sentence each (see documents.translation.paragraphs); a text is cut
        where any hop cut it."""

        def step(hop: Hop, texts: list[str], n: int = 0) -> list[TextTranslation]:
            return dt.paragraphs(texts, hop.n_best, hop.source, split, n)

        cut = [False] * len(texts)

        def through(hop: Hop, texts: list[str]) -> list[str]:
            done = step(hop, texts)
            cut[:] = [c or r.cut for c, r in zip(cut, done)]
            return [r.text for r in done]

        done = await self._each(self.server.pools.documents, texts, through, lambda h, t: step(h, t, n_alternatives))
        return [replace(r, cut=r.cut or c) for r, c in zip(done, cut)]

    async def paragraphs_confident(self, texts: list[str], split: bool) -> list[tuple[TextTranslation, list]]:
        """`paragraphs`, best translations only, with each text's units (the last hop's) and their Confident."""

        def last(hop: Hop, texts: list[str]) -> list[tuple[TextTranslation, list]]:
            recorder = dt.Confidences(hop.confident)
            return [(r, recorder.sentences(r)) for r in dt.paragraphs(texts, recorder, hop.source, split)]

        def step(hop: Hop, texts: list[str]) -> list[str]:
            return [r.text for r in dt.paragraphs(texts, hop.n_best, hop.source, split)]

        return await self._each(self.server.pools.documents, texts, step, last)

    async def html(self, docs: list[str]) -> list[str]:
        """HTML documents with their inline tags put back by alignment."""
        step = lambda hop, docs: dt.html(docs, hop.align, hop.n_best, hop.source)  # noqa: E731
        return await self._each(self.server.pools.documents, docs, step)

    async def file(self, data: bytes, fmt: str, max_chars: int | None = None) -> bytes:
        """A file translated into one of the same format, of at most `max_chars` characters of text (else the
        documents' limit): files.FileError when it cannot be."""
        limit = self.server.config.files_max_bytes

        def step(hop: Hop, data: bytes) -> bytes:
            return dt.document_file(data, fmt, hop.align, hop.n_best, hop.source, limit, max_chars)

        return await self._each(self.server.pools.files, data, step)

    async def sentences(self, texts: list[str], prefixes: list[str | None] | None = None) -> list[str]:
        """Each text as one sentence (nanomt's /translate), through every hop; prefixes are the last hop's."""
        prefixes = prefixes or [None] * len(texts)
        for hop, (model, decoding) in enumerate(zip(self.models, self.decodings)):
            last = hop == len(self.models) - 1
            items = list(zip(texts, prefixes if last else [None] * len(texts)))
            texts = await self.server.decode(self.request, model, Kind.TRANSLATE, decoding, items)
        return texts

    async def confident(self, texts: list[str], prefixes: list[str | None] | None = None) -> list:
        """Each text as one sentence, the last hop's with its confidence (reading the hop before's translation)."""
        if len(self.models) > 1:
            head = Route(self.server, self.request, self.models[:-1], self.decodings[:-1])
            texts = await head.sentences(texts)
        items = list(zip(texts, prefixes or [None] * len(texts)))
        return await self.server.decode(self.request, self.models[-1], Kind.CONFIDENT, self.decodings[-1], items)
