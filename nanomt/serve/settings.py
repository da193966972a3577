"""The server's settings: one frozen ServeConfig, checked once where it is built; its fields are `nanomt serve`'s flags.

Standard library only (the glossary reader imported when a file is read): `nanomt serve --help` needs no FastAPI.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

from nanomt.core.decoding import MAX_REQUEST_BEAM
from nanomt.core.languages import PAIR_CODE
from nanomt.core.settings import setting
from nanomt.documents.limits import MAX_FILE_BYTES
from nanomt.serve.store.layout import Layout

BODY_SLACK = 65_536  # bytes of JSON syntax and escapes, or of a form's headers and fields, beyond the content
# Each language pair is served by one run: "runs/de_en", or "de-en=runs/de_en" to name its pair.
PAIR_SPEC = re.compile(rf"^(?P<source>{PAIR_CODE})-(?P<target>{PAIR_CODE})=(?P<path>.+)$")


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


def read_models(texts: list[str]) -> tuple[ModelSpec, ...]:
    """The models `nanomt serve` takes: `RUN` or `SRC-TGT=RUN` each."""
    return tuple(ModelSpec.parse(text) for text in texts)


def read_glossary_file(path: str) -> tuple[tuple[str, str], ...]:
    """A glossary file ('source term<TAB>target term' lines) as ServeConfig's glossary."""
    from nanomt.decoding.glossary import read_glossary

    return read_glossary(path)


def proxy_networks(text: str | None) -> tuple:
    """Comma-separated addresses and networks as ip_network values; '*' and any other entry (a name, a socket path)
    kept as text, matched exactly, as uvicorn's --forwarded-allow-ips takes them."""
    out = []
    for entry in filter(None, (a.strip() for a in (text or "").split(","))):
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            out.append(entry)
    return tuple(out)


