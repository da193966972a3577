"""The server's settings: one frozen ServeConfig, checked once where it is built (the CLI's defaults are its own)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_BEAM = 16
# Each language pair is served by one run: "runs/de_en", or "de-en=runs/de_en" to name its pair.
PAIR_SPEC = re.compile(
    r"^(?P<source>[A-Za-z]{2,3}(?:_[A-Za-z0-9]+)?)-(?P<target>[A-Za-z]{2,3}(?:_[A-Za-z0-9]+)?)=(?P<path>.+)$"
)


@dataclass(frozen=True)
class ModelSpec:
    """A run to serve and, where given, the language pair it translates (else its config's)."""

    path: str
    source: str | None = None
    target: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """`RUN` or `SRC-TGT=RUN`, as `nanomt serve` takes them."""
        m = PAIR_SPEC.match(text)
        return cls(m["path"], m["source"], m["target"]) if m else cls(text)


@dataclass(frozen=True)
class ServeConfig:
    """How `nanomt serve` serves its models: limits, batching, keys, decoding defaults, where it listens."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_sentences: int = 64  # sentences a request may hold
    max_chars: int = 10_000  # characters a request may hold
    default_beam: int | None = None  # None: each model's decode.beam_size
    max_batch_tokens: int | None = None  # None: each model's decode.max_tokens
    batching: bool = True  # False: each request decoded alone (no shared batches), to compare with
    max_wait_ms: float = 5.0
    queue_size: int = 256
    timeout: float | None = 60.0
    api_key: str | None = None
    keys_file: str | None = None  # several keys with limits of their own (nanomt/serve/keys.py's format)
    req_limit: int | None = None  # a key's requests a minute where its line gives none (None: no limit)
    char_limit: int | None = None  # a key's characters a request where its line gives none (None: no limit)
    languages: tuple[str, str] | None = None  # the pair of a model given as a Translator (create_app)
    glossary: tuple[tuple[str, str], ...] = ()
    pivot: str = "en"  # a pair without a model of its own is translated through this language
    max_loaded: int | None = None  # models in memory at once; the least recently used is unloaded (None: all)
    device: str = "cpu"
    int8: bool = False
    access_log: bool = True
    models: tuple[ModelSpec, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if self.default_beam is not None and not 1 <= self.default_beam <= MAX_BEAM:
            raise ValueError(f"beam size must be in 1..{MAX_BEAM}, got {self.default_beam}")
        if self.timeout is not None and not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        positive = ("max_batch_tokens", "queue_size", "max_sentences", "max_chars", "req_limit", "char_limit")
        for name, least in ((n, 1) for n in positive):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_loaded is not None and self.max_loaded < 1:
            raise ValueError(f"max_loaded must be >= 1, got {self.max_loaded}")
        if self.api_key == "":  # an empty key is no key
            object.__setattr__(self, "api_key", None)

    @property
    def grace_seconds(self) -> int | None:
        """How long a graceful shutdown may take: past the timeout every request has been answered (504 at worst)."""
        return None if self.timeout is None else math.ceil(self.timeout) + 5
