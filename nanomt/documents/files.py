"""Files translated with their formatting kept: plain text, HTML, Markdown, subtitles (SRT) and Word (.docx) here;
OpenDocument, PowerPoint, Excel, EPUB and PDF in modules of their own; one entry point, translate_file."""

# Each format turns its text into segments of text and tags (markup's items), translates them in one call,
# and writes the translations back into the file's own structure. Word's runs are elements like HTML's inline tags,
# so formatting across runs follows the same alignment rule.

from __future__ import annotations

import codecs
import io
import re
import zipfile
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from pathlib import PurePath

from nanomt.documents import epub, markup, odf, pdf, pptx, runs, xlsx
from nanomt.documents.file_items import (
    FileError,
    FileJob,
    FileTooLarge,
    Progress,
    UnsupportedFile,
    joined,
    library,
    text_items,
)
from nanomt.documents.formats import FORMATS, MEDIA_TYPES
from nanomt.documents.limits import MAX_FILE_BYTES, MAX_TEXT_CHARS, UNZIPPED_PER_BYTE
from nanomt.documents.markup import Item, Tag, Text, Translate
from nanomt.documents.zipped import open_zip

# The largest file taken, and how much a zipped one may unpack to (a zip bomb is refused before it is read).
MAX_UNZIPPED_BYTES = UNZIPPED_PER_BYTE * MAX_FILE_BYTES


SRT_START = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*\d+\r?\n\d+:\d\d:\d\d[,.]\d+ --> ")
HTML_START = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*<(?:!doctype html|html|head|body|p|div|h[1-6])[\s>]", re.IGNORECASE)


# What the server and the command line use; the errors and Progress are file_items', named here for them.
__all__ = [
    "HANDLERS",
    "CHUNK",
    "FileError",
    "FileTooLarge",
    "Progress",
    "UnsupportedFile",
    "file_format",
    "sniff_format",
    "translate_file",
]

# A zipped format known by the member that holds its content (OpenDocument and EPUB by their `mimetype` member).
ZIP_MEMBERS = {"word/document.xml": "docx", "ppt/presentation.xml": "pptx", "xl/workbook.xml": "xlsx"}
BY_MEDIA_TYPE = {media_type: name for name, media_type in MEDIA_TYPES.items()}


