"""The page at `/`: the translator people use in a browser, shipped in the package (static/), no build step."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

STATIC = Path(__file__).resolve().parent / "static"


def add_routes(app: FastAPI) -> None:
    """`/`: the page."""

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        """The page: type a sentence, see its translation and cross-attention heatmap."""
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))
