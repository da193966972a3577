"""The app factory: one Server (settings, models, the decoding queue, metrics, keys) and the routes that share it.

Requests wait in one bounded queue for one worker that owns the models and decodes them in batches of one model and
one decoding setting (nanomt/serve/batching.py); /health, /ready and /metrics answer on the event loop, never waiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from nanomt.core.checkpoint import checkpoint_weights
from nanomt.core.decoding import MAX_REQUEST_BEAM, Decoding
from nanomt.decoding import calibration
from nanomt.decoding.translate import Translator
from nanomt.documents import markup
from nanomt.serve import api, apidocs, confidence, libretranslate, openapi, page
from nanomt.serve.access import Access, Client, presented_key, same_key
from nanomt.serve.batching import Batcher, Closed, JobTimeout, QueueFull
from nanomt.serve.bodies import BodyLimit
from nanomt.serve.breaker import Guarded
from nanomt.serve.cache import SentenceCache
from nanomt.serve.corrections import TranslationMemory
from nanomt.serve.errors import add_error_handlers, error, errors
from nanomt.serve.jobs import WORK, JobKey, Kind
from nanomt.serve.metrics import ServerMetrics, add_observer
from nanomt.serve.models import Model, ModelSet
from nanomt.serve.settings import ServeConfig
from nanomt.serve.store import Layout, MemoryStore, Store, open_store
from nanomt.serve.workers import Busy, Expired, Pool, Pools

log = logging.getLogger("nanomt.serve")
STORE_WAIT = 5.0  # seconds a request waits for the store before it goes on without it (the breaker opens)


class Server:
    """What every route shares: the settings, the models, the queue and its worker, the metrics."""

    def __init__(self, config: ServeConfig, models: ModelSet, store: Store | None = None):
        self.config, self.models = config, models
        self.metrics = ServerMetrics(lambda: self.engine.depth())
        models.on_load = lambda m: (self.metrics.loaded.labels(m.name).set(1), self.metrics.loads.labels(m.name).inc())
        models.on_unload = lambda m: self.metrics.loaded.labels(m.name).set(0)
        for m in models.models:
            self.metrics.loaded.labels(m.name).set(int(m.translator is not None))
        budget = config.max_batch_tokens or models.default.cfg.decode.max_tokens
        self.engine = Batcher(
            self.run, budget, config.max_wait_ms / 1000, config.queue_size, self.metrics.batch, shared=config.batching
        )
        self.store = Guarded(store if store is not None else open_store(config.store), not config.limits_fail_closed)
        self._inline = isinstance(self.store.store, MemoryStore)  # microseconds: no thread hop for it
        self.layout = Layout(config.store_namespace)
        cache = SentenceCache(self.store, self.layout, config.cache_size, config.cache_age)
        self.cache = cache if config.cache_size else None
        self.memory = TranslationMemory(self.store, self.layout, config.max_corrections)
        self.pools = Pools()
        self.access = Access(config, self.store, self.layout, self.io)

    def defaults(self, model: Model) -> Decoding:
        """A model's settings for requests that change none: its config's, with the server's beam and glossary (and a
        multilingual run's target-language code)."""
        decode = Decoding.from_config(model.cfg.decode)
        return decode.replace(beam_size=self.beam(model), glossary=self.config.glossary, target_lang=model.code)

    def beam(self, model: Model) -> int:
        return self.config.default_beam or model.cfg.decode.beam_size

    def run(self, key: JobKey, items: list) -> list:
        """Decode one batch in the worker (one thread at a time): the work of the key's kind (jobs.WORK)."""
        model = next(m for m in self.models.models if m.name == key.model)
        return WORK[key.kind](self.models.translator(model), items, key.decoding, self.config.max_batch_tokens)

    async def decode(self, request: Request, model: Model, kind: Kind, decoding: Decoding, items: list) -> list:
        """The results for `items` of `model`: corrections from the translation memory, then the sentence cache,
        the rest decoded with others of the same key (or a 503 or 504) and cached."""
        request.state.sentences = getattr(request.state, "sentences", 0) + len(items)
        if not items:  # e.g. an HTML document of tags only
            return []
        key = JobKey.of(model.name, kind, decoding)
        results = [None] * len(items)
        if self.config.suggestions and kind.remembered:
            await self._remembered(request, model, kind, items, results)
        keys = [None] * len(items)
        if self.cache is not None and kind.cacheable and decoding.sampling is None:  # a sample is drawn afresh
            keys = await self._cached(request, model, key, items, results)
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            decoded = await self._decode(key, model, [items[i] for i in todo], request)
            for i, value in zip(todo, decoded):
                results[i] = value
            stored = [(keys[i], results[i]) for i in todo if keys[i] is not None]
            if stored:
                await self.io(self.cache.put_many, stored, fallback=None)
        return results

    async def _remembered(self, request: Request, model: Model, kind: Kind, items: list, results: list) -> None:
        """Fill `results` with the served corrections of the items (those without a forced prefix)."""
        pairs = [(item, None) if isinstance(item, str) else item for item in items]  # (text, forced prefix)
        unforced = [i for i, (_, prefix) in enumerate(pairs) if prefix is None]
        sources = [pairs[i][0] for i in unforced]
        found = await self.io(self.memory.find_many, model.name, sources, fallback=[None] * len(sources))
        as_result = {
            Kind.TRANSLATE: lambda t: t,
            Kind.N_BEST: lambda t: [(t, 0.0)],
            Kind.ALIGN: markup.Alignment,  # its tags placed by position: a person's translation has no attention
            Kind.CONFIDENT: confidence.from_memory,
            Kind.CONFIDENT_UNITS: confidence.from_memory,
        }[kind]
        for i, correction in zip(unforced, found):
            if correction is not None:
                results[i] = as_result(correction)
                request.state.from_memory = getattr(request.state, "from_memory", set()) | {pairs[i][0]}
                self.metrics.memory_hits.inc()

    async def _cached(self, request: Request, model: Model, key: JobKey, items: list, results: list) -> list:
        """Fill `results` from the sentence cache; each item's cache key (None where a correction answered it)."""
        fingerprint, setting = await self.fingerprint(model), f"{key.kind.value}:{key.decoding!r}"
        client = getattr(request.state, "client", None)
        partition = client.id if self.config.cache_per_key and client is not None else ""
        keys = [None] * len(items)
        todo = [i for i, r in enumerate(results) if r is None]
        for i in todo:
            keys[i] = self.cache.key(fingerprint, model.name, setting, *items[i], partition)
        found = await self.io(self.cache.get_many, [keys[i] for i in todo], fallback=[None] * len(todo))
        for i, value in zip(todo, found):
            if value is not None:
                results[i] = value if key.kind is Kind.TRANSLATE else [tuple(h) for h in value]
        hits = sum(v is not None for v in found)
        self.metrics.cache_hits.inc(hits)
        self.metrics.cache_misses.inc(len(todo) - hits)
        return keys

    def deadline(self, request: Request) -> float | None:
        """When the request's time (--timeout) runs out, in time.monotonic(): every wait of its work ends there."""
        if not hasattr(request.state, "deadline"):
            timeout = self.config.timeout
            request.state.deadline = None if timeout is None else time.monotonic() + timeout
        return request.state.deadline

    def too_late(self) -> HTTPException:
        return HTTPException(504, f"not translated within the server's timeout of {self.config.timeout:g} s")

    async def offload(self, pool: Pool, fn, *args, deadline: float | None):
        """fn(*args) in a thread of `pool`: a 503 when the pool is full, a 504 past the deadline."""
        try:
            return await pool.run(fn, *args, deadline=deadline)
        except Busy as e:
            raise HTTPException(503, f"server busy: {e}", headers={"Retry-After": "1"}) from None
        except Expired:
            raise self.too_late() from None

    async def io(self, fn, *args, fallback):
        """fn(*args) on the store: in a thread of the store's pool (a network or disk round trip), or here for the
        memory store; `fallback` when the store does not answer within STORE_WAIT seconds."""
        if self._inline:
            return fn(*args)
        try:
            return await self.pools.store.run(fn, *args, deadline=time.monotonic() + STORE_WAIT)
        except (Busy, Expired) as e:
            self.store.trip(f"no answer within {STORE_WAIT:g} s ({e})")
            return fallback

    async def fingerprint(self, model: Model) -> str:
        """The model's fingerprint (weights, tokenizer, shortlist), computed once, off the event loop."""
        owner = model.owner or model  # a multilingual run's targets share its weights' fingerprint
        if owner.fingerprint is None:
            await self.offload(self.pools.work, self.models.fingerprint, model, deadline=None)
        return owner.fingerprint

    def stalled(self) -> str | None:
        """Why the server cannot make progress (a batch or a pool's task stuck past --timeout), or None."""
        stall = self.config.timeout or 60.0
        if self.engine.stalled(stall):
            return f"no progress: the decoder has been on one batch, or a job has waited, for {stall:g} s"
        pools = self.pools.stalled(stall)
        return f"no progress: work has waited {stall:g} s for a thread ({', '.join(pools)})" if pools else None

    async def _decode(self, key: JobKey, model: Model, items: list, request: Request) -> list:
        texts = [item if isinstance(item, str) else item[0] for item in items]
        tokens = sum(len(ids) + 1 for ids in model.tokenizer.encode_src(texts))  # +1: EOS
        deadline = self.deadline(request)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            job = self.engine.submit(key, items, tokens, timeout)
        except QueueFull as e:
            raise HTTPException(503, f"server busy: {e}", headers={"Retry-After": "1"}) from None
        except Closed as e:
            raise HTTPException(503, str(e), headers={"Retry-After": "5"}) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout)
        except (asyncio.TimeoutError, JobTimeout):
            job.future.cancel()  # not decoded yet: dropped from every later batch
            raise self.too_late() from None

    @property
    def key_required(self) -> bool:
        return self.access.key_required

    async def check_key(self, request: Request, given: str | None, chars: int = 0) -> Client:
        """The request's client, or its 403, 413, 429 or 503 (nanomt.serve.access.Access.admit)."""
        return await self.access.admit(request, given, chars)


