"""Request bodies bounded as they stream: a pure ASGI layer in front of the app counts every body's bytes, chunked
or not, and answers 413 as soon as they pass the route's limit, before anything is buffered, spooled or parsed, and
before a key is checked (nginx's client_max_body_size and uvicorn's limits count bytes the same way, rather than
trusting Content-Length).

Before the 413 goes out, the rest of the body is read and dropped (up to DRAIN_BYTES, kept nowhere), as nginx's
lingering close does: a connection closed while the peer is still sending resets it, and a reverse proxy that loses
the answer that way says 502 and takes a healthy replica out of its rotation.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.exceptions import HTTPException

DRAIN_BYTES = 64 * 2**20  # the most of a refused body read and dropped; past it the connection is closed


class TooLarge(HTTPException):
    """A body past its limit, found while it streams in (an HTTPException: the app answers it in its error shape)."""

    def __init__(self, received: int, limit: int, close: bool):
        headers = {"Connection": "close"} if close else None  # a body that never ended: the connection goes
        super().__init__(413, f"request body past the limit of {limit:,} bytes ({received:,} received)", headers)


class BodyLimit:
    """The ASGI layer: `limit(path)` is the most bytes a body of that path may have."""

    def __init__(self, app, limit: Callable[[str], int]):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit(scope["path"])
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:  # said up front: refused before a byte of it is kept
            whole = int(length) <= DRAIN_BYTES and await drain(receive, {"more_body": True})
            return await refuse(send, f"request body of {int(length):,} bytes; the limit is {limit:,}", whole)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(received, limit, close=not await drain(receive, message))
            return message

        await self.app(scope, counted, send)


async def drain(receive, message: dict) -> bool:
    """Read and drop the rest of a body after `message`, up to DRAIN_BYTES; whether it ended there."""
    dropped = 0
    while message.get("more_body", False):
        if dropped > DRAIN_BYTES:
            return False
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return False
        dropped += len(message.get("body", b""))
    return True


async def refuse(send, message: str, whole: bool) -> None:
    """A 413 in the API's error shape, sent by the layer itself; the connection closed where the body did not end."""
    body = json.dumps({"error": message, "detail": None}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [] if whole else [(b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
