"""LibreTranslate's file translation: POST /translate_file (a multipart form: file, source, target, api_key) answers
{"translatedFileUrl": ...}, and GET /download_file/NAME gives the translated file while it is kept."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from pathlib import PurePath
from typing import Annotated
from urllib.parse import quote

from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import Response

from nanomt.documents import files
from nanomt.serve.errors import ERRORS

KEEP_FILES = 32  # translated files kept for download, the oldest dropped first
KEEP_BYTES = 256 * 2**20  # and at most this many bytes of them


class TranslatedFiles:
    """The translated files waiting to be downloaded, in memory, bounded in number and bytes."""

    def __init__(self, max_files: int = KEEP_FILES, max_bytes: int = KEEP_BYTES):
        self.max_files, self.max_bytes = max_files, max_bytes
        self._files: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, filename: str, data: bytes, fmt: str) -> str:
        """Keep a file; its download name (a fresh id, then the uploaded file's name)."""
        name = f"{uuid.uuid4().hex}.{PurePath(filename).name}"
        with self._lock:
            self._files[name] = (data, files.MEDIA_TYPES[fmt])
            while len(self._files) > self.max_files or sum(len(d) for d, _ in self._files.values()) > self.max_bytes:
                self._files.popitem(last=False)
        return name

    def get(self, name: str) -> tuple[bytes, str] | None:
        with self._lock:
            return self._files.get(name)


def add_routes(app: FastAPI, server, routed) -> None:
    """POST /translate_file and GET /download_file/{name}; `routed(request, source, target)` gives a request's
    Route (LibreTranslate's routing: a 400 naming a language not served)."""
    kept = TranslatedFiles()

    @app.post("/translate_file", responses=ERRORS)
    async def translate_file(
        request: Request,
        file: Annotated[UploadFile, File(description="a .txt, .html, .md, .srt or .docx file")],
        source: Annotated[str, Form(description="source language code")],
        target: Annotated[str, Form(description="target language code")],
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
        server.check_key(request, api_key, len(data))  # a file's bytes count against a key's characters
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
        return {"translatedFileUrl": f"{request.base_url}download_file/{kept.add(name, translated, fmt)}"}

    @app.get("/download_file/{name}", responses={404: {"description": "no such file, or no longer kept"}})
    async def download_file(name: str) -> Response:
        """A translated file, by the name /translate_file gave."""
        found = kept.get(name)
        if found is None:
            raise HTTPException(404, f"{name}: no such translated file (or no longer kept)")
        data, media_type = found
        disposition = f"attachment; filename*=UTF-8''{quote(name.split('.', 1)[1])}"  # any name, safely
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})
