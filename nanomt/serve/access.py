"""Who a request comes from and what it may do: the server's key or a key of the keys file, else the client's
address; its characters a request and requests a minute, counted in the store so that every replica sharing it
counts them together."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from fastapi import HTTPException, Request

from nanomt.serve.keys import WINDOW_S, KeyRing, Limits
from nanomt.serve.store import Hit

UNLIMITED = Limits()
# The headers presented_key reads, as the OpenAPI schema's security schemes (a body's api_key is a field of its own).
SECURITY = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
    "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}
KEY_ATTEMPTS = 10  # wrong keys an address may present a minute; past them every key it sends is a 429 at once


@dataclass(frozen=True)
class Client:
    """A request's sender: `id` is what its limits are counted by ("master" for the server's own key, "key:NAME",
    or "ip:ADDRESS" without a key), `trusted` whether its corrections may answer other users."""

    id: str
    limits: Limits
    trusted: bool = False

    @property
    def keyed(self) -> bool:
        return not self.id.startswith("ip:")


def presented_key(request: Request, given: str | None) -> str | None:
    """The key a request carries: the body's api_key, else Authorization: Bearer KEY, else X-API-Key."""
    auth = request.headers.get("authorization", "")
    return given or (auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key"))


class Access:
    """The server's keys and limits (see the module's docstring)."""

    def __init__(self, config, store, layout, io):
        """`io(fn, *args, fallback=...)` runs a store call off the event loop (Server.io)."""
        self.config, self.store, self.layout, self.io = config, store, layout, io
        self.anonymous = Limits(config.req_limit, config.char_limit)
        self.keys = KeyRing.load(config.keys_file, self.anonymous) if config.keys_file else None

    @property
    def key_required(self) -> bool:
        return self.config.api_key is not None or self.keys is not None

    def client_address(self, request: Request) -> str:
        """The request's client, grouped (an IPv6 client by its /64): the connection's address, or from a trusted
        proxy (--forwarded-allow-ips) the rightmost X-Forwarded-For hop that is no trusted proxy, since every hop
        left of the one a proxy appended is the client's to write ('*' trusts the sender, never a written hop)."""
        peer = request.client.host if request.client else "unknown"
        if not self._proxy(peer, sender=True):
            return grouped(peer)
        hops = [h.strip() for h in request.headers.get("x-forwarded-for", "").split(",") if h.strip()]
        client = next((hop for hop in reversed(hops) if not self._proxy(hop)), hops[0] if hops else peer)
        return grouped(client)

    def _proxy(self, address: str, sender: bool = False) -> bool:
        proxies = self.config.trusted_proxies
        if sender and "*" in proxies:
            return True
        ip = _ip(address)
        return address in proxies or (ip is not None and any(not isinstance(n, str) and ip in n for n in proxies))

    def identify(self, request: Request, given: str | None) -> Client | None:
        """The client a presented key makes the request (None: a key is required and the request has none)."""
        master = self.config.api_key
        if master is not None and given and same_key(given, master):
            return Client("master", UNLIMITED, trusted=True)
        found = self.keys.find(given) if self.keys is not None else None
        if found is not None:
            return Client(f"key:{found.name}", found.limits, found.trusted)
        if self.key_required:
            return None
        return Client(f"ip:{self.client_address(request)}", self.anonymous)

    async def admit(self, request: Request, given: str | None, chars: int = 0) -> Client:
        """The request's client: 403 without a key the server requires; 429 (Retry-After) for every key from an
        address that sent KEY_ATTEMPTS wrong ones within the minute; 413 past the client's characters a request,
        429 past its requests a minute; 503 while the store is down and limits fail closed."""
        given = presented_key(request, given)
        guesses = self.layout.guesses(f"ip:{self.client_address(request)}")
        if given and self.key_required:  # checked before the key is: a guesser learns nothing more
            self._refuse(await self._hit(guesses, KEY_ATTEMPTS, count=False), "wrong keys from this address")
        client = self.identify(request, given)
        if client is None:
            if given:
                await self._hit(guesses, KEY_ATTEMPTS)
            raise HTTPException(403, "missing or wrong API key (send api_key, or the header Authorization: Bearer)")
        request.state.client = client
        limits, whose = client.limits, "this key's" if client.keyed else "the server's"
        if not limits.allows_chars(chars):
            raise HTTPException(413, f"{chars} characters in one request; {whose} limit is {limits.char_limit}")
        if limits.req_limit is not None:
            await self._count(client, limits.req_limit)
        return client

    async def _count(self, client: Client, limit: int) -> None:
        hit = await self._hit(self.layout.rate(client.id), limit)
        self._refuse(hit, f"more than {limit} requests a minute for {'this key' if client.keyed else 'this address'}")

    async def _hit(self, key: str, limit: int, count: bool = True) -> Hit | None:
        """The store's sliding window (counting this request, or only looking), off the event loop."""
        closed = Hit(True) if self.store.fail_open else None
        return await self.io(self.store.hit, key, limit, WINDOW_S, count, fallback=closed)

    @staticmethod
    def _refuse(hit: Hit | None, what: str) -> None:
        if hit is None:
            raise HTTPException(503, "rate limits unavailable: the store is unreachable", headers={"Retry-After": "5"})
        if not hit.allowed:
            raise HTTPException(
                429, f"{what}; retry in {hit.retry_after} s", headers={"Retry-After": str(hit.retry_after)}
            )


def grouped(address: str) -> str:
    """An address as its limits count it: an IPv6 address by its /64 (one subscriber's network, as IPv4's one
    address), an IPv4-mapped one as IPv4; text that is no address as it is, cut to 64 characters."""
    ip = _ip(address)
    if ip is None:
        return address[:64]
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


def _ip(address: str):
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


def same_key(a: str, b: str) -> bool:
    """Two keys compared in constant time."""
    return hmac.compare_digest(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"))
