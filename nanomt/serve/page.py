"""The page at `/`: the translator people use in a browser, shipped in the package (static/), no build step.

Every path the page asks for is relative to it (`static/page.css`, `languages`, `translate`), so the same files work
at `/` and behind a reverse proxy under a prefix (`https://example.org/mt/`); nothing is fetched from another host.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, Response

from nanomt.documents import formats

STATIC = Path(__file__).resolve().parent / "static"
MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# The page's scripts and styles are served by name, from this list only: no path reaches outside static/.
ASSETS = {p.name: p for p in STATIC.iterdir() if p.suffix in MEDIA_TYPES}
SECURITY = {
    # Scripts and styles from this server only, requests to this server only (blob: for the translated file).
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def index_html(max_file_bytes: int) -> str:
    """The page, with what it cannot ask the server for filled in: the largest file /translate_file takes, the
    files it takes (every suffix) and the one suffix a format the page names (nanomt.documents.formats)."""
    text = (STATIC / "index.html").read_text(encoding="utf-8")
    text = text.replace("{{FILE_SUFFIXES}}", ",".join(formats.FORMATS)).replace(
        "{{FILE_SHOWN}}", ",".join(formats.SHOWN)
    )
    return text.replace("{{MAX_FILE_BYTES}}", str(max_file_bytes))


def add_routes(app: FastAPI, max_file_bytes: int) -> None:
    """`/`: the page; `/static/NAME`: its scripts and styles."""
    page = index_html(max_file_bytes)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        """The translator page: languages, text or a file, alternatives, a glossary, the attention of a sentence."""
        return HTMLResponse(page, headers={**SECURITY, "Cache-Control": "no-cache"})

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        """One of the page's own files (static/*.js, *.css), by name."""
        path = ASSETS.get(name)
        if path is None:
            raise HTTPException(404, f"{name}: no such file of the page")
        headers = {**SECURITY, "Cache-Control": "no-cache"}
        return Response(path.read_bytes(), media_type=MEDIA_TYPES[path.suffix], headers=headers)
