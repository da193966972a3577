"""nanomt's API: POST /translate ({"text": [...]}, with every decoding setting) and POST /attention; POST /translate
also takes LibreTranslate's request shape and hands it to nanomt.serve.libretranslate."""

from __future__ import annotations

import time

import numpy as np
from fastapi import FastAPI, HTTPException, Request

from nanomt.core.decoding import Decoding
from nanomt.decoding.glossary import has_terms
from nanomt.decoding.rows import prepare, src_limit
from nanomt.serve import confidence, libretranslate
from nanomt.serve.documents import Route
from nanomt.serve.errors import ERRORS, NOT_JSON, FormFields, check_size, read_body, validate
from nanomt.serve.jobs import Kind
from nanomt.serve.models import Model, NoRoute, has_shortlist
from nanomt.serve.schemas import AttentionRequest, AttentionResponse, TranslateRequest, TranslateResponse


def route(server, source: str | None, target: str | None) -> list[Model]:
    """The model(s) of a request's pair (nanomt's API defaults to the first model's), or a 400."""
    first = server.models.default
    try:
        return server.models.route(source or first.source, target or first.target)
    except NoRoute as e:
        raise HTTPException(400, str(e)) from None


def request_decoding(server, req, model: Model) -> Decoding:
    """A request's decoding for `model`: its settings over the server's (ValueError naming what the model lacks)."""
    decoding = req.decoding(server.defaults(model))
    if decoding.shortlist and not has_shortlist(model):
        raise ValueError(f"shortlist: the model {model.name} has none (nanomt shortlist builds it)")
    return decoding


async def translate_texts(server, request: Request, req: TranslateRequest) -> TranslateResponse:
    """nanomt's /translate: through one model, or two through the pivot language (the last one gets the prefixes
    and the glossary, which are the target language's). A text is one sentence, or with `split` a document."""
    models = route(server, req.source, req.target)
    decodings = []
    for hop, model in enumerate(models):
        last = hop == len(models) - 1
        try:
            decoding = request_decoding(server, req, model)
            decodings.append(decoding if last else decoding.replace(glossary=()))
            prepare(model.tokenizer, model.cfg, req.text, decoding, req.prefix if last else None)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
    start = time.perf_counter()
    threshold = req.min_confidence if req.min_confidence is not None else server.config.min_confidence
    scores, extra, way = None, {}, Route(server, request, models, decodings)
    if req.confidence or threshold is not None:
        texts, cut, scores, sentences = await _confident(way, req)
        extra = confidence.fields(sentences, threshold, models[-1].name)
    elif req.split or req.scores:
        results = await way.paragraphs(req.text, req.split)
        texts, cut = [r.text for r in results], [i for i, r in enumerate(results) if r.cut]
        scores = [r.score for r in results]
    else:
        texts, cut = await way.sentences(req.text, req.prefix), _cut(models[0], req.text)
    glossary = decodings[-1].glossary
    missed = [i for i, (src, out) in enumerate(zip(req.text, texts)) if not has_terms(glossary, src, out)]
    recalled = getattr(request.state, "from_memory", set())
    memory = [i for i, text in enumerate(req.text) if any(s in text for s in recalled)]
    return TranslateResponse(
        translations=texts,
        seconds=round(time.perf_counter() - start, 4),
        scores=[round(s, 4) for s in scores] if req.scores else None,
        cut=cut or None,
        terms_missed=missed or None,
        route=[m.name for m in models] if len(models) > 1 else None,
        memory=memory or None,
        **extra,
    )


def _cut(model: Model, texts: list[str]) -> list[int]:
    """The texts longer than the model's positions (translated in pieces)."""
    limit = src_limit(model.cfg)
    return [i for i, ids in enumerate(model.tokenizer.encode_src(texts)) if len(ids) > limit]


async def _confident(way: Route, req: TranslateRequest) -> tuple[list[str], list[int], list[float], list]:
    """Translations, cut texts, scores and each text's (sentence, Confident) list: documents by their units, one
    sentence a text otherwise (with its prefix)."""
    if req.split:
        results = await way.paragraphs_confident(req.text, True)
        texts = [r.text for r, _ in results]
        return (
            texts,
            [i for i, (r, _) in enumerate(results) if r.cut],
            [r.score for r, _ in results],
            [s for _, s in results],
        )
    found = await way.confident(req.text, req.prefix)
    texts = [c.translation for c in found]
    return texts, _cut(way.models[0], req.text), [c.score for c in found], [[(t, c)] for t, c in zip(req.text, found)]


def add_routes(app: FastAPI, server) -> None:
    """POST /translate (both request shapes) and POST /attention."""

    @app.post(
        "/translate",
        response_model=TranslateResponse | libretranslate.LibreTranslateResponse,
        response_model_exclude_none=True,
        responses=ERRORS,
    )
    async def translate(request: Request):
        """Translate sentences: nanomt's {"text": [...]} (beam search, or sampling given a sampling setting), or
        LibreTranslate's {"q": ..., "source": "auto", "target": ...} as JSON or a form."""
        body = await read_body(request)
        if isinstance(body, FormFields) and "q" not in body:  # the schema's form is LibreTranslate's: a 422, not a 415
            raise HTTPException(422, f"invalid request: q: Field required ({NOT_JSON})")
        if isinstance(body, FormFields) or (isinstance(body, dict) and "q" in body and "text" not in body):
            return await libretranslate.translate(server, request, validate(libretranslate.LibreTranslateRequest, body))
        req = validate(TranslateRequest, body)
        await server.check_key(request, req.api_key, sum(map(len, req.text)))
        check_size(req.text, server.config.sentence_limit, server.config.max_chars)
        return await translate_texts(server, request, req)

    @app.post("/attention", response_model=AttentionResponse, responses=ERRORS)
    async def attention(request: Request, req: AttentionRequest) -> AttentionResponse:
        """Translate one sentence and return its cross-attention, every layer and head."""
        await server.check_key(request, req.api_key, len(req.text))
        check_size([req.text], 1, server.config.max_chars)
        model = _one_model(server, req)
        try:
            decoding = request_decoding(server, req, model)
            prepare(model.tokenizer, model.cfg, [req.text], decoding, None)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        start = time.perf_counter()
        [att] = await server.decode(request, model, Kind.ATTENTION, decoding, [req.text])  # alone, in its turn
        return AttentionResponse(
            src_tokens=att.src_tokens,
            tgt_tokens=att.tgt_tokens,
            translation=att.translation,
            # float64 before rounding, so that JSON gets 0.9964 and not float32's 0.996399998664856
            cross_attention=[w.astype(np.float64).round(4).tolist() for w in att.cross],  # per layer (H, T, S)
            seconds=round(time.perf_counter() - start, 4),
        )


def _one_model(server, req: AttentionRequest) -> Model:
    """The one model of an attention request's pair: attention through two models has no one matrix."""
    models = route(server, req.source, req.target)
    if len(models) > 1:
        raise HTTPException(400, f"no one model translates {models[0].source} to {models[-1].target}: no attention")
    return models[0]
