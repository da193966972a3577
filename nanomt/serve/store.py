"""What a server remembers between requests, behind one interface with three backends (`nanomt serve --store URL`):

    memory://                 in this process (the default): lost at exit, one replica's own
    sqlite:///PATH            one file on one machine: survives restarts, shared by processes on the machine
    redis://HOST:PORT/DB      a Redis server: shared by a fleet of replicas behind a load balancer

The interface is small: values by key with an age limit (`put`, `get`, `scan`), bounded groups of them (`put` with
`bound`: the oldest dropped past it), and a sliding-window counter (`hit`) that is atomic in every backend, so that N
replicas together give a client its limit, not N times it. Keys are strings under one layout (KEYS below); values
are bytes. Backend errors are StoreDown; nanomt.serve.breaker.Guarded turns them into a fallback while the store is
unreachable or hung.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger("nanomt.serve")

# The layout of keys, in every backend (a Redis shared with other applications keeps them under "nanomt:"):
KEYS = {
    "rate": "nanomt:rate:{client}",  # a client's accepted requests of the last window (key:NAME or ip:ADDRESS)
    "fail": "nanomt:fail:{client}",  # the wrong keys an address sent in the last window
    "file": "nanomt:file:{name}",  # a translated file awaiting download: media type, NUL, bytes
    "cache": "nanomt:cache:{model}:{pair}:{decoding}:{sentence}",  # a sentence's translation (all sha256 prefixes)
    "memory": "nanomt:memory:{pair}:{sentence}",  # a correction: JSON {source, target, translation, pair}
}
DEFAULT_URL = "memory://"


class StoreError(ValueError):
    """A store that cannot be opened (unreachable, corrupted, a bad URL): the message names it (a ValueError, so
    that the command line prints it as one line)."""


class StoreDown(RuntimeError):
    """A store that stopped answering while serving."""


SWEEP_EVERY = 1024  # counted requests between two sweeps of idle clients in memory


@dataclass(frozen=True)
class Hit:
    """A counter's answer: allowed, or refused with the whole seconds until the window has room (Retry-After)."""

    allowed: bool
    retry_after: int = 0


def _retry(oldest: float, window: float, now: float) -> int:
    return max(1, math.ceil(oldest + window - now))


