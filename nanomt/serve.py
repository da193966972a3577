"""HTTP JSON API and a web page: translate sentences and look at their cross-attention.

Two request shapes share POST /translate: nanomt's own ({"text": [...]}) and LibreTranslate's ({"q": ..., "source",
"target"}, as JSON or a form). Requests wait in a bounded queue for one worker that decodes them in shared batches
(nanomt/batching.py); /health, /ready and /metrics answer on the event loop, never waiting for the model.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import math
import os
import re
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import parse_qsl

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanomt.batching import Batch, Batcher, Closed, JobTimeout, QueueFull
from nanomt.decoding import Decoding
from nanomt.glossary import Glossary, checked, has_terms
from nanomt.translate import Translator

log = logging.getLogger("nanomt.serve")
access_log = logging.getLogger("nanomt.access")

PAGE = Path(__file__).parent / "static" / "index.html"
MAX_BEAM = 16
BeamSize = StrictInt  # strict: `true` or "5" are type errors, not beam sizes
SURROGATE = re.compile("[\ud800-\udfff]")
SAMPLING = ("temperature", "top_k", "top_p")


def _no_lone_surrogate(text):
    """JSON may escape half a UTF-16 surrogate pair ("\\ud800"): no character, and nothing can encode it."""
    bad = SURROGATE.search(text) if isinstance(text, str) else None
    if bad:
        raise PydanticCustomError(
            "lone_surrogate",
            "a lone surrogate {escape} at character {at}, which is no character (escape a character beyond U+FFFF "
            "as a surrogate pair, or send it as UTF-8)",
            {"escape": ascii(bad.group())[1:-1], "at": bad.start()},
        )
    return text


# Before the str check, which would otherwise reject some of them with a message that does not say why.
Text = Annotated[StrictStr, BeforeValidator(_no_lone_surrogate)]


class TranslateRequest(BaseModel):
    """Sentences to translate; one string is taken as a list of one. Any sampling setting samples instead."""

    text: list[Text] = Field(min_length=1, description="sentences (a single string is accepted)")
    beam_size: BeamSize | None = Field(default=None, ge=1, le=MAX_BEAM, description="default: the server's")
    temperature: StrictFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="sample at this temperature (default 1 when sampling)"
    )
    top_k: StrictInt | None = Field(default=None, ge=0, description="sample from the k likeliest tokens (0: all)")
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1, description="nucleus sampling (1: off)")
    seed: StrictInt | None = Field(
        default=None, ge=0, lt=2**64, description="makes sampling reproducible (default: a fresh draw)"
    )
    prefix: list[Text | None] | None = Field(
        default=None, description="per sentence, target text its translation starts with (null: none)"
    )
    glossary: list[tuple[Text, Text]] | dict[Text, Text] | None = Field(
        default=None, description="[source term, target term] pairs (or an object): terms the translations use"
    )
    no_repeat_ngram_size: StrictInt | None = Field(default=None, ge=0, description="no n-gram twice (0: off)")
    repetition_penalty: StrictFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="> 1 discourages repeated tokens (1: off)"
    )
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")

    @field_validator("text", mode="before")
    @classmethod
    def _one_string_is_a_list(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("prefix", mode="before")
    @classmethod
    def _one_prefix_is_a_list(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _sampling_or_beam(self):
        if not self.sampling():
            if self.seed is not None:
                raise PydanticCustomError(
                    "seed_without_sampling", "seed applies to sampling: set temperature, top_k or top_p too"
                )
        elif self.beam_size not in (None, 1):
            raise PydanticCustomError(
                "beam_with_sampling", "beam_size: sampling draws one translation, so beam_size must be 1 or left out"
            )
        if self.prefix is not None and len(self.prefix) != len(self.text):
            raise PydanticCustomError(
                "prefix_count", "prefix: one entry per sentence ({n} sentences, {m} prefixes)",
                {"n": len(self.text), "m": len(self.prefix)},
            )  # fmt: skip
        return self

    def decoding(self, defaults: Decoding) -> Decoding:
        """The request's settings over the server's: built and checked here, where the request enters."""
        pairs = self.glossary.items() if isinstance(self.glossary, dict) else self.glossary
        return defaults.replace(
            beam_size=self.beam_size,
            sampling=self.sampling(),
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            repetition_penalty=self.repetition_penalty,
            glossary=None if pairs is None else checked(list(pairs), "glossary"),
        )

    def sampling(self) -> dict | None:
        """The keyword arguments of decode.sample, or None to search (greedy or beam)."""
        if all(getattr(self, k) is None for k in SAMPLING):
            return None
        settings = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}
        return {k: v for k, v in settings.items() if v is not None}


class TranslateResponse(BaseModel):
    """One translation per input sentence, in order, and the model time."""

    translations: list[str]
    seconds: float
    # sentences whose glossary terms could not all be placed (within the length limit): translated without them
    terms_missed: list[int] | None = None


class AttentionRequest(BaseModel):
    """One sentence whose translation and cross-attention to return."""

    text: Text = Field(min_length=1)
    beam_size: BeamSize | None = Field(default=None, ge=1, le=MAX_BEAM)
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")


class AttentionResponse(BaseModel):
    """Subword tokens and the cross-attention weights [layer][head][target][source]."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    translation: str
    cross_attention: list[list[list[list[float]]]]
    seconds: float


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's request: q is one text or a list; as JSON or as a form (application/x-www-form-urlencoded)."""

    q: Text | list[Text] = Field(description="text to translate, or a list of texts")
    source: StrictStr = Field(default="auto", description="source language code, or auto")
    target: StrictStr = Field(description="target language code")
    format: Literal["text", "html"] = Field(default="text", description="html translates the text between tags")
    alternatives: StrictInt = Field(default=0, ge=0, le=3, description="accepted; no alternatives are returned")
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")


