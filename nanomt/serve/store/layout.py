"""The keys of everything a server keeps, in every backend, under one namespace (--store-namespace), so that
staging and production on one Redis keep apart."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

DEFAULT_NAMESPACE = "nanomt"
NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def digest(*fields) -> str:
    """A short stable hash (128 bits) of fields, unambiguous: their JSON list, so no field's text can read as
    another's (NUL, separators, any character)."""
    text = json.dumps(list(fields), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class Layout:
    """Each kind of key; a group is a bounded set of values (its oldest dropped past the bound)."""

    namespace: str = DEFAULT_NAMESPACE

    def __post_init__(self):
        if not NAMESPACE.fullmatch(self.namespace):
            raise ValueError(f"store namespace {self.namespace!r}: use 1-64 letters, digits and _ . -")

    def key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def rate(self, client: str) -> str:
        """A client's counted requests of the last window (key:NAME, master or ip:ADDRESS)."""
        return self.key("rate", client)

    def guesses(self, address: str) -> str:
        """The wrong keys an address sent in the last window."""
        return self.key("fail", address)

    def file(self, name: str) -> str:
        """A translated file awaiting download: its media type, NUL, its bytes."""
        return self.key("file", name)

    def job(self, id_: str) -> str:
        """A file job's record: JSON {id, client, filename, status, sentences_done, sentences_total, ...}."""
        return self.key("job", id_)

    def job_cancel(self, id_: str) -> str:
        """A file job's cancel flag, set by a DELETE on any replica, read by the one that runs the job."""
        return self.key("job-cancel", id_)

    def cache(self, fingerprint: str) -> str:
        """A sentence's translation, by a digest of everything it depends on."""
        return self.key("cache", fingerprint)

    def correction(self, pair: str, sentence: str) -> str:
        """A correction served for a pair's sentence: JSON {id, pair, source, translation, by, at}."""
        return self.key("memory", pair, sentence)

    def suggestion(self, id_: str) -> str:
        """A suggestion kept for review, never served until approved: the same JSON."""
        return self.key("pending", id_)

    def group(self, name: str) -> str:
        return self.key("group", name)
