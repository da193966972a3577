"""nanomt's own API: its request and response bodies, checked by pydantic where a request enters."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictBool,
    StrictStr,
    confloat,
    conint,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from nanomt.core.decoding import Decoding
from nanomt.decoding.glossary import checked
from nanomt.serve.settings import MAX_BEAM


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
BeamSize = json_int(ge=1, le=MAX_BEAM)
SURROGATE = re.compile("[\ud800-\udfff]")
SAMPLING = ("temperature", "top_k", "top_p")
MIN_FACTOR, MAX_FACTOR = 1e-3, 1e3  # the range of a temperature or a repetition penalty


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
# the schema's description of the request lists them (tests/test_schema.py accepts these refusals, no others).
CROSS_FIELD_RULES = {
    "seed_without_sampling": "seed only with temperature, top_k or top_p",
    "beam_with_sampling": "beam_size 1 (or none) with sampling",
    "prefix_with_split": "no prefix with split",
    "prefix_count": "one prefix per text",
}


class DecodingRequest(BaseModel):
    """The decoding settings a request may change (any sampling setting samples instead); the server's otherwise."""

    model_config = {"json_schema_extra": {"x-rules": list(CROSS_FIELD_RULES.values())}}

    beam_size: BeamSize | None = Field(default=None, description="default: the server's")
    # Bounded where float32 logits stay finite once divided (a temperature of 1e-40 made them inf: a 500).
    temperature: json_float(ge=MIN_FACTOR, le=MAX_FACTOR) | None = Field(
        default=None, description="sample at this temperature (default 1 when sampling)"
    )
    top_k: json_int(ge=0) | None = Field(default=None, description="sample from the k likeliest tokens (0: all)")
    top_p: json_float(gt=0, le=1) | None = Field(default=None, description="nucleus sampling (1: off)")
    seed: json_int(ge=0, lt=2**64) | None = Field(
        default=None, description="makes sampling reproducible (default: a fresh draw)"
    )
    glossary: list[tuple[Text, Text]] | dict[Text, Text] | None = Field(
        default=None, description="[source term, target term] pairs (or an object): terms the translations use"
    )
    no_repeat_ngram_size: json_int(ge=0) | None = Field(default=None, description="no n-gram twice (0: off)")
    repetition_penalty: json_float(ge=MIN_FACTOR, le=MAX_FACTOR) | None = Field(
        default=None, description="> 1 discourages repeated tokens (1: off)"
    )
    shortlist: StrictBool | None = Field(
        default=None, description="decode over the model's vocabulary shortlist (faster; the model needs one)"
    )

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

    def decoding(self, defaults: Decoding) -> Decoding:
        """The request's settings over the server's: built and checked here, where the request enters."""
        pairs = self.glossary.items() if isinstance(self.glossary, dict) else self.glossary
        return defaults.replace(
            beam_size=self.beam_size,
            sampling=self.sampling(),
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            repetition_penalty=self.repetition_penalty,
            glossary=None if pairs is None else checked(list(pairs), "glossary"),
            shortlist=self.shortlist,
        )

    def sampling(self) -> dict | None:
        """The request's nanomt.core.decoding.Sampling fields, or None to search (greedy or beam)."""
        if all(getattr(self, k) is None for k in SAMPLING):
            return None
        settings = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed}
        return {k: v for k, v in settings.items() if v is not None}


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
