"""Documents on the server: paragraphs, HTML and files translated in a pool's thread whose model calls are queued,
through the event loop, with every other request's (nanomt.documents.translation does the segmenting and joining).

A route through the pivot language is that many whole translations, one after the other: each model gets the text
the one before it wrote, as a client sending it on would (segmented, split and cut by its own rules).

A file job's route outlives its request (Route.detach): no deadline bounds the whole file, only each model call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

from fastapi import HTTPException, Request

from nanomt.core.decoding import Decoding
from nanomt.core.languages import PLACEHOLDERS
from nanomt.documents import files, markup
from nanomt.documents import translation as dt
from nanomt.documents.segmentation import TextTranslation
from nanomt.serve.jobs import Kind
from nanomt.serve.models import Model
from nanomt.serve.workers import Expired, wait

BUSY_PAUSE = 0.5  # seconds a detached route waits before it asks again when the decoding queue is full


class Stalled(RuntimeError):
    """A detached route's model call got no answer within its bound (the server is stuck or overloaded)."""


class Hop:
    """One model of a route with its decoding settings, as a pool's thread reaches it: each call queued on the event
    loop with every other request's, waited for until the request's deadline (a detached route's: the call's own)."""

    def __init__(self, route: Route, model: Model, decoding: Decoding, loop: asyncio.AbstractEventLoop, index: int = 0):
        self.route, self.model, self.decoding, self.loop, self.index = route, model, decoding, loop, index
        self.source = dt.Source.of(model.cfg, model.tokenizer, model.source)

    def _call(self, kind: Kind, items: list) -> list:
        route = self.route
        if route.call_seconds is None:
            coro = route.server.decode(route.request, self.model, kind, self.decoding, items)
            return wait(asyncio.run_coroutine_threadsafe(coro, self.loop), route.deadline)
        return self._patient(kind, items, route.call_seconds)

    def _patient(self, kind: Kind, items: list, seconds: float) -> list:
        """A detached route's call: bounded by `seconds` on its own, asked again while the decoding queue is full."""
        route = self.route
        deadline = time.monotonic() + seconds
        while True:
            coro = route.server.decode(route.request, self.model, kind, self.decoding, items)
            try:
                return wait(asyncio.run_coroutine_threadsafe(coro, self.loop), deadline)
            except Expired:
                raise Stalled(f"no translation of {len(items)} sentences within {seconds:g} s") from None
            except HTTPException as e:  # 503: the queue is full (or the server is stopping: that one ends the file)
                if e.status_code != 503 or route.server.engine.closing or time.monotonic() + BUSY_PAUSE > deadline:
                    raise
            time.sleep(BUSY_PAUSE)

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
        self.call_seconds: float | None = None  # a detached route's bound on each model call

    def detach(self, call_seconds: float) -> None:
        """Let the route outlive its request (a file job, run after its POST was answered): no deadline for the
        whole of its work, `call_seconds` for each model call (a chunk of files.CHUNK sentences), which is asked
        again while the decoding queue is full."""
        self.deadline, self.call_seconds = None, call_seconds
        self.request.state.deadline = None  # server.decode's wait in the queue: the call's own bound ends it

    def _hops(self) -> list[Hop]:
        loop = asyncio.get_running_loop()
        return [Hop(self, m, d, loop, i) for i, (m, d) in enumerate(zip(self.models, self.decodings))]

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

    async def file(
        self, data: bytes, fmt: str, max_chars: int | None = None, progress: files.Progress | None = None
    ) -> bytes:
        """A file translated into one of the same format, of at most `max_chars` characters of text (else the
        documents' limit), its language tags set to the target's code: files.FileError when it cannot be.
        `progress(done, total)` hears the sentences done after each chunk (through the pivot, each hop's sentences
        count: hop k of n reports k * its total + its done, of n * its total); raising in it stops the file."""
        limit, hops = self.server.config.files_max_bytes, len(self.models)

        def step(hop: Hop, data: bytes) -> bytes:
            target = None if hop.model.target in PLACEHOLDERS else hop.model.target  # src-tgt names no language
            heard = None
            if progress is not None:
                heard = lambda done, total: progress(hop.index * total + done, hops * total)  # noqa: E731
            return dt.document_file(data, fmt, hop.align, hop.n_best, hop.source, limit, max_chars, target, heard)

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