class LibreTranslateResponse(BaseModel):
    """LibreTranslate's answer: one string for one text, a list for a list."""

    translatedText: str | list[str]  # LibreTranslate's field name
    detectedLanguage: dict | list[dict] | None = None  # only when source is auto


class DetectRequest(BaseModel):
    """LibreTranslate's /detect request."""

    q: Text | list[Text]
    api_key: StrictStr | None = None


class Language(BaseModel):
    """One entry of GET /languages, LibreTranslate's shape."""

    code: str
    name: str
    targets: list[str]


LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "tr": "Turkish",
    "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?")


def language_codes(translator: Translator) -> tuple[str, str]:
    """The model's (source, target) codes: the Hugging Face dataset's, else the training files' suffixes (de, en)."""
    data = translator.cfg.data
    if data.hf is not None and data.hf.src_lang and data.hf.tgt_lang:
        return data.hf.src_lang, data.hf.tgt_lang
    if data.train.src and data.train.tgt:
        codes = Path(data.train.src).suffix[1:], Path(data.train.tgt).suffix[1:]
        if codes[0] != codes[1] and all(LANGUAGE_CODE.fullmatch(c) for c in codes):
            return codes
    return "src", "tgt"


def _error(status: int, message: str, detail=None, headers: dict | None = None) -> JSONResponse:
    """The one error body of the API: {"error": "...", "detail": ...} (LibreTranslate's clients read "error")."""
    return JSONResponse({"error": message, "detail": detail}, status_code=status, headers=headers)


def _describe(errors: list[dict]) -> str:
    """A one-line summary of pydantic's errors, e.g. 'text: Input should be a valid list'."""
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else e.get("msg", "invalid"))
    return "; ".join(parts)


def _json_safe(errors: list[dict]) -> list[dict]:
    """pydantic error dicts without their `ctx`/`input` objects, which may not be JSON-serializable."""
    return [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in errors]


def _invalid(errors: list[dict]) -> JSONResponse:
    """A 400 for text that is no text (a lone surrogate), else a 422 naming every invalid field."""
    errors = _json_safe(errors)
    bad_text = [e for e in errors if e.get("type") == "lone_surrogate"]
    if bad_text:
        return _error(400, "invalid text: " + _describe(bad_text), errors)
    return _error(422, "invalid request: " + _describe(errors), errors)


