"""LibreTranslate's API, as its clients (browser extensions, its Python and JS libraries) speak it: POST /translate
with `q`, GET /languages, POST /detect, GET /frontend/settings. Requests are routed by `source` and `target`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, StrictBool, StrictStr

from nanomt.core.languages import LANGUAGE_NAMES
from nanomt.documents import formats
from nanomt.serve import confidence, file_jobs, file_routes
from nanomt.serve.documents import Route
from nanomt.serve.errors import ERRORS, check_size, errors, read_body, validate
from nanomt.serve.models import NoRoute
from nanomt.serve.schemas import JsonInt, SentenceConfidence, Text

MAX_ALTERNATIVES = 3  # LibreTranslate's limit


class LibreTranslateRequest(BaseModel):
    """LibreTranslate's request: q is one text or a list; as JSON or as a form (application/x-www-form-urlencoded)."""

    q: Text | Annotated[list[Text], Field(min_length=1)] = Field(
        description="text to translate, or a list of texts (at least one)"
    )
    source: StrictStr = Field(default="auto", min_length=1, description="source language code, or auto")
    target: StrictStr = Field(min_length=1, description="target language code")
    format: Literal["text", "html"] = Field(
        default="text", description="html: sentences translated whole, inline tags put back around the aligned words"
    )
    alternatives: JsonInt = Field(
        default=0, ge=0, le=MAX_ALTERNATIVES, description="this many other translations from the n-best list"
    )
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")
    confidence: StrictBool = Field(
        default=False,
        description="nanomt's: also each translation's confidence (the model's estimate of its chrF / 100) and its "
        "sentences' with their words' probabilities (format text)",
    )


class LibreTranslateResponse(BaseModel):
    """LibreTranslate's answer: one string for one text, a list for a list."""

    translatedText: str | list[str]  # LibreTranslate's field name
    detectedLanguage: dict | list[dict] | None = None  # only when source is auto
    alternatives: list[str] | list[list[str]] | None = None  # only when asked for
    # only when asked for (nanomt's): as nanomt's /translate gives them, one per text (not in a list for one)
    confidence: float | None | list[float | None] = None
    calibrated: bool | None = None
    sentences: list[SentenceConfidence] | list[list[SentenceConfidence]] | None = None


class DetectRequest(BaseModel):
    """LibreTranslate's /detect request."""

    q: Text | Annotated[list[Text], Field(min_length=1)]
    api_key: StrictStr | None = None


class SuggestRequest(BaseModel):
    """LibreTranslate's /suggest: a better translation `s` of the sentence `q`."""

    q: Text = Field(min_length=1, description="the source sentence")
    s: Text = Field(min_length=1, description="its correct translation")
    source: StrictStr = Field(min_length=1, description="source language code")
    target: StrictStr = Field(min_length=1, description="target language code")
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")


class Language(BaseModel):
    """One entry of GET /languages, LibreTranslate's shape."""

    code: str
    name: str
    targets: list[str]


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
    from nanomt.serve import langdetect  # the detector is loaded on first use

    try:
        found = langdetect.detect(text, sources)
    except langdetect.LanguageDetectionError as e:
        raise HTTPException(400, f"source auto: {e}; give the source language") from None
    return [{"confidence": p, "language": c} for c, p in found] or [{"confidence": 0.0, "language": sources[0]}]


async def detect_all(server, request: Request, texts: list[str], sources: list[str]) -> list[list[dict]]:
    """Each text's detections, off the event loop (in the work pool: detection is CPU work that holds the GIL)."""
    run = lambda: [detections(t, sources) for t in texts]  # noqa: E731
    return await server.offload(server.pools.work, run, deadline=server.deadline(request))


def _route(server, request: Request, source: str, target: str, n_best: int) -> Route:
    """The models from `source` to `target` (or a 400 naming the language not served), each with its default
    settings, the last one's giving `n_best` hypotheses."""
    try:
        models = server.models.route(source, target)
    except NoRoute:
        unsupported = source if source not in server.models.sources() else target
        served = ", ".join(server.models.pairs())
        raise HTTPException(400, f"{unsupported} is not supported (this server translates {served})") from None
    decodings = [server.defaults(m).replace(glossary=()) for m in models[:-1]]
    last = server.defaults(models[-1])
    decodings.append(last.replace(beam_size=max(last.beam_size, n_best), n_best=n_best))
    return Route(server, request, models, decodings)


async def _translate_all(server, request: Request, req: LibreTranslateRequest, texts: list[str]) -> tuple:
    """Each text's translation and alternatives, and (source auto) each text's detected language."""
    sources = candidates(server, req.target) if req.source == "auto" else None
    detected = [d[0] for d in await detect_all(server, request, texts, sources)] if sources else None
    sources = [d["language"] for d in detected] if detected else [req.source] * len(texts)
    out, alts, found = [""] * len(texts), [[] for _ in texts], [[] for _ in texts]
    for source in dict.fromkeys(sources):
        route = _route(server, request, source, req.target, req.alternatives + 1)
        idx = [i for i, s in enumerate(sources) if s == source]
        group = [texts[i] for i in idx]
        if req.format == "html":
            done = [(t, ()) for t in await route.html(group)]
        elif req.confidence and not req.alternatives:
            confident = await route.paragraphs_confident(group, True)
            done = [(r.text, ()) for r, _ in confident]
            for i, (_, sentences) in zip(idx, confident):
                found[i] = sentences
        else:  # with confidence too, the sentences come from a second, 1-best pass
            done = [(r.text, r.alternatives) for r in await route.paragraphs(group, True, req.alternatives)]
            if req.confidence:
                for i, (_, sentences) in zip(idx, await route.paragraphs_confident(group, True)):
                    found[i] = sentences
        for i, (text, alternatives) in zip(idx, done):
            out[i], alts[i] = text, list(alternatives)
    return out, alts, detected, found


