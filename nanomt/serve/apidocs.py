"""/docs: Swagger UI over the server's OpenAPI schema, its scripts and styles served from the swagger-ui-bundle
package (Apache-2.0, in the [serve] extra), so that the page fetches nothing from another host. Without the package
there is no /docs (the schema stays at /openapi.json); `nanomt serve --no-docs` closes both."""

from __future__ import annotations

import logging

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

log = logging.getLogger("nanomt.serve")
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def add_routes(app: FastAPI) -> None:
    """GET /docs and /docs/static/NAME, when swagger-ui-bundle is installed."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        log.info("no /docs: the swagger-ui-bundle package is not installed (the schema is at /openapi.json)")
        return

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        # Relative URLs: the same page works at / and behind a proxy under a prefix, as the translator page does.
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title=f"{app.title}: API",
            swagger_js_url="docs/static/swagger-ui-bundle.js",
            swagger_css_url="docs/static/swagger-ui.css",
            swagger_favicon_url="docs/static/favicon-32x32.png",
        )

    @app.get("/docs/static/{name}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:  # by name, from this list only: no path reaches outside the package
            raise HTTPException(404, f"{name}: no such file of the API's page")
        return FileResponse(swagger_ui_path / name, headers={"Cache-Control": "public, max-age=86400"})
