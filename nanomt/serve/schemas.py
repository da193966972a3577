"""nanomt's own API: its request and response bodies, checked by pydantic where a request enters."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictStr,
    confloat,
    conint,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from nanomt.core.decoding import RULES, Decoding, DecodingError, Sampling
from nanomt.core.settings import fields_at
from nanomt.decoding.glossary import checked


def _integral(value):
    """JSON Schema's integer: 1.0 is one (the OpenAPI schema says integer, so a client may send it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _number(value):
    """JSON Schema's number: 1 is one (a float here)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


# Strict: `true` or "5" are type errors, not numbers; an integral float (1.0) is the integer it equals, an integer
# the float it equals. Bounds go inside the type, where the OpenAPI schema gets them as minimum and maximum.
def json_int(**bounds):
    """A strict integer within `bounds` (conint's), that takes an integral float."""
    return Annotated[conint(strict=True, **bounds), BeforeValidator(_integral)]


def json_float(**bounds):
    """A strict finite float within `bounds` (confloat's), that takes an integer."""
    return Annotated[confloat(strict=True, allow_inf_nan=False, **bounds), BeforeValidator(_number)]


JsonInt = json_int()
SURROGATE = re.compile("[\ud800-\udfff]")
SEED = "seed"  # a Sampling option of the draw: alone it does not switch sampling on


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


# Rules across fields that the JSON schema does not express; a request that breaks one is a 422 of this type, and
# the schema's description of the request lists them (tests/serve/test_schema.py accepts these refusals, no others).
# A Decoding's own rules come from it (nanomt.core.decoding.RULES); these are the request's.
CROSS_FIELD_RULES = {
    "seed_without_sampling": "seed only with temperature, top_k or top_p",
    **RULES,
    "prefix_with_split": "no prefix with split",
    "prefix_count": "one prefix per text",
}
# A request field of a setting that is no number, bool or choice: its JSON shape, and the value it gives.
GLOSSARY = list[tuple[Text, Text]] | dict[Text, Text]
SHAPES = {
    tuple[tuple[str, str], ...]: (GLOSSARY, lambda v: checked(list(v.items() if isinstance(v, dict) else v))),
}


def request_type(f: dataclasses.Field, hint) -> object:
    """The JSON type of a setting's request field: its bounds (a request's `cap` where tighter) inside the type,
    where the OpenAPI schema gets them as minimum and maximum."""
    meta = f.metadata
    if hint in SHAPES:
        return SHAPES[hint][0]
    if meta["choices"]:
        return Literal[tuple(meta["choices"])]
    if hint is bool:
        return StrictBool
    low = {k: v for k, v in meta["bounds"].items() if k in ("ge", "gt")}
    high = {k: v for k, v in meta["bounds"].items() if k in ("le", "lt")}
    cap = meta["cap"]
    low = {k: v for k, v in cap.items() if k in ("ge", "gt")} or low
    high = {k: v for k, v in cap.items() if k in ("le", "lt")} or high
    kind = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
    return (json_int if kind is int else json_float)(**low, **high)


def request_fields(cls: type) -> dict:
    """create_model's fields for the settings of `cls` (Decoding, Sampling) that a request takes: each optional,
    described by its help (None: the server's)."""
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in fields_at(cls, "request"):
        default = "" if cls is Sampling else " (default: the server's)"
        fields[f.name] = (
            request_type(f, hints[f.name]) | None,
            Field(default=None, description=f.metadata["help"] + default),
        )
    return fields


class DecodingSettings(BaseModel):
    """The decoding settings a request may change (any sampling setting but the seed samples); the server's
    otherwise. Its fields are Decoding's and Sampling's that a request takes (DecodingRequest)."""

    model_config = {"json_schema_extra": {"x-rules": list(CROSS_FIELD_RULES.values())}}

    @model_validator(mode="after")
    def _rules(self):
        if self.sampling() is None and getattr(self, SEED) is not None:
            raise PydanticCustomError(
                "seed_without_sampling", "seed applies to sampling: set temperature, top_k or top_p too"
            )
        try:
            Decoding().replace(**self.changes(converted=False))
        except DecodingError as e:
            raise PydanticCustomError(e.rule, str(e)) from None
        return self

    def changes(self, converted: bool = True) -> dict:
        """The Decoding settings the request gives (None: the server's); a shaped one's value made, and checked,
        where `converted` (a glossary's terms)."""
        hints = typing.get_type_hints(Decoding)
        changes = {"sampling": self.sampling()}
        for f in fields_at(Decoding, "request"):
            value = getattr(self, f.name)
            if value is not None and hints[f.name] in SHAPES:
                value = (
                    SHAPES[hints[f.name]][1](value)
                    if converted
                    else tuple(value.items() if isinstance(value, dict) else value)
                )
            changes[f.name] = value
        return changes

    def decoding(self, defaults: Decoding) -> Decoding:
        """The request's settings over the server's: built and checked here, where the request enters."""
        return defaults.replace(**self.changes())

    def sampling(self) -> dict | None:
        """The request's nanomt.core.decoding.Sampling fields, or None to search (greedy or beam)."""
        given = {f.name: getattr(self, f.name) for f in fields_at(Sampling, "request")}
        given = {k: v for k, v in given.items() if v is not None}
        return given if set(given) - {SEED} else None


DecodingRequest = create_model(
    "DecodingRequest",
    __base__=DecodingSettings,
    __doc__=DecodingSettings.__doc__,
    __module__=__name__,
    **request_fields(Decoding),
    **request_fields(Sampling),
)


def one_or_a_list(schema: dict) -> None:
    """A list of strings that takes one string alone too (made a list of one before it is checked): its schema."""
    listed = {k: schema.pop(k) for k in ("type", "items", "minItems") if k in schema}
    schema["anyOf"] = [{"type": "string"}, listed]


def one_or_a_list_or_null(schema: dict) -> None:
    """one_or_a_list for an optional field (its schema anyOf [list, null])."""
    listed = next(option for option in schema["anyOf"] if option.get("type") == "array")
    schema["anyOf"] = [{"type": "string"}, listed, {"type": "null"}]


class TranslateRequest(DecodingRequest):
    """Sentences to translate; one string is taken as a list of one."""

    text: list[Text] = Field(
        min_length=1, description="sentences (a single string is accepted)", json_schema_extra=one_or_a_list
    )
    prefix: list[Text | None] | None = Field(
        default=None,
        description="per sentence, target text its translation starts with (null: none); one string for one sentence",
        json_schema_extra=one_or_a_list_or_null,
    )
    split: StrictBool = Field(
        default=False,
        description="each text is a document: sentences split and translated, spacing and line breaks kept, URLs, "
        "e-mail addresses, code and emojis kept as they are (false: each text is one sentence)",
    )
    scores: StrictBool = Field(default=False, description="return each translation's score (summed over sentences)")
    confidence: StrictBool = Field(
        default=False,
        description="return each translation's confidence: the model's estimate of its sentence chrF / 100 (a text "
        "of several sentences: theirs, weighted by their characters), each sentence's, and each word's probability",
    )
    min_confidence: json_float(ge=0, le=1) | None = Field(
        default=None,
        description="list the texts with a sentence whose confidence is below this (default: the server's "
        "--min-confidence); nothing is left out of the translations",
    )
    source: StrictStr | None = Field(
        default=None, min_length=1, description="source language code (default: the first model's)"
    )
    target: StrictStr | None = Field(
        default=None, min_length=1, description="target language code (default: the first model's)"
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
    def _prefixes_fit(self):
        if self.split and self.prefix is not None:
            raise PydanticCustomError(
                "prefix_with_split", "prefix forces the start of one sentence's translation: not with split"
            )
        if self.prefix is not None and len(self.prefix) != len(self.text):
            raise PydanticCustomError(
                "prefix_count", "prefix: one entry per sentence ({n} sentences, {m} prefixes)",
                {"n": len(self.text), "m": len(self.prefix)},
            )  # fmt: skip
        return self


class WordProbability(BaseModel):
    """A target word and its probability (the product of its pieces')."""

    word: str
    probability: float


class SentenceConfidence(BaseModel):
    """One sentence of a text (a unit of a document) with its translation and how far to trust it."""

    source: str
    translation: str
    # Left out (null) where the model has no calibration, or the sentence came from the translation memory.
    confidence: float | None = None
    confidence_raw: float | None = None  # left out: from the translation memory
    words: list[WordProbability]
    doubtful: list[str]  # the words whose probability is under 0.5
    low: bool | None = None  # with a min_confidence: whether its confidence is under it
    memory: bool | None = None  # true: a correction from the translation memory (a person's, not the model's)


class TranslateResponse(BaseModel):
    """One translation per input sentence, in order, and the model time."""

    translations: list[str]
    seconds: float
    scores: list[float] | None = None  # with scores: each translation's score (length-penalized log-probability)
    # texts with a sentence longer than the model's positions: translated in pieces and joined, nothing left out
    cut: list[int] | None = None
    # sentences whose translation lacks a term the glossary asks for (it could not be placed within the length limit)
    terms_missed: list[int] | None = None
    # the language pairs the translations went through, where no one model translates the pair
    route: list[str] | None = None
    # texts with a sentence answered from the translation memory (a correction sent to /suggest), not the model
    memory: list[int] | None = None
    # with confidence (or a min_confidence): each text's confidence, null where the model has no calibration
    confidence: list[float | None] | None = None
    confidence_raw: list[float | None] | None = None  # each text's raw score: its tokens' mean log-probability
    calibrated: bool | None = None  # false: the model has no calibration (nanomt calibrate), raw scores only
    sentences: list[list[SentenceConfidence]] | None = None  # each text's sentences, as translated
    low_confidence: list[int] | None = None  # texts with a sentence under min_confidence


class AttentionRequest(DecodingRequest):
    """One sentence whose translation and cross-attention to return, decoded with the settings /translate takes."""

    text: Text = Field(min_length=1)
    source: StrictStr | None = Field(
        default=None, min_length=1, description="source language code (default: the first model's)"
    )
    target: StrictStr | None = Field(
        default=None, min_length=1, description="target language code (default: the first model's)"
    )
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")


class AttentionResponse(BaseModel):
    """Subword tokens and the cross-attention weights [layer][head][target][source]."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    translation: str
    cross_attention: list[list[list[list[float]]]]
    seconds: float
