"""HTTP JSON API and a web page: translate sentences and look at their cross-attention."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Annotated

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from nanomt.translate import Translator

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

    @field_validator("text", mode="before")
    @classmethod
    def _one_string_is_a_list(cls, v):
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
        return self

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


class AttentionRequest(BaseModel):
    """One sentence whose translation and cross-attention to return."""

    text: Text = Field(min_length=1)
    beam_size: BeamSize | None = Field(default=None, ge=1, le=MAX_BEAM)


class AttentionResponse(BaseModel):
    """Subword tokens and the cross-attention weights [layer][head][target][source]."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    translation: str
    cross_attention: list[list[list[list[float]]]]
    seconds: float


def _error(status: int, message: str, detail=None, headers: dict | None = None) -> JSONResponse:
    """The one error body of the API: {"error": "...", "detail": ...}."""
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
        bad_text = [e for e in errors if e.get("type") == "lone_surrogate"]
        if bad_text:
            return _error(400, "invalid text: " + _describe(bad_text), errors)
        return _error(422, "invalid request: " + _describe(errors), errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)  # keeps e.g. a 405's Allow header

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still re-raises the exception afterwards, so the server logs its traceback.
        return _error(500, f"internal server error: {type(exc).__name__}")


def _add_body_limit(app: FastAPI, max_bytes: int) -> None:
    """Refuse an oversized body before it is read and parsed (when the client declares its length)."""

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_bytes:
            return _error(413, f"request body of {length} bytes; the limit is {max_bytes}")
        return await call_next(request)


def create_app(
    translator: Translator,
    max_sentences: int = 64,
    max_chars: int = 10_000,
    default_beam: int | None = None,
    max_batch_tokens: int | None = None,
) -> FastAPI:
    """The FastAPI app serving `translator`: POST /translate, POST /attention, GET /health, GET /."""
    default_beam = translator.cfg.decode.beam_size if default_beam is None else default_beam
    if not 1 <= default_beam <= MAX_BEAM:
        raise ValueError(f"beam size must be in 1..{MAX_BEAM}, got {default_beam}")
    # One model, one caller at a time: decoding is not thread-safe and parallel calls would only fight over cores.
    lock = threading.Lock()
    app = FastAPI(title="nanomt", description="Translate with a nanomt Transformer and inspect its attention.")
    _add_error_handlers(app)
    # UTF-8 text is at most 4 bytes a character; the slack covers JSON syntax and escapes.
    _add_body_limit(app, 6 * max_chars + 65_536)

    # Plain `def` endpoints run in FastAPI's threadpool, so the event loop (and /health) stays free while decoding.
    @app.post("/translate", response_model=TranslateResponse)
    def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate a list of sentences (or one string), by beam search or, given a sampling setting, by sampling."""
        _check_size(req.text, max_sentences, max_chars)
        beam = req.beam_size or default_beam
        with lock:
            start = time.perf_counter()
            out = translator.translate(req.text, beam_size=beam, max_tokens=max_batch_tokens, sampling=req.sampling())
            seconds = time.perf_counter() - start
        return TranslateResponse(translations=out, seconds=round(seconds, 4))

    @app.post("/attention", response_model=AttentionResponse)
    def attention(req: AttentionRequest) -> AttentionResponse:
        """Translate one sentence and return its cross-attention, every layer and head."""
        _check_size([req.text], 1, max_chars)
        with lock:
            start = time.perf_counter()
            att = translator.attention(req.text, beam_size=req.beam_size or default_beam)
            seconds = time.perf_counter() - start
        return AttentionResponse(
            src_tokens=att.src_tokens,
            tgt_tokens=att.tgt_tokens,
            translation=att.translation,
            # float64 before rounding, so that JSON gets 0.9964 and not float32's 0.996399998664856
            cross_attention=[w.astype(np.float64).round(4).tolist() for w in att.cross],  # per layer (H, T, S)
            seconds=round(seconds, 4),
        )

    @app.get("/health")
    async def health() -> dict:
        """Liveness and model information; answered on the event loop, never waits for the model."""
        limits = {"max_sentences": max_sentences, "max_chars": max_chars, "max_beam": MAX_BEAM}
        return {"status": "ok", "model": _model_info(translator), "default_beam": default_beam, "limits": limits}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        """The page: type a sentence, see its translation and cross-attention heatmap."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


def serve(
    checkpoint: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    beam_size: int | None = None,
    max_batch_tokens: int | None = None,
    device: str = "cpu",
    int8: bool = False,
) -> None:
    """Load a checkpoint and serve it with uvicorn until interrupted."""
    import uvicorn

    translator = Translator.from_checkpoint(checkpoint, device=device, int8=int8)
    app = create_app(translator, default_beam=beam_size, max_batch_tokens=max_batch_tokens)
    uvicorn.run(app, host=host, port=port, log_level="info")
