"""LibreTranslate's file translation: POST /translate_file (a multipart form: file, source, target, api_key) answers
{"translatedFileUrl": ...}, and GET /download_file/NAME gives the translated file while it is kept. nanomt's file
jobs (nanomt.serve.file_jobs) take the same form and keep their files the same way."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import PurePath
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, StrictStr
from starlette.datastructures import UploadFile

from nanomt.documents import files, formats
from nanomt.serve.access import Client, presented_key
from nanomt.serve.errors import ERRORS, FORM, MULTIPART, Refused, errors, invalid, validate

KEEP_PER_CLIENT = 8  # translated files one client has awaiting download, its oldest dropped first
KEEP_FILES = 256  # and every client's together
KEEP_SECONDS = 3600.0  # each for an hour at most


class TranslatedFiles:
    """The translated files waiting to be downloaded, in the server's store (so that any replica sharing it answers
    the download), bounded per client (one client's uploads never push out another's), in all, and in age."""

    def __init__(self, store, layout, keep_seconds: float = KEEP_SECONDS):
        self.store, self.layout, self.keep_seconds = store, layout, keep_seconds

    def add(self, filename: str, data: bytes, fmt: str, client: str) -> str | None:
        """Keep a file; its download name (a fresh id, then the uploaded file's name), None if it cannot be kept."""
        name = f"{uuid.uuid4().hex}.{PurePath(filename).name}"
        value = formats.MEDIA_TYPES[fmt].encode() + b"\0" + data
        bounds = ((self.layout.group(f"files:{client}"), KEEP_PER_CLIENT), (self.layout.group("files"), KEEP_FILES))
        return name if self.store.put(self.layout.file(name), value, self.keep_seconds, bounds) else None

    def get(self, name: str) -> tuple[bytes, str] | None:
        found = self.store.get(self.layout.file(name))
        if found is None:
            return None
        media_type, _, data = found.partition(b"\0")
        return data, media_type.decode()


class FileFields(BaseModel):
    """/translate_file's form fields beside the file."""

    source: StrictStr = Field(min_length=1, description="source language code")
    target: StrictStr = Field(min_length=1, description="target language code")
    api_key: StrictStr | None = Field(default=None, description="the server's API key, when it asks for one")


def file_body(formats: str) -> dict:
    """/translate_file's request body in the OpenAPI schema (the form is read by hand, after the body's bound)."""
    fields = FileFields.model_json_schema()
    properties = {"file": {"type": "string", "format": "binary", "description": f"a {formats} file"}}
    properties.update(fields["properties"])
    schema = {"type": "object", "required": ["file", *fields["required"]], "properties": properties}
    return {"required": True, "content": {MULTIPART: {"schema": schema}}}


def read_file_form(form) -> tuple[str, UploadFile, FileFields]:
    """The uploaded file's name and bytes and the form's fields; a 422 naming what is missing or invalid."""
    upload = form.get("file")
    fields = validate(FileFields, {k: v for k, v in form.items() if k != "file"})
    if not isinstance(upload, UploadFile):
        what = "Field required" if upload is None else "a file is expected, not a text field"
        raise Refused(invalid([{"type": "missing", "loc": ("body", "file"), "msg": what}]))
    return upload.filename or "file", upload, fields


async def dropped(request: Request) -> None:
    """Read a body to its end (bounded by its limit) and keep none of it: a refusal a proxy can pass on."""
    async for _ in request.stream():
        pass


@dataclass(frozen=True)
class Upload:
    """A file form read and checked: who sent it, the file's name, bytes and format, the languages."""

    client: Client
    name: str
    data: bytes
    fmt: str
    source: str
    target: str


async def read_upload(request: Request, server) -> Upload:
    """The file form of a request, read under its limits: a 415 for a body that is no form or a file of a type not
    translated, a 413 past --file-limit, a 422 naming a missing or invalid field, the key's refusals (a key in a
    header is checked before the form is read: a stranger's upload is never spooled), a 400 for source auto."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in (MULTIPART, FORM):  # a urlencoded form has no file: a 422 that names it
        await dropped(request)
        raise HTTPException(415, f"send the file as {MULTIPART} (fields file, source, target, api_key)")
    client = await admitted(request, server) if presented_key(request, None) else None
    limit = server.config.files_max_bytes
    # Uploads are spooled (to disk past 1 MiB) while the form is read and removed when it closes.
    async with request.form(max_files=1, max_fields=len(FileFields.model_fields)) as form:
        name, upload, fields = read_file_form(form)
        data = await upload.read(limit + 1)
    if len(data) > limit:
        raise HTTPException(413, f"{name}: larger than the limit of {limit:,} bytes")
    try:
        fmt = files.file_format(name, data)
    except files.UnsupportedFile as e:
        raise HTTPException(415, str(e)) from None
    client = client or await server.check_key(request, fields.api_key)
    if fields.source == "auto":
        raise HTTPException(400, "source auto: give the file's source language")
    return Upload(client, name, data, fmt, fields.source, fields.target)


async def admitted(request: Request, server) -> Client:
    """The client of the header's key, or its refusal once the body is read and dropped."""
    try:
        return await server.check_key(request, None)
    except HTTPException:
        await dropped(request)
        raise


def file_refusal(name: str, e: files.FileError) -> HTTPException:
    """A file that cannot be translated, as the API answers it: 413 past a limit, 415 unreadable, else 400."""
    status = 413 if isinstance(e, files.FileTooLarge) else 415 if isinstance(e, files.UnsupportedFile) else 400
    return HTTPException(status, f"{name}: {e}")


def add_routes(app: FastAPI, server, routed) -> TranslatedFiles:
    """POST /translate_file and GET /download_file/{name}; `routed(request, source, target)` gives a request's Route
    (LibreTranslate's routing: a 400 naming a language not served). Returns where the translated files are kept."""
    kept = TranslatedFiles(server.store, server.layout)

    @app.post("/translate_file", responses=ERRORS, openapi_extra={"requestBody": file_body(", ".join(formats.FORMATS))})
    async def translate_file(request: Request) -> dict:
        """Translate a file, keeping its formatting; download it from the URL in the answer."""
        upload = await read_upload(request, server)
        route = routed(request, upload.source, upload.target)
        try:
            translated = await route.file(upload.data, upload.fmt, upload.client.limits.char_limit)
        except files.FileError as e:
            raise file_refusal(upload.name, e) from None
        stored = await server.io(kept.add, upload.name, translated, upload.fmt, upload.client.id, fallback=None)
        if stored is None:
            raise HTTPException(
                503, "the translated file cannot be kept: the store is unreachable", headers={"Retry-After": "5"}
            )
        return {"translatedFileUrl": f"{request.base_url}download_file/{stored}"}

    @app.get(
        "/download_file/{name}",
        responses={
            200: {
                "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in formats.MEDIA_TYPES.values()}
            },
            **errors(404, 503),
        },
    )
    async def download_file(name: str) -> Response:
        """A translated file, by the name /translate_file (or a done file job) gave."""
        found = await server.io(kept.get, name, fallback=None)
        if found is None and server.store.down:
            raise HTTPException(503, "the store is unreachable: retry later", headers={"Retry-After": "5"})
        if found is None:
            raise HTTPException(404, f"{name}: no such translated file (or no longer kept)")
        data, media_type = found
        disposition = f"attachment; filename*=UTF-8''{quote(name.split('.', 1)[1])}"  # any name, safely
        return Response(data, media_type=media_type, headers={"Content-Disposition": disposition})

    return kept