def check_calibrated(models: ModelSet) -> None:
    """ValueError naming the first model without a calibration (--min-confidence compares with one)."""
    for m in models.models:
        if m.translator is not None:
            found = m.translator.calibration is not None
        else:
            weights = checkpoint_weights(m.path)
            found = calibration.load(weights.parent, weights) is not None
        if not found:
            raise ValueError(f"--min-confidence: the model {m.name} has no calibration (nanomt calibrate fits one)")


def create_app(
    models: Translator | ModelSet, config: ServeConfig | None = None, store: Store | None = None, **settings
) -> FastAPI:
    """The FastAPI app serving `models` (one Translator, or a ModelSet): nanomt's API, LibreTranslate's, the page,
    /health, /ready, /metrics. `settings` change fields of `config` (default ServeConfig()); `store` is the open
    store (default: the one config.store names)."""
    config = dataclasses.replace(config or ServeConfig(), **settings)
    if isinstance(models, ModelSet):
        model_set = models
    else:
        model_set = ModelSet.of(models, config.languages)
    if config.min_confidence is not None:
        check_calibrated(model_set)
    server = Server(config, model_set, store)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine.start()
        yield
        # uvicorn got here after the requests in flight were answered: finish the queue, stop.
        await asyncio.to_thread(server.engine.close, 60)
        server.pools.close()
        log.info("queue drained, decoder stopped")

    app = FastAPI(
        title="nanomt",
        description="Translate with nanomt Transformers and inspect their attention. POST /translate also speaks "
        "LibreTranslate's API (q, source, target, format, api_key), as do GET /languages and POST /detect.",
        lifespan=lifespan,
        docs_url=None,  # nanomt.serve.apidocs serves Swagger UI itself, without a CDN
        redoc_url=None,
        openapi_url=None if config.no_docs else "/openapi.json",
    )
    add_error_handlers(app)
    api.add_routes(app, server)
    libretranslate.add_routes(app, server)
    _add_probes(app, server)
    page.add_routes(app, config.files_max_bytes)
    openapi.describe(app, server)
    if not config.no_docs:
        apidocs.add_routes(app)
    app.add_middleware(BodyLimit, limit=config.body_limit)  # inside the observer, which counts its 413s
    add_observer(app, server.metrics)
    app.state.server, app.state.engine, app.state.metrics = server, server.engine, server.metrics
    return app


