"""Excel (.xlsx): the text cells translated, plain and rich text, whether the workbook shares them
(xl/sharedStrings.xml) or a cell holds its own (an inline string), the comments on cells (notes, and Excel 365's
threaded comments) and the pages' headers and footers; numbers, dates, formulas and their results, styles, sheet names
and every other part kept byte for byte."""

# A string (a shared one, si, or an inline one, is) is a plain t or runs (r: the formatting in rPr, then the text in
# t), with phonetic guides (rPh, phoneticPr) after them, kept as they are. A plain t is read as one run; runs are
# elements around their words, so their formatting follows them. A string shared by several cells is one si,
# translated once. Kept as they are: sheet names and defined names (formulas name them), a table's header cells
# (the table's columns are named by them, and structured references in formulas by those names), charts. A note's
# text is a string too; Excel starts it with its author's name and a colon in a run of its own, kept as it is. A
# threaded comment's text is plain. A page header's or footer's text is its sections (&L, &C, &R), each a paragraph,
# and its other codes (the page number &P, a font, bold on or off, an ampersand written &&) void tags that follow
# their words. SpreadsheetML has no language on its text: job.target is not written.

from __future__ import annotations

import re

from nanomt.documents import markup, runs
from nanomt.documents.file_items import FileJob, UnsupportedFile, joined, library, text_items
from nanomt.documents.markup import Item, Tag
from nanomt.documents.zipped import open_zip, rewrite_zip

WHAT = "Excel .xlsx"
SML = "application/vnd.openxmlformats-officedocument.spreadsheetml."
WORKBOOKS = frozenset(
    [SML + f"{kind}.main+xml" for kind in ("sheet", "template")]
    + [f"application/vnd.ms-excel.{kind}.macroEnabled.main+xml" for kind in ("sheet", "template", "addin")]
)
SHARED, SHEET, NOTES = SML + "sharedStrings+xml", SML + "worksheet+xml", SML + "comments+xml"
THREADED = "application/vnd.ms-excel.threadedcomments+xml"
THREADED_NS = "{http://schemas.microsoft.com/office/spreadsheetml/2018/threadedcomments}"
MAIN = (
    "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}",
    "{http://purl.oclc.org/ooxml/spreadsheetml/main}",
)

# SpreadsheetML writes a character XML cannot hold (and a carriage return) as _xHHHH_, and a literal "_x" that would
# read as one with its underscore escaped (_x005F_).
ESCAPED = re.compile(r"_x([0-9A-Fa-f]{4})_")
TO_ESCAPE = re.compile(r"_(?=x[0-9A-Fa-f]{4}_)|[\x00-\x08\x0b-\x1f\ufffe\uffff]")
CELL = re.compile(r"([A-Za-z]{1,3})([0-9]+)")
# A page header's or footer's codes: an escaped ampersand, a font ("&\"Arial,Bold\""), a size, a colour, a letter's
# field or switch; a lone ampersand is kept as it is too.
PAGE_CODE = re.compile(r'&(?:&|"[^"]*"|[0-9]+|K(?:[0-9A-Fa-f]{6}|[0-9]{2}[+-][0-9]{3})|[A-Za-z+-])?')
PAGE_SECTIONS = ("&L", "&C", "&R", "&l", "&c", "&r")
PAGE_TEXTS = ("oddHeader", "oddFooter", "evenHeader", "evenFooter", "firstHeader", "firstFooter")


def _unescape(text: str) -> str:
    def char(m: re.Match) -> str:
        code = int(m.group(1), 16)
        return m.group() if 0xD800 <= code <= 0xDFFF else chr(code)  # half a surrogate pair: left as written

    return ESCAPED.sub(char, text)


def _escape(text: str) -> str:
    return TO_ESCAPE.sub(lambda m: f"_x{ord(m.group()):04X}_", text)


def _string_items(string, s: str, kept) -> tuple[list[Item], dict]:
    """A string's (si's, is's or a note's text's) content as items, and each run's text: a plain t is one run, an r
    another; the `kept` children are left out."""
    items, source = [], {}
    for child in string:
        if kept(child):
            continue
        if child.tag in (f"{s}t", f"{s}r"):
            t = child if child.tag == f"{s}t" else child.find(f"{s}t")
            text = _unescape("" if t is None else t.text or "")
            items += runs.run_items(child, text)
            source[child] = text
        else:
            items.append(Tag("void", child))
    return runs.edges(items), source


def _run_text(s: str):
    """What writes a run's text: into the t that is the run, or the r's t."""

    def write(run, text: str) -> None:
        t = run if run.tag == f"{s}t" else run.find(f"{s}t")
        if t is None:
            t = run.makeelement(f"{s}t", {})
            run.append(t)
        runs.set_text(t, _escape(text))

    return write


def _kept(s: str, label=None):
    """Children of a string that stay where they are: the phonetic guides, after the runs, and a note's author's
    label, before them."""
    return lambda child: child.tag in (f"{s}rPh", f"{s}phoneticPr") or child is label


def _author_label(text, s: str, labels: set[str]):
    """The run Excel starts a note with, its author's name and a colon ("Ann Lee:"), or None."""
    first = next(iter(text), None)
    if first is None or first.tag != f"{s}r":
        return None
    return first if _unescape(first.findtext(f"{s}t") or "").strip() in labels else None


def _notes(package: runs.Package) -> list[tuple]:
    """Each note's text, its namespace and the children it keeps: (text, s, kept)."""
    out = []
    for part in package.parts({NOTES}):
        root = package.xml(part)
        s = runs.namespace(root, *MAIN)
        authors = {(a.text or "").strip() for a in root.iterfind(f"{s}authors/{s}author")} - {""}
        labels = {f"{author}:" for author in authors}
        for text in root.iterfind(f"{s}commentList/{s}comment/{s}text"):
            out.append((text, s, _kept(s, _author_label(text, s, labels))))
    return out


