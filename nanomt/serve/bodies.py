"""Request bodies bounded as they stream: a pure ASGI layer in front of the app counts every body's bytes, chunked
or not, and answers 413 as soon as they pass the route's limit, before anything is buffered, spooled or parsed, and
before a key is checked (nginx's client_max_body_size and uvicorn's limits count bytes the same way, rather than
trusting Content-Length)."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.exceptions import HTTPException


class TooLarge(HTTPException):
    """A body past its limit, found while it streams in (an HTTPException: the app answers it in its error shape)."""

    def __init__(self, received: int, limit: int):
        super().__init__(413, f"request body past the limit of {limit:,} bytes ({received:,} received)")


class BodyLimit:
    """The ASGI layer: `limit(path)` is the most bytes a body of that path may have."""

    def __init__(self, app, limit: Callable[[str], int]):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit(scope["path"])
        length = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:  # said up front: refused before a byte is read
            return await refuse(send, f"request body of {int(length):,} bytes; the limit is {limit:,}")
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise TooLarge(received, limit)
            return message

        await self.app(scope, counted, send)


async def refuse(send, message: str) -> None:
    """A 413 in the API's error shape, sent by the layer itself; the connection closes (the body is not read)."""
    body = json.dumps({"error": message, "detail": None}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
