"""The API's one error shape, {"error": "...", "detail": ...}, and the reading of request bodies that gives it."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qsl

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException


def error(status: int, message: str, detail=None, headers: dict | None = None) -> JSONResponse:
    """The one error body of the API: {"error": "...", "detail": ...} (LibreTranslate's clients read "error")."""
    return JSONResponse({"error": message, "detail": detail}, status_code=status, headers=headers)


# The labels pydantic puts in an error's place for the branch of a union that failed ("str", "list[str]",
# "function-before[_no_lone_surrogate(), str]"): its internals, not the request's fields.
BRANCH = re.compile(r"^(str|int|float|bool|none|list|dict)$|\[")
SHOULD = "Input should be "


def describe(errors: list[dict]) -> str:
    """A one-line summary of pydantic's errors, each place as the request names it, e.g. 'text: Input should be a
    valid list' ('q: Input should be a valid string or a valid list' for a field taking either)."""
    said: dict[str, list[str]] = {}
    for e in errors:
        place = (x for x in e.get("loc", ()) if x != "body" and not (isinstance(x, str) and BRANCH.search(x)))
        said.setdefault(".".join(map(str, place)), []).append(e.get("msg", "invalid"))
    parts = []
    for loc, msgs in said.items():
        msgs = list(dict.fromkeys(msgs))
        if len(msgs) > 1 and all(m.startswith(SHOULD) for m in msgs):
            msgs = [SHOULD + " or ".join(m[len(SHOULD) :] for m in msgs)]
        parts += [f"{loc}: {m}" if loc else m for m in msgs]
    return "; ".join(parts)


def json_safe(errors: list[dict]) -> list[dict]:
    """pydantic error dicts without their `ctx`/`input` objects, which may not be JSON-serializable."""
    return [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in errors]


def invalid(errors: list[dict]) -> JSONResponse:
    """A 400 for text that is no text (a lone surrogate), else a 422 naming every invalid field."""
    errors = json_safe(errors)
    bad_text = [e for e in errors if e.get("type") == "lone_surrogate"]
    if bad_text:
        return error(400, "invalid text: " + describe(bad_text), errors)
    return error(422, "invalid request: " + describe(errors), errors)


class Refused(Exception):
    """An early answer from inside an endpoint (a JSONResponse), e.g. a 422 of a body parsed by hand."""

    def __init__(self, response: JSONResponse):
        self.response = response


def check_size(texts: list[str], max_sentences: int, max_chars: int) -> None:
    """413 when a request holds more sentences or characters than the server takes."""
    if len(texts) > max_sentences:
        raise HTTPException(413, f"{len(texts)} sentences in one request; the limit is {max_sentences}")
    chars = sum(len(t) for t in texts)
    if chars > max_chars:
        raise HTTPException(413, f"{chars} characters in one request; the limit is {max_chars}")


FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
NOT_JSON = (
    "send a JSON body with the header Content-Type: application/json (a form body is LibreTranslate's request, "
    "with a field q)"
)


class FormFields(dict):
    """A form's fields (LibreTranslate's request shape), as read_body gives them."""


async def read_body(request: Request) -> object:
    """The parsed body: JSON, or a form's fields (FormFields; a repeated q is a list); malformed JSON is a 400."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    if content_type == FORM:
        fields: dict = {}
        for k, v in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
            if k == "q" and k in fields:
                fields[k] = [*(fields[k] if isinstance(fields[k], list) else [fields[k]]), v]
            else:
                fields[k] = v
        for k in ("alternatives",):
            if isinstance(fields.get(k), str) and fields[k].isdigit():
                fields[k] = int(fields[k])
        if fields.get("confidence") in ("true", "false"):  # a form's boolean is text
            fields["confidence"] = fields["confidence"] == "true"
        return FormFields(fields)
    if "json" not in content_type:  # e.g. curl -d without -H, or text/plain
        raise Refused(error(415, NOT_JSON))
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise Refused(error(400, f"malformed JSON: {e.msg} at character {e.pos}")) from None
    except UnicodeDecodeError as e:
        raise Refused(error(400, f"malformed JSON: not UTF-8 ({e.reason} at byte {e.start})")) from None


def validate(model: type[BaseModel], body: object) -> BaseModel:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise Refused(invalid(e.errors())) from None


def add_error_handlers(app: FastAPI) -> None:
    """Every error comes back as {"error", "detail"}; malformed JSON or text is a 400, a body that is not JSON a 415."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = json_safe(exc.errors())
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if "json" not in content_type and content_type not in (FORM, MULTIPART):  # e.g. text/plain
            return error(415, "send a JSON body with the header Content-Type: application/json", errors)
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            at = bad_json[0]["loc"][-1]  # FastAPI puts the character offset of the syntax error last
            return error(400, f"malformed JSON: {bad_json[0]['msg']} at character {at}", errors)
        return invalid(errors)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return exc.response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail), headers=exc.headers)  # keeps e.g. a 405's Allow header

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still re-raises the exception afterwards, so the server logs its traceback.
        return error(500, f"internal server error: {type(exc).__name__}")


class ErrorBody(BaseModel):
    """The one error body of the API."""

    error: str
    detail: object = None


def errors(*codes: int) -> dict:
    """The error responses of a route, for its OpenAPI description (each with the one error body)."""
    return {code: {"description": ERROR_CODES[code], "model": ErrorBody} for code in codes}


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "schema": {"type": "integer"}}}
ERROR_CODES = {
    400: "malformed JSON or text, a language not served",
    403: "missing or wrong API key",
    404: "no such file, or no longer kept",
    413: "a body past its limit, too many sentences or characters",
    415: "neither JSON nor LibreTranslate's form, or a file type not translated",
    422: "invalid fields",
    429: "past the requests a minute of the key or address, or past its wrong keys (with Retry-After)",
    503: "the queue is full, the server is shutting down, or the store is unreachable (with Retry-After)",
    504: "not translated within the server's timeout",
    507: "the translation memory holds as many corrections as it may",
}
ERRORS = errors(400, 403, 413, 415, 422, 429, 503, 504)  # every route that translates
