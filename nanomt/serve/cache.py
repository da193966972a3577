"""The sentence cache: a sentence translated once is answered again without decoding, by every replica sharing the
store, for as long as nothing it depends on changes."""

from __future__ import annotations

import json

from nanomt.serve.store.layout import Layout, digest


class SentenceCache:
    """Translations by a digest of everything they depend on: the model's fingerprint (weights, tokenizer, shortlist
    table, int8), its pair, the kind of answer and the decoding settings (the frozen Decoding's text form), the
    sentence and its forced prefix, and with --cache-per-key the client's partition; bounded in number and age."""

    def __init__(self, store, layout: Layout, size: int, age: float):
        self.store, self.layout, self.size, self.age = store, layout, size, age

    def key(self, fingerprint: str, pair: str, setting: str, text: str, prefix: str | None, partition: str = "") -> str:
        return self.layout.cache(digest(fingerprint, pair, setting, text, prefix, partition))

    def get_many(self, keys: list[str]) -> list:
        return [None if v is None else json.loads(v) for v in self.store.get_many(keys)]

    def put_many(self, entries: list[tuple[str, object]]) -> None:
        bounds = ((self.layout.group("cache"), self.size),)
        for key, value in entries:
            self.store.put(key, json.dumps(value, ensure_ascii=False).encode(), self.age, bounds)
