"""The store in this process (memory://, the default): lost at exit, one replica's own."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque

from nanomt.serve.store.base import DEFAULT_URL, SWEEP_EVERY, Hit, Store, retry_after


class MemoryStore(Store):
    """Values, groups and windows in dictionaries under one lock."""

    def __init__(self, clock=time.monotonic):
        self.url, self._clock = DEFAULT_URL, clock
        self._values: dict[str, tuple[bytes, float]] = {}  # key -> (value, when it expires)
        self._groups: dict[str, OrderedDict[str, None]] = {}  # group -> its members, oldest first
        self._member_of: dict[str, set[str]] = {}  # key -> its groups
        self._windows: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self._writes = 0

    def _live(self, key: str, now: float) -> bytes | None:
        found = self._values.get(key)
        return None if found is None or found[1] <= now else found[0]

    def _drop(self, key: str) -> None:
        """Forget a key and its memberships (the caller holds the lock)."""
        self._values.pop(key, None)
        for group in self._member_of.pop(key, ()):
            members = self._groups.get(group)
            if members is not None:
                members.pop(key, None)
                if not members:
                    del self._groups[group]

    def _sweep(self, now: float) -> None:
        """Every SWEEP_EVERY writes: expired values and idle clients go, so that memory follows the live ones."""
        self._writes += 1
        if self._writes % SWEEP_EVERY:
            return
        for key in [k for k, (_, t) in self._values.items() if t <= now]:
            self._drop(key)

    def get(self, key):
        with self._lock:
            return self._live(key, self._clock())

    def put(self, key, value, ttl=None, bounds=()):
        with self._lock:
            now = self._clock()
            self._values[key] = (bytes(value), math.inf if ttl is None else now + ttl)
            for group, most in bounds:
                members = self._groups.setdefault(group, OrderedDict())
                members[key] = None
                members.move_to_end(key)
                self._member_of.setdefault(key, set()).add(group)
                while len(members) > most:
                    self._drop(next(iter(members)))
            self._sweep(now)

    def delete(self, key, groups=()):
        with self._lock:
            found = self._live(key, self._clock()) is not None
            self._drop(key)
            return found

    def count(self, group):
        with self._lock:
            now = self._clock()
            return sum(self._live(k, now) is not None for k in self._groups.get(group, ()))

    def scan(self, prefix):
        with self._lock:
            now = self._clock()
            return sorted((k, v) for k, (v, t) in self._values.items() if k.startswith(prefix) and t > now)

    def hit(self, client, limit, window, count=True):
        with self._lock:
            now = self._clock()
            self._writes += 1
            if self._writes % SWEEP_EVERY == 0:  # idle clients go, so that memory follows the active ones
                for c in [c for c, w in self._windows.items() if not w or w[-1] <= now - window]:
                    del self._windows[c]
            w = self._windows.setdefault(client, deque())
            while w and w[0] <= now - window:
                w.popleft()
            if len(w) < limit:
                if count:
                    w.append(now)
                return Hit(True)
            return Hit(False, retry_after(w[-limit], window, now))