class Store:
    """The interface; see the module's docstring."""

    url: str

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def put(self, key: str, value: bytes, ttl: float | None = None, bound: tuple[str, int] | None = None) -> None:
        """Keep `value` for `ttl` seconds (None: until dropped); with bound=(group, n), at most n keys of the group
        are kept, the oldest dropped first."""
        raise NotImplementedError

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every live key starting with `prefix`, and its value, in key order."""
        raise NotImplementedError

    def hit(self, client: str, limit: int, window: float, count: bool = True) -> Hit:
        """Count a request of `client` if fewer than `limit` were accepted in the last `window` seconds (count=False:
        only answer whether one would be)."""
        raise NotImplementedError

    def ping(self) -> None:
        """Return if the store answers, else raise StoreDown."""

    def close(self) -> None:
        pass


class MemoryStore(Store):
    """In this process: today's behaviour, one replica's own."""

    def __init__(self, clock=time.monotonic):
        self.url, self._clock = DEFAULT_URL, clock
        self._values: dict[str, tuple[bytes, float]] = {}
        self._groups: dict[str, OrderedDict[str, None]] = {}
        self._windows: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._puts = 0

    def get(self, key):
        with self._lock:
            found = self._values.get(key)
            if found is None or found[1] <= self._clock():
                return None
            return found[0]

    def put(self, key, value, ttl=None, bound=None):
        with self._lock:
            now = self._clock()
            self._values[key] = (bytes(value), math.inf if ttl is None else now + ttl)
            if bound is not None:
                group = self._groups.setdefault(bound[0], OrderedDict())
                group[key] = None
                group.move_to_end(key)
                while len(group) > bound[1]:
                    self._values.pop(group.popitem(last=False)[0], None)
            self._puts += 1
            if self._puts % SWEEP_EVERY == 0:  # expired values go, so that memory follows the live ones
                for k in [k for k, (_, t) in self._values.items() if t <= now]:
                    del self._values[k]

    def scan(self, prefix):
        now = self._clock()
        with self._lock:
            found = [(k, v) for k, (v, t) in self._values.items() if k.startswith(prefix) and t > now]
        return sorted(found)

    def hit(self, client, limit, window, count=True):
        with self._lock:
            now = self._clock()
            self._puts += 1
            if self._puts % SWEEP_EVERY == 0:  # idle clients go, so that memory follows the active ones
                for c in [c for c, w in self._windows.items() if not w or w[-1] <= now - window]:
                    del self._windows[c]
            w = self._windows.setdefault(client, deque())
            while w and w[0] <= now - window:
                w.popleft()
            if len(w) < limit:
                if count:
                    w.append(now)
                return Hit(True)
            return Hit(False, _retry(w[-limit], window, now))


class SqliteStore(Store):
    """One SQLite file: survives restarts; processes of one machine share it (each write one transaction)."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL, grp TEXT, "
        "added REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS kv_grp ON kv (grp, added)",
        "CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires)",
        "CREATE TABLE IF NOT EXISTS hits (client TEXT NOT NULL, at REAL NOT NULL)",
        "CREATE INDEX IF NOT EXISTS hits_client ON hits (client, at)",
    )

    def __init__(self, path: str):
        self.url, self.path = f"sqlite:///{path}", Path(path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), timeout=10, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            (check,) = self._db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            self._db.execute("PRAGMA journal_mode = WAL")
            for statement in self.SCHEMA:
                self._db.execute(statement)
        except sqlite3.Error as e:
            raise StoreError(f"{self.url}: cannot use it as the server's store ({e}); it is left as it is") from None

    def _run(self, fn):
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(self._db, time.time())
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
                return out
            except sqlite3.Error as e:
                raise StoreDown(f"{self.url}: {e}") from None

    def get(self, key):
        def fn(db, now):
            row = db.execute("SELECT value FROM kv WHERE key = ? AND (expires IS NULL OR expires > ?)", (key, now))
            found = row.fetchone()
            return None if found is None else bytes(found[0])

        return self._run(fn)

    def put(self, key, value, ttl=None, bound=None):
        def fn(db, now):
            db.execute("DELETE FROM kv WHERE expires IS NOT NULL AND expires <= ?", (now,))
            grp = bound[0] if bound else None
            db.execute(
                "INSERT OR REPLACE INTO kv (key, value, expires, grp, added) VALUES (?, ?, ?, ?, ?)",
                (key, bytes(value), None if ttl is None else now + ttl, grp, now),
            )
            if bound is not None:
                (n,) = db.execute("SELECT COUNT(*) FROM kv WHERE grp = ?", (grp,)).fetchone()
                if n > bound[1]:
                    db.execute(
                        "DELETE FROM kv WHERE key IN (SELECT key FROM kv WHERE grp = ? ORDER BY added, rowid LIMIT ?)",
                        (grp, n - bound[1]),
                    )

        self._run(fn)

    def scan(self, prefix):
        def fn(db, now):
            rows = db.execute(
                "SELECT key, value FROM kv WHERE substr(key, 1, ?) = ? AND (expires IS NULL OR expires > ?) "
                "ORDER BY key",
                (len(prefix), prefix, now),
            )
            return [(k, bytes(v)) for k, v in rows]

        return self._run(fn)

    def hit(self, client, limit, window, count=True):
        def fn(db, now):
            db.execute("DELETE FROM hits WHERE client = ? AND at <= ?", (client, now - window))
            times = [t for (t,) in db.execute("SELECT at FROM hits WHERE client = ? ORDER BY at", (client,))]
            if len(times) < limit:
                if count:
                    db.execute("INSERT INTO hits (client, at) VALUES (?, ?)", (client, now))
                return Hit(True)
            return Hit(False, _retry(times[-limit], window, now))

        return self._run(fn)

    def ping(self):
        self._run(lambda db, now: db.execute("SELECT 1").fetchone())

    def close(self):
        self._db.close()


# The sliding window in one step on the Redis server, with its clock: replicas' clocks need not agree.
HIT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[1])
if n < limit then
  if ARGV[4] == '1' then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
  end
  return {1, '0'}
end
local oldest = redis.call('ZRANGE', KEYS[1], n - limit, n - limit, 'WITHSCORES')
return {0, tostring(tonumber(oldest[2]) + window - now)}
"""
# A bounded group: its members in a sorted set by time added; past the bound the oldest go with their values.
PUT_SCRIPT = """
if ARGV[2] == '' then redis.call('SET', KEYS[1], ARGV[1]) else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
if KEYS[2] then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1e6, KEYS[1])
  local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
  if extra > 0 then
    local old = redis.call('ZRANGE', KEYS[2], 0, extra - 1)
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, extra - 1)
    for _, k in ipairs(old) do redis.call('DEL', k) end
  end
