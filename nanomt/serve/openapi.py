"""The OpenAPI schema the server publishes, saying what it takes and answers: the bodies parsed by hand (both shapes
of POST /translate, /detect, /suggest), the languages it serves as each code field's enum, the one error body on
every error response, Retry-After on the 429s and 503s, and how a key is sent (security schemes)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from nanomt.serve import libretranslate
from nanomt.serve.access import SECURITY
from nanomt.serve.errors import FORM, RETRY_AFTER
from nanomt.serve.schemas import AttentionRequest, TranslateRequest

BODIES = (
    TranslateRequest,
    libretranslate.LibreTranslateRequest,
    libretranslate.DetectRequest,
    libretranslate.SuggestRequest,
)
KEYED = ("/translate", "/attention", "/detect", "/suggest", "/translate_file")


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def describe(app: FastAPI, server) -> None:
    """Make app.openapi() build (once) the schema described in the module's docstring."""

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        _bodies(schema)
        _languages(schema, server)
        _retry_after(schema)
        _security(schema, server)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def _bodies(schema: dict) -> None:
    defs = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in BODIES:
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        defs.update(body.pop("$defs", {}))
        defs[model.__name__] = body
    libre = ref("LibreTranslateRequest")
    schema["paths"]["/translate"]["post"]["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"oneOf": [ref("TranslateRequest"), libre]}},
            FORM: {"schema": libre},
        },
    }
    for path, body in (("/detect", "DetectRequest"), ("/suggest", "SuggestRequest")):
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(body)}, FORM: {"schema": ref(body)}},
        }


def _languages(schema: dict, server) -> None:
    """Each code field's enum: the languages the server translates from and to (LibreTranslate's source: and auto)."""
    models = server.models
    sources = models.sources()
    targets = sorted({t for s in sources for t in models.targets(s)})
    direct = (sorted({m.source for m in models.models}), sorted({m.target for m in models.models}))
    codes = {
        TranslateRequest.__name__: (sources, targets),
        AttentionRequest.__name__: (sources, targets),
        libretranslate.LibreTranslateRequest.__name__: ([*sources, "auto"], targets),
        libretranslate.SuggestRequest.__name__: direct,  # a correction is one model's
    }
    defs = schema["components"]["schemas"]
    for name, (source, target) in codes.items():
        for field, enum in (("source", source), ("target", target)):
            _enum(defs[name]["properties"][field], enum)
    form = schema["paths"]["/translate_file"]["post"]["requestBody"]["content"]
    for body in form.values():  # a file's source is given, never auto
        _enum(body["schema"]["properties"]["source"], sources)
        _enum(body["schema"]["properties"]["target"], targets)


def _enum(prop: dict, values: list[str]) -> None:
    """An optional field's schema is anyOf [string, null]: the enum goes on its string."""
    for option in prop.get("anyOf", [prop]):
        if option.get("type") == "string":
            option["enum"] = list(values)


def _retry_after(schema: dict) -> None:
    for operation in (op for path in schema["paths"].values() for op in path.values()):
        for code in ("429", "503"):
            if code in operation.get("responses", {}):
                operation["responses"][code]["headers"] = RETRY_AFTER


def _security(schema: dict, server) -> None:
    """The header ways of sending a key (the body's api_key field is the third); optional where none is required."""
    schema["components"]["securitySchemes"] = SECURITY
    ways = [{name: []} for name in SECURITY]
    for path in KEYED:
        schema["paths"][path]["post"]["security"] = ways if server.key_required else [{}, *ways]
