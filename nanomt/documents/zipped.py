"""Zipped formats (Word, OpenDocument, PowerPoint, Excel, EPUB): an archive read under a bound on what it unpacks to,
and written back with only the translated members changed, every other member's bytes as they were."""

from __future__ import annotations

import io
import zipfile

from nanomt.documents.file_items import FileTooLarge, UnsupportedFile


def open_zip(data: bytes, limit: int, what: str) -> zipfile.ZipFile:
    """The archive, refused in one line if it is not one or would unpack to more than `limit` bytes (a zip bomb is
    refused before any member is read); `what` names the format (\"Word .docx\")."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise UnsupportedFile(f"not a valid {what} file (not a zip archive)") from None
    unpacked = sum(info.file_size for info in archive.infolist())
    if unpacked > limit:
        raise FileTooLarge(f"the {what} file unpacks to {unpacked:,} bytes; the limit is {limit:,}")
    return archive


def read_member(archive: zipfile.ZipFile, name: str, what: str) -> bytes:
    """A member's bytes, or an UnsupportedFile saying the archive lacks it (or holds it broken)."""
    try:
        return archive.read(name)
    except KeyError:
        raise UnsupportedFile(f"not a valid {what} file (no {name})") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:  # a corrupt member: a bad CRC, a truncated stream
        raise UnsupportedFile(f"not a valid {what} file ({name}: {e})") from None


def rewrite_zip(archive: zipfile.ZipFile, replaced: dict[str, bytes]) -> bytes:
    """The archive with the members in `replaced` given new bytes; every member keeps its place, name, date,
    attributes and compression (OpenDocument's and EPUB's `mimetype` stays first and stored, as they require)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as written:
        for info in archive.infolist():
            data = replaced[info.filename] if info.filename in replaced else archive.read(info)
            written.writestr(info, data, compress_type=info.compress_type)
    return out.getvalue()