def _model_info(model: Model) -> dict:
    """What a client may want to know about a model behind the server."""
    m = model.cfg.model
    info = {k: getattr(m, k) for k in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers")}
    info.update(src_vocab_size=m.src_vocab_size, tgt_vocab_size=m.tgt_vocab_size, max_positions=m.max_positions)
    t = model.translator
    info.update(device=str(t.device) if t else None, int8=t.int8 if t else None, loaded=t is not None)
    return info


def _add_probes(app: FastAPI, server: Server) -> None:
    """/health, /ready and /metrics: answered on the event loop, never waiting for a model."""
    config = server.config

    @app.get("/health")
    async def health() -> dict:
        """Liveness and the models (the first one's details as `model`, the pair nanomt's API defaults to)."""
        first = server.models.default
        return {
            "status": "ok",
            "model": _model_info(first),
            "models": [{"pair": m.name, **_model_info(m)} for m in server.models.models],  # no paths: anyone reads it
            "default_beam": server.beam(first),
            "limits": {
                "max_sentences": config.max_sentences,
                "max_chars": config.max_chars,
                "max_beam": MAX_REQUEST_BEAM,
            },
            "languages": {"source": first.source, "target": first.target},
            "api_key_required": server.key_required,
            "store": {"url": server.store.url, "reachable": not server.store.down},
        }

    @app.get("/ready", responses=errors(503))
    async def ready() -> JSONResponse:
        """Readiness: the worker runs and the queue has room (else a 503)."""
        engine = server.engine
        if engine.closing or not engine.alive():
            return error(503, "not ready: shutting down" if engine.closing else "not ready: decoder not running")
        if engine.full():
            return error(503, "not ready: the queue is full", headers={"Retry-After": "1"})
        stalled = server.stalled()
        if stalled is not None:
            return error(503, f"not ready: {stalled}", headers={"Retry-After": "5"})
        return JSONResponse({"status": "ready", "queue_depth": engine.depth()})

    @app.get("/metrics", include_in_schema=False)
    async def metrics_(request: Request) -> Response:
        """Prometheus metrics (text exposition format); with --metrics-key, for that key only (Bearer)."""
        key = config.metrics_key
        presented = presented_key(request, None)
        if key is not None and not (presented and same_key(presented, key)):
            return error(403, "the metrics need the server's --metrics-key (the header Authorization: Bearer KEY)")
        return Response(server.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
