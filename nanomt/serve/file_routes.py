"""LibreTranslate's file translation: POST /translate_file (a multipart form: file, source, target, api_key) answers
{"translatedFileUrl": ...}, and GET /download_file/NAME gives the translated file while it is kept."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import PurePath
from typing import Annotated
from urllib.parse import quote

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import Response

from nanomt.documents import files
from nanomt.serve.errors import ERRORS
from nanomt.serve.store import KEYS

KEEP_FILES = 32  # translated files kept for download, the oldest dropped first
KEEP_SECONDS = 3600.0  # and for at most an hour


class TranslatedFiles:
    """The translated files waiting to be downloaded, in the server's store (so that any replica sharing it answers
    the download), bounded in number and age."""

    def __init__(self, store, max_files: int = KEEP_FILES, keep_seconds: float = KEEP_SECONDS):
        self.store, self.max_files, self.keep_seconds = store, max_files, keep_seconds

    def add(self, filename: str, data: bytes, fmt: str) -> str | None:
        """Keep a file; its download name (a fresh id, then the uploaded file's name), None if it cannot be kept."""
        name = f"{uuid.uuid4().hex}.{PurePath(filename).name}"
        value = files.MEDIA_TYPES[fmt].encode() + b"\0" + data
        kept = self.store.put(KEYS["file"].format(name=name), value, self.keep_seconds, ("files", self.max_files))
        return name if kept else None

    def get(self, name: str) -> tuple[bytes, str] | None:
        found = self.store.get(KEYS["file"].format(name=name))
        if found is None:
            return None
        media_type, _, data = found.partition(b"\0")
        return data, media_type.decode()


def add_routes(app: FastAPI, server, routed) -> None:
    """POST /translate_file and GET /download_file/{name}; `routed(request, source, target)` gives a request's
    Route (LibreTranslate's routing: a 400 naming a language not served)."""
    kept = TranslatedFiles(server.store)

    @app.post("/translate_file", responses=ERRORS)
    async def translate_file(
        request: Request,
        file: Annotated[UploadFile, File(description="a .txt, .html, .md, .srt or .docx file")],
        source: Annotated[str, Form(min_length=1, description="source language code")],
        target: Annotated[str, Form(min_length=1, description="target language code")],
        api_key: Annotated[str | None, Form(description="the server's API key, when it asks for one")] = None,
    ) -> dict:
        """Translate a file, keeping its formatting; download it from the URL in the answer."""
        name = file.filename or "file"
        try:
            fmt = files.file_format(name)
        except files.UnsupportedFile as e:
            raise HTTPException(415, str(e)) from None
        data = await file.read(files.MAX_FILE_BYTES + 1)
        if len(data) > files.MAX_FILE_BYTES:
            raise HTTPException(413, f"{name}: larger than the limit of {files.MAX_FILE_BYTES:,} bytes")
        await server.check_key(request, api_key, len(data))  # a file's bytes count against a key's characters
        if source == "auto":
            raise HTTPException(400, "source auto: give the file's source language")
        try:
            translated = await routed(request, source, target).file(data, fmt)
        except files.FileTooLarge as e:
            raise HTTPException(413, f"{name}: {e}") from None
        except files.UnsupportedFile as e:
            raise HTTPException(415, f"{name}: {e}") from None
        except files.FileError as e:
            raise HTTPException(400, f"{name}: {e}") from None
        stored = await asyncio.to_thread(kept.add, name, translated, fmt)
        if stored is None:
            raise HTTPException(503, "the translated file cannot be kept: the store is unreachable")
        return {"translatedFileUrl": f"{request.base_url}download_file/{stored}"}

    @app.get(
        "/download_file/{name}",
        responses={404: {"description": "no such file, or no longer kept"}, 503: {"description": "store unreachable"}},
    )
    async def download_file(name: str) -> Response:
        """A translated file, by the name /translate_file gave."""
        found = await asyncio.to_thread(kept.get, name)
        if found is None and server.store.down:
            raise HTTPException(503, "the store is unreachable: retry later", headers={"Retry-After": "5"})
        if found is None:
            raise HTTPException(404, f"{name}: no such translated file (or no longer kept)")
        data, media_type = found
        disposition = f"attachment; filename*=UTF-8''{quote(name.split('.', 1)[1])}"  # any name, safely
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})