end
return 1
"""


class RedisStore(Store):
    """A Redis server, shared by every replica; each operation one round trip (a script where it must be atomic)."""

    def __init__(self, url: str, timeout: float = 2.0):
        try:
            import redis
        except ImportError:
            raise StoreError(f"{url}: a Redis store needs the redis library: pip install 'nanomt[serve]'") from None
        self.url, self._redis = redacted(url), redis
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            self._client.ping()
        except (redis.RedisError, ValueError, OSError) as e:
            raise StoreError(f"{self.url}: cannot reach the store ({e})") from None
        self._hit = self._client.register_script(HIT_SCRIPT)
        self._put = self._client.register_script(PUT_SCRIPT)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (self._redis.RedisError, OSError) as e:
            raise StoreDown(f"{self.url}: {e}") from None

    def get(self, key):
        return self._call(self._client.get, key)

    def get_many(self, keys):
        return self._call(self._client.mget, keys) if keys else []

    def put(self, key, value, ttl=None, bound=None):
        px = "" if ttl is None else str(max(1, int(ttl * 1000)))
        keys = [key] if bound is None else [key, f"nanomt:group:{bound[0]}"]
        self._call(self._put, keys=keys, args=[bytes(value), px, bound[1] if bound else 0])

    def scan(self, prefix):
        keys = sorted(self._call(lambda: list(self._client.scan_iter(match=_glob_escape(prefix) + "*", count=1000))))
        values = self._call(self._client.mget, keys) if keys else []
        return [(k.decode(), v) for k, v in zip(keys, values) if v is not None]

    def hit(self, client, limit, window, count=True):
        allowed, wait = self._call(self._hit, keys=[client], args=[limit, window, uuid.uuid4().hex, int(count)])
        return Hit(True) if allowed else Hit(False, max(1, math.ceil(float(wait))))

    def ping(self):
        self._call(self._client.ping)

    def close(self):
        self._client.close()


def redacted(url: str) -> str:
    """A store's URL as logs and errors show it: without its password."""
    parts = urlparse(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def open_store(url: str | None) -> Store:
    """The store a URL names (memory://, sqlite:///PATH, redis://HOST:PORT/DB); StoreError names it if it cannot
    be opened. A SQLite file that is no database (or a corrupted one) is an error, never replaced."""
    url = url or DEFAULT_URL
    scheme = urlparse(url).scheme
    if url in ("memory://", "memory:"):
        return MemoryStore()
    if scheme == "sqlite":
        path = url[len("sqlite://") :]
        path = path[1:] if path.startswith("/") else ""  # SQLAlchemy's form: sqlite:///rel.db, sqlite:////abs.db
        if not path:
            raise StoreError(f"{url}: give a file, sqlite:///relative/path or sqlite:////absolute/path")
        return SqliteStore(path)
    if scheme in ("redis", "rediss", "unix"):
        return RedisStore(url)
    raise StoreError(f"{redacted(url)}: not a store (memory://, sqlite:///PATH or redis://HOST:PORT/DB)")


def digest(text: str) -> str:
    """A short stable hash of a text, for keys (128 bits)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def normalized(sentence: str) -> str:
    """A sentence as the translation memory matches it: whitespace runs as one space, none at the ends."""
    return " ".join(sentence.split())


class SentenceCache:
    """Sentence translations by model (its weights' hash), pair, kind and decoding settings (their repr: the frozen
    Decoding's stable text form), bounded in number and age; values are JSON."""

    GROUP = "cache"

    def __init__(self, store, size: int, age: float):
        self.store, self.size, self.age = store, size, age

    def key(self, model: str, pair: str, setting: str, text: str, prefix: str | None) -> str:
        sentence = digest(text if prefix is None else f"{text}\0prefix\0{prefix}")
        return KEYS["cache"].format(model=model, pair=pair, decoding=digest(setting), sentence=sentence)

    def get_many(self, keys: list[str]) -> list:
        return [None if v is None else json.loads(v) for v in self.store.get_many(keys)]

    def put(self, key: str, value) -> None:
        self.store.put(key, json.dumps(value, ensure_ascii=False).encode(), self.age, (self.GROUP, self.size))


class TranslationMemory:
    """Corrections (LibreTranslate's /suggest): a pair's source sentence, whitespace-normalized, and its translation."""

    def __init__(self, store):
        self.store = store

    def key(self, pair: str, source: str) -> str:
        return KEYS["memory"].format(pair=pair, sentence=digest(normalized(source)))

    def add(self, pair: str, source: str, translation: str) -> bool:
        entry = {"pair": pair, "source": normalized(source), "translation": translation.strip()}
        return self.store.put(self.key(pair, source), json.dumps(entry, ensure_ascii=False).encode())

    def find_many(self, pair: str, sources: list[str]) -> list[str | None]:
        found = self.store.get_many([self.key(pair, s) for s in sources])
        return [None if v is None else json.loads(v)["translation"] for v in found]

    def entries(self) -> list[dict]:
        """Every correction: {pair, source, translation}."""
        return [json.loads(v) for _, v in self.store.scan("nanomt:memory:")]


def memory_tsv(entries: list[dict]) -> str:
    """Corrections as a corpus data.train takes: 'source<TAB>translation' lines (tabs and line breaks as spaces)."""
    flat = lambda text: " ".join(text.split())  # noqa: E731
    return "".join(f"{flat(e['source'])}\t{flat(e['translation'])}\n" for e in entries)


def memory_tmx(entries: list[dict]) -> str:
    """Corrections as TMX 1.4 translation units, each language's segment tagged with its code."""
    from xml.sax.saxutils import escape, quoteattr

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
