"""The translation memory: corrections of a pair's sentences (LibreTranslate's POST /suggest).

A correction answers other users only when its sender is trusted (a key marked trusted=yes, or the server's own
key); every other suggestion is kept for review and never served until an operator approves it
(`nanomt memory pending|approve|reject|delete STORE`), as LibreTranslate keeps its suggestions for review. Served
corrections are bounded (a trusted /suggest past the bound is refused); suggestions awaiting review are bounded and
expire, the oldest dropped first.
"""

from __future__ import annotations

import json
import time
import uuid
from xml.sax.saxutils import escape, quoteattr

from nanomt.serve.store.layout import Layout, digest

MAX_PENDING = 10_000  # suggestions awaiting review, the oldest dropped past it
PENDING_SECONDS = 30 * 86400.0  # and kept a month at most
MAX_CORRECTIONS = 100_000  # corrections served (--max-corrections)


def normalized(sentence: str) -> str:
    """A sentence as the translation memory matches it: whitespace runs as one space, none at the ends."""
    return " ".join(sentence.split())


class TranslationMemory:
    """Corrections and suggestions in the store; entries are JSON {id, pair, source, translation, by, at}."""

    def __init__(self, store, layout: Layout, max_corrections: int = MAX_CORRECTIONS):
        self.store, self.layout, self.max_corrections = store, layout, max_corrections
        self.served, self.waiting = layout.group("memory"), layout.group("pending")

    def key(self, pair: str, source: str) -> str:
        return self.layout.correction(pair, digest(normalized(source)))

    def suggest(self, pair: str, source: str, translation: str, by: str, trusted: bool) -> str | None:
        """Keep a suggestion: served at once from a trusted sender ("served"), else kept for review ("pending");
        "full" when the served corrections are at their bound, None when the store is down."""
        entry = {"id": uuid.uuid4().hex[:16], "pair": pair, "source": normalized(source)}
        entry.update(translation=translation.strip(), by=by, at=round(time.time(), 3))
        if not trusted:
            value = json.dumps(entry, ensure_ascii=False).encode()
            bounds = ((self.waiting, MAX_PENDING),)
            return "pending" if self._put(self.layout.suggestion(entry["id"]), value, PENDING_SECONDS, bounds) else None
        return self._serve(entry)

    def _serve(self, entry: dict) -> str | None:
        key = self.key(entry["pair"], entry["source"])
        held = 0 if self.store.get(key) is not None else self.store.count(self.served)  # a replaced one: no more
        if held is None:
            return None
        if held >= self.max_corrections:
            return "full"
        value = json.dumps(entry, ensure_ascii=False).encode()
        return "served" if self._put(key, value, None, ((self.served, self.max_corrections),)) else None

    def _put(self, key, value, ttl, bounds) -> bool:
        kept = self.store.put(key, value, ttl, bounds)
        return kept is not False  # a Guarded store answers False while down; a bare one raises

    def add(self, pair: str, source: str, translation: str, by: str = "import") -> str | None:
        """A correction the operator gives (a TMX import): served at once."""
        return self.suggest(pair, source, translation, by, trusted=True)

    def find_many(self, pair: str, sources: list[str]) -> list[str | None]:
        """Each sentence's served correction, or None."""
        found = self.store.get_many([self.key(pair, s) for s in sources])
        return [None if v is None else json.loads(v)["translation"] for v in found]

    def entries(self) -> list[dict]:
        """Every served correction."""
        return [json.loads(v) for _, v in self.store.scan(self.layout.key("memory", ""))]

    def pending(self) -> list[dict]:
        """Every suggestion awaiting review, the oldest first."""
        found = [json.loads(v) for _, v in self.store.scan(self.layout.key("pending", ""))]
        return sorted(found, key=lambda e: e["at"])

    def approve(self, id_: str) -> str | None:
        """Serve a pending suggestion ("served", "full"), None if there is no such suggestion."""
        key = self.layout.suggestion(id_)
        found = self.store.get(key)
        if found is None:
            return None
        status = self._serve(json.loads(found))
        if status == "served":
            self.store.delete(key, (self.waiting,))
        return status

    def reject(self, id_: str) -> bool:
        """Drop a pending suggestion; whether there was one."""
        return bool(self.store.delete(self.layout.suggestion(id_), (self.waiting,)))

    def delete(self, id_: str) -> bool:
        """Stop serving a correction (by its id, as `pending` and `list` show it); whether there was one."""
        for entry in self.entries():
            if entry.get("id") == id_:
                return bool(self.store.delete(self.key(entry["pair"], entry["source"]), (self.served,)))
        return False


def memory_tsv(entries: list[dict]) -> str:
    """Corrections as a corpus data.train takes: 'source<TAB>translation' lines (tabs and line breaks as spaces)."""
    flat = lambda text: " ".join(text.split())  # noqa: E731
    return "".join(f"{flat(e['source'])}\t{flat(e['translation'])}\n" for e in entries)


def memory_tmx(entries: list[dict]) -> str:
    """Corrections as TMX 1.4 translation units, each language's segment tagged with its code."""
    units = []
    for e in entries:
        source, target = e["pair"].split("-", 1)
        units.append(
            f"    <tu>\n      <tuv xml:lang={quoteattr(source)}><seg>{escape(e['source'])}</seg></tuv>\n"
            f"      <tuv xml:lang={quoteattr(target)}><seg>{escape(e['translation'])}</seg></tuv>\n    </tu>\n"
        )
    srclang = entries[0]["pair"].split("-", 1)[0] if entries else "*all*"
    header = (
        f'  <header creationtool="nanomt" creationtoolversion="1" segtype="sentence" o-tmf="nanomt" '
        f'adminlang="en" srclang={quoteattr(srclang)} datatype="plaintext"/>\n'
    )
    body = "".join(units)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<tmx version="1.4">\n{header}  <body>\n{body}  </body>\n</tmx>\n'


def read_tmx(text: str, name: str = "TMX") -> list[tuple[str, str, str]]:
    """(pair, source, translation) of each translation unit of a TMX file (its first segment the source, or the
    header's srclang's); a file that is not TMX is a ValueError naming it."""
    import xml.etree.ElementTree as ET

    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise ValueError(f"{name}: a TMX file with a DOCTYPE or entities is not read")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"{name}: not XML ({e})") from None
    if root.tag != "tmx":
        raise ValueError(f"{name}: not a TMX file (its root is <{root.tag}>)")
    lang = "{http://www.w3.org/XML/1998/namespace}lang"
    header = root.find("header")
    srclang = header.get("srclang") if header is not None else None
    out = []
    for n, tu in enumerate(root.iter("tu"), 1):
        segs = [(tuv.get(lang) or tuv.get("lang"), "".join(tuv.find("seg").itertext())) for tuv in tu.iter("tuv")]
        if len(segs) < 2 or any(code is None for code, _ in segs):
            raise ValueError(f"{name}: translation unit {n}: two segments, each with its xml:lang, are needed")
        at = next((i for i, (code, _) in enumerate(segs) if code == srclang), 0)
        source, text = segs[at]
        out += [(f"{source}-{code}", text, seg) for i, (code, seg) in enumerate(segs) if i != at and code != source]
    return out
