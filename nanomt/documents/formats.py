"""The file formats nanomt translates, in one table: the command line (`nanomt translate --format`), the server
(/translate_file, LibreTranslate's supportedFilesFormat, the page) and the docs read it. Standard library only, so
that parsing arguments imports no document code."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    """A format: its name (`--format NAME`), the file name suffixes it is known by (the first is the one shown), the
    media type a translated file is sent back with, and the library it is read with (None: the standard library)
    with the package that installs it (the `files` extra)."""

    name: str
    title: str
    suffixes: tuple[str, ...]
    media_type: str
    module: str | None = None
    package: str | None = None


TABLE = (
    Format("text", "plain text", (".txt", ".text"), "text/plain; charset=utf-8"),
    Format("html", "HTML", (".html", ".htm"), "text/html"),
    Format(
        "markdown", "Markdown", (".md", ".markdown"), "text/markdown; charset=utf-8", "markdown_it", "markdown-it-py"
    ),
    Format("srt", "SubRip subtitles", (".srt",), "application/x-subrip", "srt", "srt"),
    Format(
        "docx",
        "Word",
        (".docx",),
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "docx",
        "python-docx",
    ),
    Format("odt", "OpenDocument text", (".odt",), "application/vnd.oasis.opendocument.text", "lxml.etree", "lxml"),
    Format(
        "odp",
        "OpenDocument presentation",
        (".odp",),
        "application/vnd.oasis.opendocument.presentation",
        "lxml.etree",
        "lxml",
    ),
    Format(
        "ods",
        "OpenDocument spreadsheet",
        (".ods",),
        "application/vnd.oasis.opendocument.spreadsheet",
        "lxml.etree",
        "lxml",
    ),
    Format(
        "pptx",
        "PowerPoint",
        (".pptx",),
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "lxml.etree",
        "lxml",
    ),
    Format(
        "xlsx",
        "Excel",
        (".xlsx",),
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "lxml.etree",
        "lxml",
    ),
    Format("epub", "EPUB e-book", (".epub",), "application/epub+zip", "lxml.etree", "lxml"),
    Format("pdf", "PDF", (".pdf",), "application/pdf", "pypdf", "pypdf, pdfminer.six and reportlab"),
)
BY_NAME = {f.name: f for f in TABLE}
NAMES = tuple(sorted(BY_NAME))  # the choices of `nanomt translate --format`
FORMATS = {suffix: f.name for f in TABLE for suffix in f.suffixes}  # a file name's suffix -> its format
MEDIA_TYPES = {f.name: f.media_type for f in TABLE}
SHOWN = tuple(f.suffixes[0] for f in TABLE)  # one suffix a format, as the page and the docs list them
