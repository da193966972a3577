"""A store as the server uses it, behind a circuit breaker: a backend that fails or hangs is skipped at once, for
every request, until a background probe finds it answering again.

While the breaker is open, reads find nothing, writes are skipped (put answers False), counters answer "allowed"
(limits fail open) or None (fail closed: the caller refuses with a 503); the outage is logged once when it starts
and once when it ends, never per request.
"""

from __future__ import annotations

import logging
import threading
import time

from nanomt.serve.store.base import Bounds, Hit, Store, StoreDown

log = logging.getLogger("nanomt.serve")
PROBE_EVERY = 1.0  # seconds between two probes of a lost store, doubling up to PROBE_AT_MOST
PROBE_AT_MOST = 16.0


class Guarded:
    """A store and its breaker (see the module's docstring)."""

    def __init__(self, store: Store, fail_open: bool = True, probe_every: float = PROBE_EVERY):
        self.store, self.fail_open, self.probe_every = store, fail_open, probe_every
        self.down = False
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.store.url

    def trip(self, reason) -> None:
        """The store failed or did not answer in time: skip it until a probe finds it back."""
        with self._lock:
            if self.down:
                return
            self.down = True
        what = "allowed" if self.fail_open else "refused (503)"
        log.error("store lost: %s; translating without it, limited requests %s, until it is back", reason, what)
        threading.Thread(target=self._probe, name="nanomt-store-probe", daemon=True).start()

    def _probe(self) -> None:
        wait = self.probe_every
        while True:
            time.sleep(wait)
            try:
                self.store.ping()
            except StoreDown:
                wait = min(2 * wait, PROBE_AT_MOST)
                continue
            with self._lock:
                self.down = False
            log.warning("store back: %s", self.store.url)
            return

    def call(self, method: str, *args, fallback=None):
        """store.method(*args), or `fallback` while the breaker is open (and when this call fails)."""
        if self.down:
            return fallback
        try:
            return getattr(self.store, method)(*args)
        except StoreDown as e:
            self.trip(e)
            return fallback

    def get(self, key: str) -> bytes | None:
        return self.call("get", key)

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return self.call("get_many", keys, fallback=[None] * len(keys))

    def put(self, key: str, value: bytes, ttl: float | None = None, bounds: Bounds = ()) -> bool:
        """Whether it was kept."""
        return self.call("put", key, value, ttl, bounds, fallback=False) is not False

    def delete(self, key: str, groups: tuple[str, ...] = ()) -> bool | None:
        """Whether it was there; None while the store is down."""
        return self.call("delete", key, groups)

    def count(self, group: str) -> int | None:
        return self.call("count", group)

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        return self.call("scan", prefix, fallback=[])

    def hit(self, client: str, limit: int, window: float, count: bool = True) -> Hit | None:
        """The counter's answer; None while the store is down and limits fail closed."""
        return self.call("hit", client, limit, window, count, fallback=Hit(True) if self.fail_open else None)
