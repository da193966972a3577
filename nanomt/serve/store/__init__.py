"""What a server remembers between requests, behind one interface with three backends (`nanomt serve --store URL`):

    memory://                 in this process (the default): lost at exit, one replica's own
    sqlite:///PATH            one file on one machine: survives restarts, shared by processes on the machine
    redis://HOST:PORT/DB      a Redis server: shared by a fleet of replicas behind a load balancer

The interface is small: values by key with an age limit (`put`, `get`, `delete`, `scan`), bounded groups of them
(`put` with `bounds`: past a group's bound its oldest members go), and a sliding-window counter (`hit`) that is
atomic in every backend, so that N replicas together give a client its limit, not N times it. Keys are strings
under one layout (nanomt.serve.store.layout); values are bytes. Backend errors are StoreDown;
nanomt.serve.breaker.Guarded turns them into a fallback while the store is unreachable or hung.
"""

from __future__ import annotations

from urllib.parse import urlparse

from nanomt.serve.store.base import DEFAULT_URL, Hit, Store, StoreDown, StoreError, redacted
from nanomt.serve.store.layout import DEFAULT_NAMESPACE, Layout
from nanomt.serve.store.memory import MemoryStore

__all__ = [
    "DEFAULT_NAMESPACE", "DEFAULT_URL", "Hit", "Layout", "MemoryStore", "Store", "StoreDown", "StoreError",
    "open_store", "redacted",
]  # fmt: skip


def open_store(url: str | None) -> Store:
    """The store a URL names (memory://, sqlite:///PATH, redis://HOST:PORT/DB); StoreError names it if it cannot
    be opened. A SQLite file that is no database is an error, never replaced."""
    url = url or DEFAULT_URL
    scheme = urlparse(url).scheme
    if url in ("memory://", "memory:"):
        return MemoryStore()
    if scheme == "sqlite":
        from nanomt.serve.store.sqlite import SqliteStore

        path = url[len("sqlite://") :]
        path = path[1:] if path.startswith("/") else ""  # SQLAlchemy's form: sqlite:///rel.db, sqlite:////abs.db
        if not path:
            raise StoreError(f"{url}: give a file, sqlite:///relative/path or sqlite:////absolute/path")
        return SqliteStore(path)
    if scheme in ("redis", "rediss", "unix"):
        from nanomt.serve.store.redis import RedisStore

        return RedisStore(url)
    raise StoreError(f"{redacted(url)}: not a store (memory://, sqlite:///PATH or redis://HOST:PORT/DB)")