async def translate(server, request: Request, req: LibreTranslateRequest) -> LibreTranslateResponse:
    """LibreTranslate's /translate: each text a document (sentences split, spacing kept), or HTML."""
    texts = [req.q] if isinstance(req.q, str) else req.q
    await server.check_key(request, req.api_key, sum(map(len, texts)))
    check_size(texts, server.config.sentence_limit, server.config.max_chars)
    if req.confidence and req.format == "html":
        raise HTTPException(400, "confidence: for format text (an HTML document's sentences are not returned)")
    out, alts, detected, found = await _translate_all(server, request, req, texts)
    one = isinstance(req.q, str)
    if detected is not None and one:
        detected = detected[0] if detected else {"confidence": 0.0, "language": req.source}
    extra = {}
    if req.confidence:
        got = confidence.fields(found, None, req.target)
        pick = lambda values: values[0] if one else values  # noqa: E731
        extra = {
            "confidence": pick(got["confidence"]),
            "calibrated": got["calibrated"],
            "sentences": pick(got["sentences"]),
        }
    return LibreTranslateResponse(
        translatedText=out[0] if one else out,
        detectedLanguage=detected,
        alternatives=(alts[0] if one else alts) if req.alternatives else None,
        **extra,
    )


def add_routes(app: FastAPI, server) -> None:
    """GET /languages, POST /detect, GET /frontend/settings, POST /translate_file (POST /translate is shared:
    nanomt.serve.api), and nanomt's file jobs (nanomt.serve.file_jobs) on /translate_file's form, routing and store."""

    def routed(request: Request, source: str, target: str) -> Route:
        return _route(server, request, source, target, 1)

    file_jobs.add_routes(app, server, routed, file_routes.add_routes(app, server, routed))

    @app.get("/languages", response_model=list[Language])
    async def languages() -> list[Language]:
        """LibreTranslate's language list: every source language and the targets it reaches."""
        codes = server.models.sources()
        return [Language(code=c, name=LANGUAGE_NAMES.get(c, c), targets=server.models.targets(c)) for c in codes]

    @app.post("/detect", responses=ERRORS)
    async def detect_(request: Request) -> list:
        """LibreTranslate's language detection, among the languages the server translates from."""
        req = validate(DetectRequest, await read_body(request))
        texts = [req.q] if isinstance(req.q, str) else req.q
        await server.check_key(request, req.api_key, sum(map(len, texts)))
        check_size(texts, server.config.sentence_limit, server.config.max_chars)
        return (await detect_all(server, request, [" ".join(texts)], candidates(server)))[0]

    @app.post("/suggest", responses=errors(400, 403, 413, 415, 422, 429, 503, 507))
    async def suggest(request: Request) -> dict:
        """LibreTranslate's corrections, with --suggestions: from a trusted key the sentence q of the pair is
        answered with s from now on (by every replica sharing the store, in documents too); from anyone else it is
        kept for an operator's review (`nanomt memory pending`) and served only once approved."""
        if not server.config.suggestions:
            raise HTTPException(403, "Suggestions are disabled on this server.")
        req = validate(SuggestRequest, await read_body(request))
        client = await server.check_key(request, req.api_key, len(req.q) + len(req.s))
        check_size([req.q, req.s], 2, server.config.max_chars)
        if (req.source, req.target) not in server.models.by_pair:
            served = ", ".join(server.models.pairs())
            raise HTTPException(400, f"{req.source}-{req.target} is not translated by one model (served: {served})")
        pair = f"{req.source}-{req.target}"
        status = await server.io(server.memory.suggest, pair, req.q, req.s, client.id, client.trusted, fallback=None)
        if status is None:
            raise HTTPException(503, "the correction cannot be kept: the store is unreachable")
        if status == "full":
            limit = server.config.max_corrections
            raise HTTPException(507, f"the translation memory holds its {limit:,} corrections (--max-corrections)")
        return {"success": True, "status": status}

    @app.get("/frontend/settings")
    async def frontend_settings() -> dict:
        """What LibreTranslate's web page and clients read before they translate."""
        first = server.models.default
        name = lambda code: {"code": code, "name": LANGUAGE_NAMES.get(code, code)}  # noqa: E731
        return {
            "charLimit": min(server.config.char_limit or server.config.max_chars, server.config.max_chars),
            "frontendTimeout": 500,
            "apiKeys": server.key_required,
            "keyRequired": server.key_required,
            "suggestions": server.config.suggestions,
            "filesTranslation": True,
            "supportedFilesFormat": list(formats.FORMATS),
            "language": {"source": name(first.source), "target": name(first.target)},
        }