def _translate_threaded(package: runs.Package, job: FileJob) -> None:
    """Excel 365's threaded comments: each one's plain text, as a paragraph of its own."""
    texts = [
        text
        for part in package.parts({THREADED})
        for text in package.xml(part).iterfind(f"{THREADED_NS}threadedComment/{THREADED_NS}text")
        if (text.text or "").strip()
    ]
    done = markup.translate_segments([text_items(text.text) for text in texts], job.translate, job.split)
    for text, items in zip(texts, done):
        if items is not None:
            text.text = joined(items)


def _position(ref: str) -> tuple[int, int]:
    """A cell reference ("B3") as (row, column), both from 1; (0, 0) for what is no reference."""
    m = CELL.fullmatch(ref.replace("$", ""))
    if not m:
        return 0, 0
    column = 0
    for letter in m.group(1).upper():
        column = 26 * column + ord(letter) - 64
    return int(m.group(2)), column


def _cells(sheet, s: str):
    """Each cell of a worksheet as (row, column, c); a row or cell without its reference follows the one before."""
    row = 0
    for r in sheet.iterfind(f"{s}sheetData/{s}row"):
        row = int(r.get("r")) if (r.get("r") or "").isdigit() else row + 1
        column = 0
        for c in r.iterfind(f"{s}c"):
            column = _position(c.get("r"))[1] if c.get("r") else column + 1
            yield row, column, c


def _headers(package: runs.Package, sheet: str) -> set[tuple[int, int]]:
    """Where the header cells of the sheet's tables are."""
    cells = set()
    for name in package.related(sheet, "table"):
        table = package.xml(name)
        if table.get("headerRowCount", "1") == "0" or ":" not in (table.get("ref") or ""):
            continue
        (r1, c1), (_, c2) = map(_position, table.get("ref").split(":", 1))
        cells.update((r1, c) for c in range(c1, c2 + 1))
    return cells


def _page_sections(text: str) -> list[str | list[Item]]:
    """A page header's or footer's text (unescaped) as its section codes (strings) and the paragraphs between them
    (items)."""
    out: list[str | list[Item]] = [[]]
    at = 0
    for m in [*PAGE_CODE.finditer(text), None]:
        end = m.start() if m else len(text)
        if end > at:
            out[-1] += text_items(text[at:end])
        if m is None:
            break
        if m.group() in PAGE_SECTIONS:
            out += [m.group(), []]
        else:
            out[-1].append(Tag("void", m.group()))
        at = m.end()
    return out


def _translate_pages(elements: list, job: FileJob) -> None:
    """The page headers' and footers' texts (see _page_sections), each section translated as a paragraph."""
    texts = [_unescape(element.text) for element in elements]
    read = [_page_sections(text) for text in texts]
    paragraphs = [part for parts in read for part in parts if not isinstance(part, str)]
    done = iter(markup.translate_segments(paragraphs, job.translate, job.split))
    for element, text, parts in zip(elements, texts, read):
        written = "".join(part if isinstance(part, str) else joined(next(done) or part) for part in parts)
        if written != text:  # text as it was is left as it was, escapes and all
            element.text = _escape(written)


def translate_xlsx(data: bytes, job: FileJob) -> bytes:
    """Excel (.xlsx): the shared strings, inline strings, comments, headers and footers translated; everything else
    kept as it was."""
    etree = library("xlsx")
    with open_zip(data, job.unzipped, WHAT) as archive:
        package = runs.Package(archive, WHAT, etree)
        if not package.parts(WORKBOOKS):
            raise UnsupportedFile(f"not a valid {WHAT} file (no workbook in {runs.CONTENT_TYPES})")
        pages = []  # the sheets' page headers and footers with text
        strings, kept = [], set()  # (si or is, main namespace, its kept children); the indexes of shared strings kept
        for sheet in package.parts({SHEET}):
            headers = _headers(package, sheet)
            if not headers and not any(k in package.read(sheet) for k in (b"inlineStr", b"headerFooter")):
                continue  # nothing in it to translate or keep: not parsed
            root = package.xml(sheet)
            s = runs.namespace(root, *MAIN)
            pages += [e for name in PAGE_TEXTS for e in root.iterfind(f"{s}headerFooter/{s}{name}") if e.text]
            for row, column, c in _cells(root, s):
                header = (row, column) in headers
                if c.get("t") == "s" and header and (c.findtext(f"{s}v") or "").strip().isdigit():
                    kept.add(int(c.findtext(f"{s}v")))
                elif c.get("t") == "inlineStr" and not header and c.find(f"{s}f") is None:
                    strings += [(string, s, _kept(s)) for string in c.iterfind(f"{s}is")]
        for part in package.parts({SHARED}):
            root = package.xml(part)
            s = runs.namespace(root, *MAIN)
            strings += [(si, s, _kept(s)) for i, si in enumerate(root.iterfind(f"{s}si")) if i not in kept]
        strings += _notes(package)
        read = [_string_items(*string) for string in strings]
        done = markup.translate_segments([items for items, _ in read], job.translate, job.split)
        for (string, s, keep), (_, source), items in zip(strings, read, done):
            if items is not None:
                runs.write(string, items, source, _run_text(s), keep)
        _translate_threaded(package, job)
        _translate_pages(pages, job)
        changed = package.changed()
        return rewrite_zip(archive, changed) if changed else data