@dataclass(frozen=True)
class ServeConfig:
    """How `nanomt serve` serves its models: limits, batching, keys, decoding defaults, where it listens.

    A field made with `setting` (nanomt.core.settings) is a flag of `nanomt serve` (nanomt/cli/parser.py writes them
    from these fields);
    the others are set only through the Python API (create_app).
    """

    host: str = setting("127.0.0.1", help="address to bind (default %(default)s: this machine only)")
    port: int = setting(8000, help="port to listen on (default %(default)s)")
    max_sentences: int = setting(64, help="sentences a request may hold (default %(default)s)")
    max_chars: int = setting(10_000, help="characters a request may hold (default %(default)s)")
    file_limit: int | None = setting(
        None,
        help=f"bytes of a file /translate_file takes (default {MAX_FILE_BYTES:,}, as the page says); a body is "
        "refused (413) as soon as it streams past its limit, before any of it is kept",
    )
    default_beam: int | None = setting(None, flag="--beam", help="default beam size (default: each model's)")
    max_batch_tokens: int | None = setting(
        None,
        help="source tokens per decoding batch: requests waiting together share one up to this budget "
        "(default: the first model's decode.max_tokens)",
    )
    batching: bool = setting(
        True,
        flag="--one-lock",
        help="decode every request alone, never in a batch shared with others (to compare with)",
    )
    max_wait_ms: float = setting(
        5.0, help="how long the oldest waiting request may wait for others to share its batch (default %(default)g)"
    )
    queue_size: int = setting(
        256, help="requests that may wait; one more is answered 503 with Retry-After (default %(default)s)"
    )
    timeout: float | None = setting(
        60.0, help="seconds a request may take; past it the answer is 504, its sentences dropped (default %(default)g)"
    )
    api_key: str | None = setting(
        None,
        help="require this key (body api_key, or the header Authorization: Bearer KEY) on /translate, /attention "
        "and /detect; default: the environment variable NANOMT_API_KEY, else no key (prefer the variable: "
        "a command line is visible to other users of the machine)",
    )
    keys_file: str | None = setting(
        None,
        metavar="FILE",
        help="API keys, hashed, with limits of their own (`python -m nanomt.serve.keys new`; docs/serving.md)",
    )
    req_limit: int | None = setting(
        None,
        help="requests a minute of each client: a key without a limit of its own, and a request without a key per "
        "client address (LibreTranslate's --req-limit; default: no limit)",
    )
    char_limit: int | None = setting(
        None,
        help="characters a request of each client, unless its key's line says (LibreTranslate's --char-limit; "
        "default: --max-chars)",
    )
    batch_limit: int | None = setting(
        None, help="texts a request, for the whole server (LibreTranslate's --batch-limit; default: --max-sentences)"
    )
    forwarded_allow_ips: str | None = setting(
        None,
        metavar="IPS",
        help="comma-separated addresses or networks (CIDR) of trusted reverse proxies ('*': any sender): a request "
        "from one of them is counted against the rightmost address of its X-Forwarded-For header that is no trusted "
        "proxy (the addresses left of it are the client's to write); default: none, the connection's address",
    )
    store: str | None = setting(
        None,
        metavar="URL",
        help="where the server remembers rate-limit windows, files awaiting download, the sentence cache and the "
        "translation memory: memory:// (default: this process), sqlite:///PATH (one machine, survives restarts) "
        "or redis://HOST:PORT/DB (a fleet of replicas; docs/serving.md); default: the environment variable "
        "NANOMT_STORE, else memory:// (prefer the variable for a URL with a password: a command line is visible to "
        "other users of the machine)",
    )
    store_namespace: str = setting(
        "nanomt",
        metavar="NAME",
        help="the prefix of every key the server keeps in the store, so that two deployments on one Redis (staging "
        "and production) keep apart (default %(default)s)",
    )
    limits_fail_closed: bool = setting(
        False,
        help="while the store is unreachable, refuse (503) the requests a rate limit applies to (default: allow "
        "them; translations answer either way, the cache skipped)",
    )
    cache_size: int = setting(
        100_000,
        help="sentence translations the cache keeps, the oldest dropped first (0: no cache; default %(default)s)",
    )
    cache_age: float = setting(7 * 86400.0, help="seconds a cached translation is kept (default %(default)g)")
    cache_per_key: bool = setting(
        False,
        help="a cache of its own for each key (and each address without one), so that no client can tell from a "
        "fast answer what another has translated (default: one cache for all)",
    )
    suggestions: bool = setting(
        False,
        help="accept corrections (LibreTranslate's POST /suggest): a trusted key's (keys file trusted=yes, or "
        "--api-key) answer that sentence from then on; anyone else's wait for review (nanomt memory pending)",
    )
    max_corrections: int = setting(
        100_000, help="corrections the translation memory serves; past them a trusted /suggest is refused (507)"
    )
    languages: tuple[str, str] | None = None  # the pair of a model given as a Translator (create_app)
    glossary: tuple[tuple[str, str], ...] = setting(
        (),
        metavar="FILE",
        read=read_glossary_file,
        help="the default glossary ('source term<TAB>target term' lines) of every request",
    )
    min_confidence: float | None = setting(
        None,
        help="nanomt's /translate lists the texts with a sentence whose confidence (the model's estimate of its "
        "chrF / 100) is below this, in low_confidence, and returns the confidences; every model needs a calibration "
        "(nanomt calibrate). Nothing is left out (default: off)",
    )
    pivot: str = setting(
        "en", help="a pair no model translates goes through this language, with two models (default %(default)s)"
    )
    max_loaded: int | None = setting(
        None,
        help="models in memory at once; past it the least recently used is unloaded (default: all, loaded at start)",
    )
    device: str = setting("cpu", help="where the models run: cpu (default), cuda, cuda:N or mps")
    int8: bool = setting(
        False,
        help="int8 linear layers (CPU only), weights scaled per output row and inputs per row as in CTranslate2: "
        "faster decoding for a small BLEU cost (README, Speed)",
    )
    access_log: bool = setting(True, flag="--no-access-log", help="no JSON access log lines on stderr")
    metrics_key: str | None = setting(
        None,
        help="/metrics answers only requests with this key (Authorization: Bearer KEY; its counters and latencies tell "
        "whether a sentence was translated recently); default: the environment variable NANOMT_METRICS_KEY, else open",
    )
    no_docs: bool = setting(False, help="no /docs and no /openapi.json (the API's description)")
    models: tuple[ModelSpec, ...] = setting(
        flag="",
        metavar="CHECKPOINT",
        read=read_models,
        default_factory=tuple,
        help="a run to serve, or SRC-TGT=RUN to name its language pair (else its config's); one a language pair",
    )

    def __post_init__(self):
        if not 0 <= self.port <= 65535:  # else the socket's OverflowError, once the models are loaded
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.default_beam is not None and not 1 <= self.default_beam <= MAX_REQUEST_BEAM:
            raise ValueError(f"beam size must be in 1..{MAX_REQUEST_BEAM}, got {self.default_beam}")
        if self.timeout is not None and not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        positive = ("max_batch_tokens", "queue_size", "max_sentences", "max_chars", "req_limit", "char_limit")
        positive += ("batch_limit", "file_limit", "max_corrections")
        for name, least in ((n, 1) for n in positive):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        if not (self.max_wait_ms >= 0 and math.isfinite(self.max_wait_ms)):  # NaN or inf: a batch that never leaves
            raise ValueError(f"max_wait_ms must be >= 0 and finite, got {self.max_wait_ms}")
        if self.max_loaded is not None and self.max_loaded < 1:
            raise ValueError(f"max_loaded must be >= 1, got {self.max_loaded}")
        if self.cache_size < 0 or not (self.cache_age > 0 and math.isfinite(self.cache_age)):  # a store's TTL
            raise ValueError(
                f"cache_size must be >= 0 and cache_age > 0 and finite, got {self.cache_size}, {self.cache_age}"
            )
        if self.min_confidence is not None and not 0 <= self.min_confidence <= 1:
            raise ValueError(f"min_confidence must be in 0..1, got {self.min_confidence}")
        if self.api_key == "":  # an empty key is no key
            object.__setattr__(self, "api_key", None)
        Layout(self.store_namespace)  # a namespace the store's keys can hold, else the ValueError naming it

    def body_limit(self, path: str) -> int:
        """The most bytes a request body to `path` may have: a file and its form's fields on /translate_file and
        /file_jobs, else --max-chars of UTF-8 (4 bytes a character at most, 6 as a JSON escape) and JSON's syntax."""
        if path.endswith(("/translate_file", "/file_jobs")):
            return self.files_max_bytes + BODY_SLACK
        return 6 * self.max_chars + BODY_SLACK

    @property
    def files_max_bytes(self) -> int:
        """--file-limit, else the documents' own limit (nanomt.documents.files.MAX_FILE_BYTES, read when asked)."""
        from nanomt.documents import files

        return self.file_limit or files.MAX_FILE_BYTES

    @property
    def sentence_limit(self) -> int:
        """Texts a request may hold: --batch-limit within --max-sentences."""
        return min(self.max_sentences, self.batch_limit or self.max_sentences)

    @property
    def trusted_proxies(self) -> tuple:
        """--forwarded-allow-ips as networks, and '*' where any sender is a proxy."""
        return proxy_networks(self.forwarded_allow_ips)

    @property
    def grace_seconds(self) -> int | None:
        """How long a graceful shutdown may take: past the timeout every request has been answered (504 at worst)."""
        return None if self.timeout is None else math.ceil(self.timeout) + 5
