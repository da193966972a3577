"""The store's interface, its errors and its counter's answer (see nanomt.serve.store)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlparse

DEFAULT_URL = "memory://"
SECRETS = frozenset({"password", "pass", "pwd", "secret", "token", "auth", "key"})  # query parameters hidden in logs
SWEEP_EVERY = 1024  # writes (or counted requests) between two sweeps of what has expired


class StoreError(ValueError):
    """A store that cannot be opened (unreachable, corrupted, a bad URL): the message names it (a ValueError, so
    that the command line prints it as one line)."""


class StoreDown(RuntimeError):
    """A store that stopped answering while serving."""


@dataclass(frozen=True)
class Hit:
    """A counter's answer: allowed, or refused with the whole seconds until the window has room (Retry-After)."""

    allowed: bool
    retry_after: int = 0


def retry_after(oldest: float, window: float, now: float) -> int:
    """Whole seconds until the window's oldest counted request leaves it."""
    return max(1, math.ceil(oldest + window - now))


Bounds = tuple[tuple[str, int], ...]  # (group, most members) of each group a value joins


class Store:
    """The interface; see the package's docstring."""

    url: str

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [self.get(k) for k in keys]

    def put(self, key: str, value: bytes, ttl: float | None = None, bounds: Bounds = ()) -> None:
        """Keep `value` for `ttl` seconds (None: until dropped), a member of each group of `bounds`: past a group's
        bound, its oldest members go (every member of a group has one ttl)."""
        raise NotImplementedError

    def delete(self, key: str, groups: tuple[str, ...] = ()) -> bool:
        """Drop a value (and its membership of `groups`); whether it was there."""
        raise NotImplementedError

    def count(self, group: str) -> int:
        """How many values a group holds."""
        raise NotImplementedError

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every live key starting with `prefix`, and its value, in key order."""
        raise NotImplementedError

    def hit(self, client: str, limit: int, window: float, count: bool = True) -> Hit:
        """Count a request of `client` if fewer than `limit` were counted in the last `window` seconds (count=False:
        only answer whether one would be)."""
        raise NotImplementedError

    def ping(self) -> None:
        """Return if the store answers, else raise StoreDown."""

    def close(self) -> None:
        pass


def redacted(url: str) -> str:
    """A store's URL as logs, errors and commands show it: without its password, in the user part or the query."""
    parts = urlparse(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if parts.password is None and not any(k.lower() in SECRETS for k, _ in query):
        return url  # as given (geturl would drop sqlite:///'s empty host)
    netloc = parts.netloc if parts.password is None else parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    hidden = [(k, "***" if k.lower() in SECRETS else v) for k, v in query]
    return parts._replace(netloc=netloc, query=urlencode(hidden, safe="*") if query else parts.query).geturl()
