"""The store in one SQLite file (sqlite:///PATH): survives restarts; the processes of one machine share it."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from nanomt.serve.store.base import SWEEP_EVERY, Hit, Store, StoreDown, StoreError, retry_after

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL, added REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires)",
    "CREATE TABLE IF NOT EXISTS members (grp TEXT NOT NULL, key TEXT NOT NULL, added REAL NOT NULL, "
    "PRIMARY KEY (grp, key))",
    "CREATE INDEX IF NOT EXISTS members_added ON members (grp, added)",
    "CREATE INDEX IF NOT EXISTS members_key ON members (key)",
    "CREATE TABLE IF NOT EXISTS hits (client TEXT NOT NULL, at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS hits_client ON hits (client, at)",
    "CREATE INDEX IF NOT EXISTS hits_at ON hits (at)",
)
LIVE = "(expires IS NULL OR expires > ?)"


class SqliteStore(Store):
    """Writes are one IMMEDIATE transaction each (so that processes sharing the file never interleave a counter's
    read and write); reads take no write lock."""

    def __init__(self, path: str, clock=time.time):
        self.url, self.path, self._clock = f"sqlite:///{path}", Path(path), clock
        self._lock = threading.Lock()
        self._writes = 0
        if not self.path.parent.is_dir():  # sqlite3 says only "unable to open database file"
            raise StoreError(
                f"{self.url}: the folder {self.path.parent} does not exist (sqlite:///PATH is relative to the working "
                "directory; sqlite:////PATH is absolute)"
            )
        try:
            self._db = sqlite3.connect(str(self.path), timeout=10, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout = 10000")
            # The header and the schema read, not every page (PRAGMA quick_check scans the whole file): a file that
            # is no database fails here; damage further in fails the operation that meets it (StoreDown, logged).
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            self._db.execute("PRAGMA journal_mode = WAL")
            for statement in SCHEMA:
                self._db.execute(statement)
        except sqlite3.Error as e:
            raise StoreError(f"{self.url}: cannot use it as the server's store ({e}); it is left as it is") from None

    def _run(self, fn, write: bool = True):
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")
                try:
                    out = fn(self._db, self._clock())
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
                return out
            except sqlite3.Error as e:
                raise StoreDown(f"{self.url}: {e}") from None

    def get(self, key):
        return self.get_many([key])[0]

    def get_many(self, keys):
        def fn(db, now):
            found = {}
            for at in range(0, len(keys), 500):  # SQLite's limit on parameters
                part = keys[at : at + 500]
                marks = ",".join("?" * len(part))
                rows = db.execute(f"SELECT key, value FROM kv WHERE key IN ({marks}) AND {LIVE}", (*part, now))
                found.update((k, bytes(v)) for k, v in rows)
            return [found.get(k) for k in keys]

        return self._run(fn, write=False) if keys else []

    def put(self, key, value, ttl=None, bounds=()):
        def fn(db, now):
            expired = "SELECT key FROM kv WHERE expires IS NOT NULL AND expires <= ?"
            db.execute(f"DELETE FROM members WHERE key IN ({expired})", (now,))
            db.execute("DELETE FROM kv WHERE expires IS NOT NULL AND expires <= ?", (now,))
            db.execute(
                "INSERT OR REPLACE INTO kv (key, value, expires, added) VALUES (?, ?, ?, ?)",
                (key, bytes(value), None if ttl is None else now + ttl, now),
            )
            for group, most in bounds:
                db.execute("INSERT OR REPLACE INTO members (grp, key, added) VALUES (?, ?, ?)", (group, key, now))
                (n,) = db.execute("SELECT COUNT(*) FROM members WHERE grp = ?", (group,)).fetchone()
                oldest = "SELECT key FROM members WHERE grp = ? ORDER BY added, rowid LIMIT ?"
                for (old,) in db.execute(oldest, (group, max(0, n - most))).fetchall():
                    db.execute("DELETE FROM kv WHERE key = ?", (old,))
                    db.execute("DELETE FROM members WHERE key = ?", (old,))

        self._run(fn)

    def delete(self, key, groups=()):
        def fn(db, now):
            found = db.execute(f"SELECT 1 FROM kv WHERE key = ? AND {LIVE}", (key, now)).fetchone() is not None
            db.execute("DELETE FROM kv WHERE key = ?", (key,))
            db.execute("DELETE FROM members WHERE key = ?", (key,))
            return found

        return self._run(fn)

    def count(self, group):
        def fn(db, now):
            query = f"SELECT COUNT(*) FROM members JOIN kv USING (key) WHERE grp = ? AND {LIVE}"
            return db.execute(query, (group, now)).fetchone()[0]

        return self._run(fn, write=False)

    def scan(self, prefix):
        def fn(db, now):
            rows = db.execute(
                f"SELECT key, value FROM kv WHERE substr(key, 1, ?) = ? AND {LIVE} ORDER BY key",
                (len(prefix), prefix, now),
            )
            return [(k, bytes(v)) for k, v in rows]

        return self._run(fn, write=False)

    def hit(self, client, limit, window, count=True):
        def fn(db, now):
            self._writes += 1
            if self._writes % SWEEP_EVERY == 0:  # every client's past requests, idle clients' included
                db.execute("DELETE FROM hits WHERE at <= ?", (now - window,))
            else:
                db.execute("DELETE FROM hits WHERE client = ? AND at <= ?", (client, now - window))
            times = [t for (t,) in db.execute("SELECT at FROM hits WHERE client = ? ORDER BY at", (client,))]
            if len(times) < limit:
                if count:
                    db.execute("INSERT INTO hits (client, at) VALUES (?, ?)", (client, now))
                return Hit(True)
            return Hit(False, retry_after(times[-limit], window, now))

        return self._run(fn)

    def ping(self):
        self._run(lambda db, now: db.execute("SELECT 1").fetchone(), write=False)

    def close(self):
        self._db.close()