def _sniff_zip(data: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            found = [fmt for member, fmt in ZIP_MEMBERS.items() if member in names]
            if not found and "mimetype" in names and archive.getinfo("mimetype").file_size < 100:
                found = [BY_MEDIA_TYPE.get(archive.read("mimetype").decode("ascii", "replace").strip())]
    except (zipfile.BadZipFile, OSError, EOFError):
        found = []
    if not found or found[0] is None:
        raise UnsupportedFile("a zip archive of no format nanomt knows by its content; name the file with its suffix")
    return found[0]


def sniff_format(data: bytes) -> str:
    """The format of a file whose name has no suffix, from its bytes: a zip by the member holding its content, a
    PDF by its header, a file starting with an HTML tag HTML, one starting with a numbered cue SRT, else text."""
    if data.startswith(b"PK\x03\x04"):
        return _sniff_zip(data)
    if data.startswith(b"%PDF-"):
        return "pdf"
    if HTML_START.match(data):
        return "html"
    return "srt" if SRT_START.match(data) else "text"


def file_format(filename: str, data: bytes | None = None) -> str:
    """The format of a file, from its name's suffix, or from its bytes (`data`) where the name has none."""
    suffix = PurePath(filename).suffix.lower()
    if not suffix and data is not None:
        return sniff_format(data)
    if suffix not in FORMATS:
        known = ", ".join(FORMATS)
        raise UnsupportedFile(f"{filename}: unsupported file type {suffix or '(no suffix)'!r}; supported: {known}")
    return FORMATS[suffix]


def translate_file(
    data: bytes,
    fmt: str,
    translate: Translate,
    split: markup.Split | None = None,
    max_chars: int | None = None,
    max_bytes: int | None = None,
    target: str | None = None,
    progress: Progress | None = None,
) -> bytes:
    """A file's bytes translated into a file of the same format; an empty file gives an empty file. At most
    `max_bytes` (MAX_FILE_BYTES when None), unzipped to at most UNZIPPED_PER_BYTE times that, and `max_chars` of
    text (MAX_TEXT_CHARS when None). `target` (a language code) goes into the document's language tags; `progress`
    hears (sentences done, in all) after every chunk of CHUNK sentences, and may raise to stop the file."""
    if fmt not in HANDLERS:
        raise UnsupportedFile(f"unsupported format {fmt!r}; supported: {', '.join(HANDLERS)}")
    max_bytes = max_bytes or MAX_FILE_BYTES
    if len(data) > max_bytes:
        raise FileTooLarge(f"the file has {len(data):,} bytes; the limit is {max_bytes:,}")
    if not data:
        return b""
    unzipped = min(MAX_UNZIPPED_BYTES, UNZIPPED_PER_BYTE * max_bytes)
    chunked = _chunked(translate, progress) if progress else translate
    job = FileJob(_limited(chunked, min(max_chars or MAX_TEXT_CHARS, MAX_TEXT_CHARS)), split, unzipped, target)
    return HANDLERS[fmt](data, job)


def _limited(translate: Translate, max_chars: int) -> Translate:
    """translate, refusing (before any work) a file whose text goes over max_chars characters in all."""
    total = 0

    def run(sentences: list[str]) -> list[markup.Alignment]:
        nonlocal total
        total += sum(map(len, sentences))
        if total > max_chars:
            raise FileTooLarge(f"the file's text is longer than the limit of {max_chars:,} characters")
        return translate(sentences)

    return run


CHUNK = 64  # sentences translated between two progress reports (a batch of the server's size or more)


def _chunked(translate: Translate, progress: Progress) -> Translate:
    """translate, a chunk at a time, telling `progress` how far it has got. The total is what the calls so far
    asked for (a format that asks twice, Markdown's text then its HTML blocks, raises it once)."""
    done = total = 0

    def run(sentences: list[str]) -> list[markup.Alignment]:
        nonlocal done, total
        total += len(sentences)
        out = []
        progress(done, total)
        for at in range(0, len(sentences), CHUNK):
            out += translate(sentences[at : at + CHUNK])
            done += len(sentences[at : at + CHUNK])
            progress(done, total)
        return out

    return run


def _decode(data: bytes, what: str) -> str:
    """A text file's bytes as UTF-8 (a byte order mark dropped), or an UnsupportedFile naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UnsupportedFile(f"the {what} file is not UTF-8 text (invalid byte at offset {e.start})") from None


def _encode(text: str, data: bytes) -> bytes:
    """Text as UTF-8, with a byte order mark where the original had one."""
    return text.encode("utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8")


LINE = re.compile(r"([^\n]*?)(\r?\n|$)")


def _translate_text(data: bytes, job: FileJob) -> bytes:
    """Plain text: each line is a paragraph; blank lines, indentation and line endings stay as they were."""
    text = _decode(data, "text")
    lines = [m.groups() for m in LINE.finditer(text) if m.group()]
    done = markup.translate_segments([text_items(body) for body, _ in lines], job.translate, job.split)
    out = [(body if items is None else joined(items)) + end for (body, end), items in zip(lines, done)]
    return _encode("".join(out), data)


META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def _translate_html(data: bytes, job: FileJob) -> bytes:
    """HTML: sentences translated with their inline tags (markup), written in the document's own charset."""
    found = META_CHARSET.search(data[:4096])
    charset = found.group(1).decode("ascii") if found and not data.startswith(codecs.BOM_UTF8) else "UTF-8"
    encoding = "utf-8-sig" if charset == "UTF-8" else charset
    try:
        text = data.decode(encoding)
    except LookupError:
        raise UnsupportedFile(f"the HTML file declares an unknown charset {charset!r}") from None
    except UnicodeDecodeError as e:
        raise UnsupportedFile(f"the HTML file is not {charset} text (invalid byte at offset {e.start})") from None
    out = markup.translate_html([text], job.translate, job.split)[0]
    if charset == "UTF-8":  # a byte order mark where the original had one
        return _encode(out, data)
    return out.encode(encoding, errors="xmlcharrefreplace")  # characters the charset lacks become &#...;


# Markdown inline syntax: what is markup (kept) and what is text (translated).
MD_INLINE = re.compile(
    r"""(?P<code>`+)
    | (?P<escape>\\[!-/:-@\[-`{-~])
    | (?P<auto><(?:[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*|[^\s<>@]+@[^\s<>@]+)>)
    | (?P<comment><!--)
    | (?P<html></?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>)
    | (?P<open>!?\[)
    | (?P<close>\](?:\((?:[^()\s]|\([^()\s]*\))*(?:\s+(?:"[^"]*"|'[^']*'|\((?:[^()\\]|\\.)*\)))?\s*\)|\[[^\]]*\])?)
    | (?P<delim>\*+|_+|~~)""",
    re.VERBOSE,
)
# What closes a code span (a run of as many backticks as opened it, no more, no fewer) and an HTML comment.
CLOSER = re.compile(r"`+|-->")
PUNCTUATION = re.compile(r"[^\w\s]")


def _delimiter(line: str, a: int, b: int, pending: list[str]) -> Item:
    """An emphasis delimiter run at line[a:b]: an open, a close, or text (CommonMark's flanking rules, simplified)."""
    run, before, after = line[a:b], line[a - 1 : a] or " ", line[b : b + 1] or " "
    loose_before = before.isspace() or bool(PUNCTUATION.match(before))
    loose_after = after.isspace() or bool(PUNCTUATION.match(after))
    left = not after.isspace() and (not PUNCTUATION.match(after) or loose_before)
    right = not before.isspace() and (not PUNCTUATION.match(before) or loose_after)
    if run[0] == "_":  # no emphasis inside words joined by underscores (snake_case)
        left, right = left and (not right or loose_before), right and (not left or loose_after)
    if right and run in pending:
        pending.remove(run)
        return Tag("close", run, run)
    if left:
        pending.append(run)
        return Tag("open", run, run)
    return Tag("close", run, run) if right else Text(run)


def _closers(line: str) -> dict[str, list[int]]:
    """Where each closer in line starts, by its text. Looked up rather than searched for: a search for a closer that
    is not there runs to the end of the line, and a line of openers ran one from each (quadratic)."""
    found = defaultdict(list)
    for m in CLOSER.finditer(line):
        found[m.group()].append(m.start())
    return found


def _markdown_line(line: str, pending: list[str]) -> list[Item]:
    """One line of a Markdown block as text and tags: code, links' targets, emphasis markers and HTML are tags."""
    items, at, closers = [], 0, _closers(line)
    # Each search starts where the last piece ended: a match begun inside a code span or comment would hide what
    # follows it.
    while m := MD_INLINE.search(line, at):
        items += text_items(line[at : m.start()])
        kind, raw, at = m.lastgroup, m.group(), m.end()
        if kind in ("code", "comment"):
            closer = raw if kind == "code" else "-->"
            starts = closers.get(closer, [])
            k = bisect_left(starts, m.end())
            if k == len(starts):  # never closed: the opener is text
                items.append(Text(raw))
                continue
            at = starts[k] + len(closer)
            raw = line[m.start() : at]
        if kind == "delim":
            items.append(_delimiter(line, m.start(), m.end(), pending))
        elif kind in ("open", "close"):
            items.append(Tag(kind, raw, "link"))
        else:
            items.append(Tag("void", raw))
    return items + text_items(line[at:])


def _markdown_block(doc: str, spans: list[tuple[int, int]]) -> list[Item]:
    """A block's lines as items; each line break, with the next line's prefix (> or indentation), a spacing void."""
    items, pending = [], []
    for i, (a, b) in enumerate(spans):
        if i + 1 < len(spans):
            body = doc[a:b].rstrip(" \t")
            b = a + len(body) - body.endswith("\\")  # a hard break (two spaces or a backslash) stays at the line end
            items += _markdown_line(doc[a:b], pending)
            items.append(Tag("void", doc[b : spans[i + 1][0]], space=True))
        else:
            items += _markdown_line(doc[a:b], pending)
    return items


def _markdown_regions(doc: str) -> tuple[list[tuple[int, int, list[Item]]], list[tuple[int, int]]]:
    """The text blocks of a Markdown document (with their items) and its HTML blocks, as spans of doc."""
    markdown_it = library("markdown")
    lines = doc.split("\n")
    starts = [0]
    for text in lines:
        starts.append(starts[-1] + len(text) + 1)
    blocks, html_blocks, cursor = [], [], {}
    for token in markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough").parse(doc):
        if token.map is None:
            continue
        if token.type == "html_block":
            html_blocks.append((starts[token.map[0]], min(starts[token.map[1]], len(doc))))
        if token.type != "inline" or not token.content.strip():
            continue
        spans = []
        for k, content in zip(range(token.map[0], token.map[1]), token.content.split("\n")):
            at = lines[k].find(content, cursor.get(k, 0))
            if at < 0:  # a line markdown-it rewrote (tabs, escaped pipes): the block is kept as it is
                break
            cursor[k] = at + len(content)
            spans.append((starts[k] + at, starts[k] + at + len(content)))
        if len(spans) == len(token.content.split("\n")):
            blocks.append((spans[0][0], spans[-1][1], _markdown_block(doc, spans)))
    return blocks, html_blocks


def _translate_markdown(data: bytes, job: FileJob) -> bytes:
    """Markdown: text blocks translated with emphasis, links and inline code kept; code blocks untouched."""
    text = _decode(data, "Markdown")
    crlf = "\r\n" in text
    doc = text.replace("\r\n", "\n")
    blocks, html_blocks = _markdown_regions(doc)
    done = markup.translate_segments([items for _, _, items in blocks], job.translate, job.split)
    edits = [(a, b, joined(items)) for (a, b, _), items in zip(blocks, done) if items is not None]
    html_done = markup.translate_html([doc[a:b] for a, b in html_blocks], job.translate, job.split)
    edits += [(a, b, out) for (a, b), out in zip(html_blocks, html_done)]
    for a, b, out in sorted(edits, reverse=True):
        doc = doc[:a] + out + doc[b:]
    return _encode(doc.replace("\n", "\r\n") if crlf else doc, data)


SRT_TAG = re.compile(r"(</?(i|b|u|font)\b[^>]*>|\{\\[^}]*\})", re.IGNORECASE)


def _srt_items(content: str) -> list[Item]:
    """A subtitle's text and its tags (<i>, <b>, <u>, <font>, {\\an8}); its line breaks keep their places."""
    items, parts = [], SRT_TAG.split(content)
    for i in range(0, len(parts), 3):
        items += text_items(parts[i])
        if i + 1 < len(parts):
            raw, name = parts[i + 1], (parts[i + 2] or "").lower()
            kind = "void" if not name else "close" if raw.startswith("</") else "open"
            items.append(Tag(kind, raw, name))
    return items


def _translate_srt(data: bytes, job: FileJob) -> bytes:
    """Subtitles (SRT): each subtitle's text translated, its timing, numbering and line count kept."""
    srt = library("srt")
    text = _decode(data, "SRT")
    try:
        subtitles = list(srt.parse(text))
    except (srt.SRTParseError, ValueError) as e:
        raise UnsupportedFile(f"not a valid SRT file: {str(e).splitlines()[0]}") from None
    done = markup.translate_segments([_srt_items(s.content) for s in subtitles], job.translate, job.split)
    for subtitle, items in zip(subtitles, done):
        if items is not None:
            subtitle.content = joined(items)
    eol = "\r\n" if "\r\n" in text else "\n"
    return _encode(srt.compose(subtitles, reindex=False, strict=False, eol=eol), data)


# Word. A run holding only text is an element (its formatting goes where its words go); hyperlinks and tracked
# insertions are elements holding runs; anything else (fields, drawings, bookmarks) is a void kept whole. runs.write
# puts them back, as it does PowerPoint's and Excel's.
W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
TEXT_RUN = frozenset({f"{W}rPr", f"{W}t", f"{W}tab", f"{W}br", f"{W}cr", f"{W}lastRenderedPageBreak"})
CONTAINERS = frozenset({f"{W}hyperlink", f"{W}smartTag", f"{W}ins", f"{W}customXml"})
WORD_PARTS = frozenset(
    f"application/vnd.openxmlformats-officedocument.wordprocessingml.{kind}+xml"
    for kind in ("document.main", "header", "footer")
)


def _is_text_run(run) -> bool:
    """Whether a run holds only text, tabs and line breaks (a page break or a picture makes it a void)."""
    breaks = run.findall(f"{W}br")
    return all(c.tag in TEXT_RUN for c in run) and all(b.get(f"{W}type") in (None, "textWrapping") for b in breaks)


def _docx_items(parent, items: list[Item], field: list[int]) -> None:
    """A paragraph's (or container's) content as items; runs inside a complex field (field[0] > 0) stay voids."""
    for child in parent:
        if child.tag.endswith("Pr"):  # properties stay first in their element
            continue
        if child.tag == f"{W}r" and field[0] == 0 and _is_text_run(child):
            items.append(Tag("open", child, str(id(child))))
            items += text_items(child.text)
            items.append(Tag("close", child, str(id(child))))
        elif child.tag in CONTAINERS and field[0] == 0:
            items.append(Tag("open", child, str(id(child))))
            _docx_items(child, items, field)
            items.append(Tag("close", child, str(id(child))))
            continue  # its fields were counted inside
        else:
            items.append(Tag("void", child))
        for mark in child.iter(f"{W}fldChar"):
            field[0] += {"begin": 1, "end": -1}.get(mark.get(f"{W}fldCharType"), 0)


def _set_run_text(run, text: str) -> None:
    run.text = text  # python-docx's CT_R writes tabs and line breaks as w:tab and w:br


def _translate_docx(data: bytes, job: FileJob) -> bytes:
    """Word (.docx): paragraphs of the body, tables, headers and footers translated; runs keep their formatting."""
    open_zip(data, job.unzipped, "Word .docx").close()
    docx = library("docx")
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as e:  # python-docx raises many kinds on a broken package
        raise UnsupportedFile(f"not a valid Word .docx file: {type(e).__name__}: {e}") from None
    parts = [p for p in document.part.package.iter_parts() if p.content_type in WORD_PARTS]
    paragraphs = [p for part in parts for p in part.element.iter(f"{W}p")]
    segments, sources = [], []
    for paragraph in paragraphs:
        items = []
        _docx_items(paragraph, items, [0])
        segments.append(runs.edges(items))
        opened = [i.raw for i in items if isinstance(i, Tag) and i.kind == "open" and i.raw.tag == f"{W}r"]
        sources.append({run: run.text for run in opened})
    done = markup.translate_segments(segments, job.translate, job.split)
    for paragraph, items, source in zip(paragraphs, done, sources):
        if items is not None:
            runs.write(paragraph, items, source, _set_run_text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# Each format's handler: (the file's bytes, what translating it needs) -> the translated file's bytes.
HANDLERS: dict[str, Callable[[bytes, FileJob], bytes]] = {
    "text": _translate_text,
    "html": _translate_html,
    "markdown": _translate_markdown,
    "srt": _translate_srt,
    "docx": _translate_docx,
    "odt": odf.translate_odt,
    "odp": odf.translate_odp,
    "ods": odf.translate_ods,
    "pptx": pptx.translate_pptx,
    "xlsx": xlsx.translate_xlsx,
    "epub": epub.translate_epub,
    "pdf": pdf.translate_pdf,
}
