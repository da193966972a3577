"""LibreTranslate's API, as its clients (browser extensions, its Python and JS libraries) speak it: POST /translate
with `q`, GET /languages, POST /detect, GET /frontend/settings. Requests are routed by `source` and `target`."""

from __future__ import annotations

import html
import re
from typing import Literal

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, StrictInt, StrictStr

from nanomt.serve.errors import ERRORS, check_size, read_body, validate
from nanomt.serve.models import LANGUAGE_NAMES, Model, NoRoute
from nanomt.serve.schemas import Text

TAG = re.compile(r"(<!--.*?-->|<[^>]*>)", re.DOTALL)
RAW_TEXT = re.compile(r"<(script|style)\b", re.IGNORECASE)


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


def candidates(server, target: str | None = None) -> list[str]:
    """The languages a text may be detected as: those the server translates from (to `target`, where given)."""
    sources = [s for s in server.models.sources() if target is None or target in server.models.targets(s)]
    if not sources:
        raise HTTPException(400, f"{target} is not supported: no model translates to it")
    return sources


def detections(text: str, sources: list[str]) -> list[dict]:
    """LibreTranslate's /detect answer for one text: each candidate language with its confidence, best first."""
    if len(sources) == 1:  # one candidate: nothing to tell apart (and no detector needed)
        return [{"confidence": 100.0, "language": sources[0]}]
    from nanomt import langdetect  # the detector is loaded on first use

    try:
        found = langdetect.detect(text, sources)
    except langdetect.LanguageDetectionError as e:
        raise HTTPException(400, f"source auto: {e}; give the source language") from None
    return [{"confidence": p, "language": c} for c, p in found] or [{"confidence": 0.0, "language": sources[0]}]


async def _through(server, request: Request, models: list[Model], texts: list[str]) -> list[str]:
    """Texts translated by one model, or by two through the pivot language, with each model's default settings."""
    from nanomt.serve.api import translate_key  # the batch key is nanomt's API's

    for model in models:
        texts = await server.decode(request, model, translate_key(server.defaults(model)), [(t, None) for t in texts])
    return texts


async def _translate_all(server, request: Request, req: LibreTranslateRequest, texts: list[str]) -> tuple[list, list]:
    """Translations of `texts`, and (source auto) each text's detected language."""
    sources = candidates(server, req.target) if req.source == "auto" else None
    detected = [detections(t, sources)[0] for t in texts] if sources else None
    sources = [d["language"] for d in detected] if detected else [req.source] * len(texts)
    out = [""] * len(texts)
    for source in dict.fromkeys(sources):
        try:
            models = server.models.route(source, req.target)
        except NoRoute:
            unsupported = source if source not in server.models.sources() else req.target
            served = ", ".join(server.models.pairs())
            raise HTTPException(400, f"{unsupported} is not supported (this server translates {served})") from None
        idx = [i for i, s in enumerate(sources) if s == source]
        for i, t in zip(idx, await _through(server, request, models, [texts[i] for i in idx])):
            out[i] = t
    return out, detected


async def translate(server, request: Request, req: LibreTranslateRequest) -> LibreTranslateResponse:
    """LibreTranslate's /translate: text, or the text nodes of HTML, each translated alone."""
    texts = [req.q] if isinstance(req.q, str) else req.q
    server.check_key(request, req.api_key, sum(map(len, texts)))
    check_size(texts, server.config.max_sentences, server.config.max_chars)
    if req.format == "html":
        docs = [html_texts(t) for t in texts]
        pieces = [" ".join(html.unescape(pieces[i]).split()) for pieces, todo in docs for i in todo]
        done, detected = await _translate_all(server, request, req, pieces)
        out, at = [], 0
        for pieces, todo in docs:
            out.append(html_join(pieces, todo, done[at : at + len(todo)]))
            at += len(todo)
        detected = detected[:1] * len(texts) if detected else None
    else:
        out, detected = await _translate_all(server, request, req, texts)
    if detected is not None and isinstance(req.q, str):
        detected = detected[0] if detected else {"confidence": 0.0, "language": req.source}
    return LibreTranslateResponse(translatedText=out[0] if isinstance(req.q, str) else out, detectedLanguage=detected)


def add_routes(app: FastAPI, server) -> None:
    """GET /languages, POST /detect, GET /frontend/settings (POST /translate is shared: nanomt.serve.api)."""

    @app.get("/languages", response_model=list[Language])
    async def languages() -> list[Language]:
        """LibreTranslate's language list: every source language and the targets it reaches."""
        codes = server.models.sources()
        return [Language(code=c, name=LANGUAGE_NAMES.get(c, c), targets=server.models.targets(c)) for c in codes]

    @app.post("/detect", responses=ERRORS)
    async def detect_(request: Request) -> list:
        """LibreTranslate's language detection, among the languages the server translates from."""
        req = validate(DetectRequest, await read_body(request))
        server.check_key(request, req.api_key)
        text = req.q if isinstance(req.q, str) else " ".join(req.q)
        return detections(text, candidates(server))

    @app.get("/frontend/settings")
    async def frontend_settings() -> dict:
        """What LibreTranslate's web page and clients read before they translate."""
        first = server.models.default
        name = lambda code: {"code": code, "name": LANGUAGE_NAMES.get(code, code)}  # noqa: E731
        return {
            "charLimit": server.config.max_chars,
            "frontendTimeout": 500,
            "apiKeys": server.key_required,
            "keyRequired": server.key_required,
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {"source": name(first.source), "target": name(first.target)},
        }