class _Refused(Exception):
    """An early answer from inside an endpoint (a JSONResponse), e.g. a 422 of a body parsed by hand."""

    def __init__(self, response: JSONResponse):
        self.response = response


def _check_size(texts: list[str], max_sentences: int, max_chars: int) -> None:
    """413 when a request holds more sentences or characters than the server takes."""
    if len(texts) > max_sentences:
        raise HTTPException(413, f"{len(texts)} sentences in one request; the limit is {max_sentences}")
    chars = sum(len(t) for t in texts)
    if chars > max_chars:
        raise HTTPException(413, f"{chars} characters in one request; the limit is {max_chars}")


def _model_info(translator: Translator) -> dict:
    """What a client may want to know about the model behind the server."""
    m = translator.cfg.model
    return {
        "d_model": m.d_model,
        "n_heads": m.n_heads,
        "n_encoder_layers": m.n_encoder_layers,
        "n_decoder_layers": m.n_decoder_layers,
        "src_vocab_size": m.src_vocab_size,
        "tgt_vocab_size": m.tgt_vocab_size,
        "max_positions": m.max_positions,
        "device": str(translator.device),
        "int8": translator.int8,
    }


FORM = "application/x-www-form-urlencoded"
NOT_JSON = (
    "send a JSON body with the header Content-Type: application/json (a form body is LibreTranslate's request, "
    "with a field q)"
)


async def _read_body(request: Request) -> object:
    """The parsed body: JSON, or a form's fields (a repeated q is a list); malformed JSON is a 400."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    if content_type == FORM:
        fields: dict = {}
        for k, v in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
            if k == "q" and k in fields:
                fields[k] = [*(fields[k] if isinstance(fields[k], list) else [fields[k]]), v]
            else:
                fields[k] = v
        if "q" not in fields:
            raise _Refused(_error(415, NOT_JSON))
        for k in ("alternatives",):
            if isinstance(fields.get(k), str) and fields[k].isdigit():
                fields[k] = int(fields[k])
        return fields
    if "json" not in content_type:  # e.g. curl -d without -H, or text/plain
        raise _Refused(_error(415, NOT_JSON))
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise _Refused(_error(400, f"malformed JSON: {e.msg} at character {e.pos}")) from None
    except UnicodeDecodeError as e:
        raise _Refused(_error(400, f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})")) from None


def _validate(model: type[BaseModel], body: object) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _Refused(_invalid(e.errors())) from None


TAG = re.compile(r"(<!--.*?-->|<[^>]*>)", re.DOTALL)
RAW_TEXT = re.compile(r"<(script|style)\b", re.IGNORECASE)


def html_texts(doc: str) -> tuple[list[str], list[int]]:
    """The pieces of an HTML document (tags and text alternating) and the indices of the text to translate."""
    pieces = TAG.split(doc)
    todo, raw = [], False
    for i, piece in enumerate(pieces):
        if i % 2:  # a tag: text inside <script> and <style> is code, not language
            if RAW_TEXT.match(piece):
                raw = True
            elif re.match(r"</(script|style)\b", piece, re.IGNORECASE):
                raw = False
        elif piece.strip() and not raw:
            todo.append(i)
    return pieces, todo


def html_join(pieces: list[str], todo: list[int], translations: list[str]) -> str:
    """The document with its text pieces replaced by their translations (escaped), whitespace kept around them."""
    pieces = list(pieces)
    for i, out in zip(todo, translations):
        text = pieces[i]
        lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
        pieces[i] = lead + html.escape(out, quote=False) + trail
    return "".join(pieces)


class ServerMetrics:
    """Prometheus metrics of one app, in a registry of its own (several apps may live in one process)."""

    def __init__(self, queue_depth):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "nanomt_requests", "HTTP requests answered, by route, method and status", ["route", "method", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "nanomt_request_duration_seconds", "time from request to response, by route", ["route"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip
        Gauge("nanomt_queue_depth", "requests waiting for the decoder", registry=r).set_function(queue_depth)
        sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
        self.batch_sentences = Histogram("nanomt_batch_sentences", "sentences a batch", buckets=sizes, registry=r)
        self.batch_requests = Histogram("nanomt_batch_requests", "requests a batch", buckets=sizes, registry=r)
        self.sentences = Counter("nanomt_sentences", "sentences decoded", registry=r)
        self.tokens = Counter("nanomt_source_tokens", "source tokens decoded (with EOS)", registry=r)
        self.decode_seconds = Counter("nanomt_decode_seconds", "seconds the model spent decoding", registry=r)
        self.window = 60.0
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, sentences, tokens) of recent batches
        self._lock = threading.Lock()
        rate = Gauge(
            "nanomt_throughput", "decoded per second over the last minute", ["unit"], registry=r
        )  # fmt: skip
        rate.labels("sentences").set_function(lambda: self._rate(1))
        rate.labels("tokens").set_function(lambda: self._rate(2))

    def batch(self, b: Batch) -> None:
        self.batch_sentences.observe(b.items)
        self.batch_requests.observe(b.jobs)
        self.decoded(b.items, b.tokens, b.seconds)

    def decoded(self, sentences: int, tokens: int, seconds: float) -> None:
        self.sentences.inc(sentences)
        self.tokens.inc(tokens)
        self.decode_seconds.inc(seconds)
        with self._lock:
            self._recent.append((time.monotonic(), sentences, tokens))

    def _rate(self, field: int) -> float:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - self.window:
                self._recent.popleft()
            return sum(x[field] for x in self._recent) / self.window

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error comes back as {"error", "detail"}; malformed JSON or text is a 400, a body that is not JSON a 415."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _json_safe(exc.errors())
        if "json" not in request.headers.get("content-type", ""):  # e.g. curl -d without -H: a form, not JSON
            return _error(415, "send a JSON body with the header Content-Type: application/json", errors)
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            at = bad_json[0]["loc"][-1]  # FastAPI puts the character offset of the syntax error last
            return _error(400, f"malformed JSON: {bad_json[0]['msg']} at character {at}", errors)
        return _invalid(errors)

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> JSONResponse:
        return exc.response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)  # keeps e.g. a 405's Allow header

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still re-raises the exception afterwards, so the server logs its traceback.
        return _error(500, f"internal server error: {type(exc).__name__}")


def _add_observer(app: FastAPI, metrics: ServerMetrics, max_bytes: int) -> None:
    """Refuse an oversized body before it is read; count, time and log (one JSON line) every request."""
    routes = {getattr(r, "path", "") for r in app.routes}

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        status = 500
        try:
            length = request.headers.get("content-length", "")
            if length.isdigit() and int(length) > max_bytes:
                response = _error(413, f"request body of {length} bytes; the limit is {max_bytes}")
            else:
                response = await call_next(request)
            status = response.status_code
            return response
        finally:
            seconds = time.perf_counter() - start
            path = request.url.path
            route = path if path in routes else "other"
            metrics.requests.labels(route, request.method, str(status)).inc()
            metrics.latency.labels(route).observe(seconds)
            if access_log.isEnabledFor(logging.INFO):
                entry = {
                    "ts": round(time.time(), 3),
                    "client": request.client.host if request.client else None,
                    "method": request.method,
                    "path": path,
                    "status": status,
                    "ms": round(1000 * seconds, 1),
                    "sentences": getattr(request.state, "sentences", None),
                    "user_agent": request.headers.get("user-agent"),
                }
                access_log.info(json.dumps(entry, ensure_ascii=False))


class _OneLock:
    """The one-lock path: every request decoded alone, in whatever order threads get the lock (for comparison)."""

    def __init__(self, run, metrics: ServerMetrics):
        self.run, self.metrics, self.lock = run, metrics, threading.Lock()

    def depth(self) -> int:
        return 0

    def full(self) -> bool:
        return False

    def _locked(self, key, items: list, tokens: int) -> list:
        with self.lock:
            start = time.perf_counter()
            out = self.run(key, items)
            self.metrics.decoded(len(items), tokens, time.perf_counter() - start)
            return out

    async def __call__(self, key, items: list, tokens: int) -> list:
        return await run_in_threadpool(self._locked, key, items, tokens)


def _openapi_bodies(app: FastAPI) -> None:
    """POST /translate takes either shape, parsed by hand: describe both in the OpenAPI schema."""

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        defs = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (TranslateRequest, LibreTranslateRequest, DetectRequest):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            defs.update(body.pop("$defs", {}))
            defs[model.__name__] = body
        ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
        schema["paths"]["/translate"]["post"]["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"oneOf": [ref("TranslateRequest"), ref("LibreTranslateRequest")]}},
                FORM: {"schema": ref("LibreTranslateRequest")},
            },
        }
        schema["paths"]["/detect"]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref("DetectRequest")}, FORM: {"schema": ref("DetectRequest")}},
        }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


ERRORS = {
    400: {"description": "malformed JSON or text"},
    403: {"description": "missing or wrong API key"},
    413: {"description": "too many sentences or characters"},
    415: {"description": "neither JSON nor LibreTranslate's form"},
    422: {"description": "invalid fields"},
    503: {"description": "the queue is full or the server is shutting down (with Retry-After)"},
    504: {"description": "not translated within the server's timeout"},
}


def create_app(
    translator: Translator,
    max_sentences: int = 64,
    max_chars: int = 10_000,
    default_beam: int | None = None,
    max_batch_tokens: int | None = None,
    *,
    batching: bool = True,
    max_wait_ms: float = 5.0,
    queue_size: int = 256,
    timeout: float | None = 60.0,
    api_key: str | None = None,
    languages: tuple[str, str] | None = None,
    glossary: Glossary = (),
) -> FastAPI:
    """The FastAPI app serving `translator`: nanomt's API, LibreTranslate's, the page, /health, /ready, /metrics.

    batching=False keeps the one-lock path (each request decoded alone, no queue limit or timeout), to compare with.
    """
    default_beam = translator.cfg.decode.beam_size if default_beam is None else default_beam
    if not 1 <= default_beam <= MAX_BEAM:
        raise ValueError(f"beam size must be in 1..{MAX_BEAM}, got {default_beam}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    api_key = api_key or None  # an empty key is no key
    source, target = languages or language_codes(translator)
    budget = max_batch_tokens or translator.cfg.decode.max_tokens
    defaults = translator.default_decoding.replace(beam_size=default_beam, glossary=glossary)

    def run(key: tuple, items: list) -> list:
        """Decode one batch: every item shares the key's settings. One thread at a time (the worker, or the lock)."""
        if key[0] == "translate":  # items: (text, prefix or None)
            texts, prefixes = [t for t, _ in items], [p for _, p in items]
            prefixes = prefixes if any(prefixes) else None
            return translator.translate(texts, decoding=key[1], max_tokens=max_batch_tokens, prefixes=prefixes)
        if key[0] == "attention":
            return [translator.attention(items[0], beam_size=key[1])]
        raise ValueError(f"unknown kind of job {key[0]!r}")

    def translate_key(decoding: Decoding) -> tuple:
        # A seeded sample repeats only in a batch of its own: a key nobody else has. Equal settings share one.
        return ("translate", decoding, object() if decoding.decode_alone else None)

    metrics = ServerMetrics(lambda: engine.depth())
    if batching:
        engine = Batcher(run, budget, max_wait_ms / 1000, queue_size, on_batch=metrics.batch)
    else:
        engine = _OneLock(run, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if batching:
            engine.start()
        yield
        if batching:  # uvicorn got here after the requests in flight were answered: finish the queue, stop
            await asyncio.to_thread(engine.close, 60)
            log.info("queue drained, decoder stopped")

    app = FastAPI(
        title="nanomt",
        description="Translate with a nanomt Transformer and inspect its attention. POST /translate also speaks "
        "LibreTranslate's API (q, source, target, format, api_key), as do GET /languages and POST /detect.",
        lifespan=lifespan,
    )
    _add_error_handlers(app)
    _openapi_bodies(app)

    def count_tokens(items: list) -> int:
        texts = [item if isinstance(item, str) else item[0] for item in items]
        return sum(len(ids) + 1 for ids in translator.tokenizer.encode_src(texts))  # +1: EOS

    async def decode(request: Request, key: tuple, texts: list[str]) -> list:
        """The results for `texts` (decoded with others of the same key), or a 503 (queue full) or 504 (timeout)."""
        request.state.sentences = len(texts)
        if not texts:  # e.g. an HTML document of tags only
            return []
        tokens = count_tokens(texts)
        if not batching:
            return await engine(key, texts, tokens)
        try:
            job = engine.submit(key, texts, tokens, timeout)
        except QueueFull as e:
            raise HTTPException(503, f"server busy: {e}", headers={"Retry-After": "1"}) from None
        except Closed as e:
            raise HTTPException(503, str(e), headers={"Retry-After": "5"}) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(job.future), timeout)
        except (asyncio.TimeoutError, JobTimeout):
            job.future.cancel()  # not decoded yet: dropped from every later batch
            raise HTTPException(504, f"not translated within the server's timeout of {timeout:g} s") from None

    def check_key(request: Request, given: str | None) -> None:
        """403 unless the request carries the server's key (body api_key, Authorization: Bearer, or X-API-Key)."""
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = given or (auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key"))
        if not given or not hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), api_key.encode("utf-8", "surrogatepass")
        ):
            raise HTTPException(403, "missing or wrong API key (send api_key, or the header Authorization: Bearer)")

    async def nanomt_translate(request: Request, req: TranslateRequest) -> TranslateResponse:
        check_key(request, req.api_key)
        _check_size(req.text, max_sentences, max_chars)
        try:
            decoding = req.decoding(defaults)
            translator.check(req.text, decoding, req.prefix)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        start = time.perf_counter()
        prefixes = req.prefix or [None] * len(req.text)
        out = await decode(request, translate_key(decoding), list(zip(req.text, prefixes)))
        missed = [i for i, (text, t) in enumerate(zip(req.text, out)) if not has_terms(decoding.glossary, text, t)]
        seconds = round(time.perf_counter() - start, 4)
        return TranslateResponse(translations=out, seconds=seconds, terms_missed=missed or None)

    def check_languages(src: str, tgt: str) -> None:
        if src not in ("auto", source):
            raise HTTPException(400, f"{src} is not supported: this model translates {source} to {target}")
        if tgt != target:
            raise HTTPException(400, f"{tgt} is not supported: this model translates {source} to {target}")

    async def libre_translate(request: Request, req: LibreTranslateRequest) -> LibreTranslateResponse:
        check_key(request, req.api_key)
        check_languages(req.source, req.target)
        texts = [req.q] if isinstance(req.q, str) else req.q
        _check_size(texts, max_sentences, max_chars)
        if req.format == "html":
            docs = [html_texts(t) for t in texts]
            pieces = [pieces[i] for pieces, todo in docs for i in todo]
            texts_of = [(" ".join(html.unescape(p).split()), None) for p in pieces]
            done = await decode(request, translate_key(defaults), texts_of)
            out, at = [], 0
            for pieces, todo in docs:
                out.append(html_join(pieces, todo, done[at : at + len(todo)]))
                at += len(todo)
        else:
            out = await decode(request, translate_key(defaults), [(t, None) for t in texts])
        detected = None
        if req.source == "auto":
            detected = {"confidence": 100.0, "language": source}
            detected = detected if isinstance(req.q, str) else [detected] * len(texts)
        return LibreTranslateResponse(
            translatedText=out[0] if isinstance(req.q, str) else out, detectedLanguage=detected
        )

    @app.post(
        "/translate",
        response_model=TranslateResponse | LibreTranslateResponse,
        response_model_exclude_none=True,
        responses=ERRORS,
    )
    async def translate(request: Request):
        """Translate sentences: nanomt's {"text": [...]} (beam search, or sampling given a sampling setting), or
        LibreTranslate's {"q": ..., "source": "auto", "target": ...} as JSON or a form."""
        body = await _read_body(request)
        if isinstance(body, dict) and "q" in body and "text" not in body:
            return await libre_translate(request, _validate(LibreTranslateRequest, body))
        return await nanomt_translate(request, _validate(TranslateRequest, body))

    @app.post("/attention", response_model=AttentionResponse, responses=ERRORS)
    async def attention(request: Request, req: AttentionRequest) -> AttentionResponse:
        """Translate one sentence and return its cross-attention, every layer and head."""
        check_key(request, req.api_key)
        _check_size([req.text], 1, max_chars)
        start = time.perf_counter()
        # Decoded alone (a key of its own), in its turn in the queue.
        [att] = await decode(request, ("attention", req.beam_size or default_beam, object()), [req.text])
        return AttentionResponse(
            src_tokens=att.src_tokens,
            tgt_tokens=att.tgt_tokens,
            translation=att.translation,
            # float64 before rounding, so that JSON gets 0.9964 and not float32's 0.996399998664856
            cross_attention=[w.astype(np.float64).round(4).tolist() for w in att.cross],  # per layer (H, T, S)
            seconds=round(time.perf_counter() - start, 4),
        )

    @app.get("/languages", response_model=list[Language])
    async def languages_() -> list[Language]:
        """LibreTranslate's language list: this model's source language and its one target."""
        return [
            Language(code=source, name=LANGUAGE_NAMES.get(source, source), targets=[target]),
        ]

    @app.post("/detect", responses=ERRORS)
    async def detect(request: Request) -> list:
        """LibreTranslate's language detection: a model of one source language detects that language."""
        req = _validate(DetectRequest, await _read_body(request))
        check_key(request, req.api_key)
        return [{"confidence": 100.0, "language": source}]

    @app.get("/health")
    async def health() -> dict:
        """Liveness and model information; answered on the event loop, never waits for the model."""
        limits = {"max_sentences": max_sentences, "max_chars": max_chars, "max_beam": MAX_BEAM}
        return {
            "status": "ok",
            "model": _model_info(translator),
            "default_beam": default_beam,
            "limits": limits,
            "languages": {"source": source, "target": target},
            "api_key_required": api_key is not None,
        }

    @app.get("/ready", responses={503: {"description": "not ready: queue full, shutting down or worker stopped"}})
    async def ready() -> JSONResponse:
        """Readiness: the model is loaded, the worker runs and the queue has room (else a 503)."""
        if batching and (engine.closing or not engine.alive()):
            return _error(503, "not ready: shutting down" if engine.closing else "not ready: decoder not running")
        if engine.full():
            return _error(503, "not ready: the queue is full", headers={"Retry-After": "1"})
        return JSONResponse({"status": "ready", "queue_depth": engine.depth()})

    @app.get("/metrics", include_in_schema=False)
    async def metrics_() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        """The page: type a sentence, see its translation and cross-attention heatmap."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    # UTF-8 text is at most 4 bytes a character; the slack covers JSON syntax and escapes.
    _add_observer(app, metrics, 6 * max_chars + 65_536)
    app.state.engine = engine
    app.state.metrics = metrics
    return app


def _json_logs() -> None:
    """Access logs as one JSON object a line on stderr (uvicorn's own access log is off)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False


def serve(
    checkpoint: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    beam_size: int | None = None,
    max_batch_tokens: int | None = None,
    device: str = "cpu",
    int8: bool = False,
    *,
    batching: bool = True,
    max_wait_ms: float = 5.0,
    queue_size: int = 256,
    timeout: float | None = 60.0,
    api_key: str | None = None,
    access_logs: bool = True,
    glossary: Glossary = (),
) -> None:
    """Load a checkpoint and serve it with uvicorn; SIGTERM or Ctrl-C stops accepting, answers what came in, exits."""
    import uvicorn

    api_key = api_key or os.environ.get("NANOMT_API_KEY") or None
    translator = Translator.from_checkpoint(checkpoint, device=device, int8=int8)
    app = create_app(
        translator,
        default_beam=beam_size,
        max_batch_tokens=max_batch_tokens,
        batching=batching,
        max_wait_ms=max_wait_ms,
        queue_size=queue_size,
        timeout=timeout,
        api_key=api_key,
        glossary=glossary,
    )
    if access_logs:
        _json_logs()
    # Past the timeout every request has been answered (a 504 at worst): the bound on a graceful shutdown.
    grace = None if timeout is None else math.ceil(timeout) + 5
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=grace)
