"""Excel (.xlsx): the text cells translated, plain and rich text, whether the workbook shares them
(xl/sharedStrings.xml) or a cell holds its own (an inline string); numbers, dates, formulas and their results,
styles, sheet names and every other part kept byte for byte."""

# A string (a shared one, si, or an inline one, is) is a plain t or runs (r: the formatting in rPr, then the text in
# t), with phonetic guides (rPh, phoneticPr) after them, kept as they are. A plain t is read as one run; runs are
# elements around their words, so their formatting follows them. A string shared by several cells is one si,
# translated once. Kept as they are: sheet names and defined names (formulas name them), a table's header cells
# (the table's columns are named by them, and structured references in formulas by those names), comments, charts,
# headers and footers. SpreadsheetML has no language on its text: job.target is not written.

from __future__ import annotations

import re

from nanomt.documents import markup, runs
from nanomt.documents.file_items import FileJob, UnsupportedFile, library
from nanomt.documents.markup import Item, Tag
from nanomt.documents.zipped import open_zip, rewrite_zip

WHAT = "Excel .xlsx"
SML = "application/vnd.openxmlformats-officedocument.spreadsheetml."
WORKBOOKS = frozenset(
    [SML + f"{kind}.main+xml" for kind in ("sheet", "template")]
    + [f"application/vnd.ms-excel.{kind}.macroEnabled.main+xml" for kind in ("sheet", "template", "addin")]
)
SHARED, SHEET = SML + "sharedStrings+xml", SML + "worksheet+xml"
MAIN = (
    "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}",
    "{http://purl.oclc.org/ooxml/spreadsheetml/main}",
)

# SpreadsheetML writes a character XML cannot hold (and a carriage return) as _xHHHH_, and a literal "_x" that would
# read as one with its underscore escaped (_x005F_).
ESCAPED = re.compile(r"_x([0-9A-Fa-f]{4})_")
TO_ESCAPE = re.compile(r"_(?=x[0-9A-Fa-f]{4}_)|[\x00-\x08\x0b-\x1f\ufffe\uffff]")
CELL = re.compile(r"([A-Za-z]{1,3})([0-9]+)")


def _unescape(text: str) -> str:
    def char(m: re.Match) -> str:
        code = int(m.group(1), 16)
        return m.group() if 0xD800 <= code <= 0xDFFF else chr(code)  # half a surrogate pair: left as written

    return ESCAPED.sub(char, text)


def _escape(text: str) -> str:
    return TO_ESCAPE.sub(lambda m: f"_x{ord(m.group()):04X}_", text)


def _string_items(string, s: str) -> tuple[list[Item], dict]:
    """A string's (si's or is's) content as items, and each run's text: a plain t is one run, an r another."""
    items, source = [], {}
    for child in string:
        if child.tag in (f"{s}rPh", f"{s}phoneticPr"):
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


def _kept(s: str):
    """Children of a string that stay where they are: the phonetic guides, after the runs."""
    return lambda child: child.tag in (f"{s}rPh", f"{s}phoneticPr")


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


def translate_xlsx(data: bytes, job: FileJob) -> bytes:
    """Excel (.xlsx): the shared strings and inline strings translated; everything else kept as it was."""
    etree = library("xlsx")
    with open_zip(data, job.unzipped, WHAT) as archive:
        package = runs.Package(archive, WHAT, etree)
        if not package.parts(WORKBOOKS):
            raise UnsupportedFile(f"not a valid {WHAT} file (no workbook in {runs.CONTENT_TYPES})")
        strings, kept = [], set()  # (si or is, main namespace); the indexes of shared strings kept
        for sheet in package.parts({SHEET}):
            headers = _headers(package, sheet)
            if not headers and b"inlineStr" not in package.read(sheet):
                continue  # nothing in it to translate or keep: not parsed
            root = package.xml(sheet)
            s = runs.namespace(root, *MAIN)
            for row, column, c in _cells(root, s):
                header = (row, column) in headers
                if c.get("t") == "s" and header and (c.findtext(f"{s}v") or "").strip().isdigit():
                    kept.add(int(c.findtext(f"{s}v")))
                elif c.get("t") == "inlineStr" and not header and c.find(f"{s}f") is None:
                    strings += [(string, s) for string in c.iterfind(f"{s}is")]
        for part in package.parts({SHARED}):
            root = package.xml(part)
            s = runs.namespace(root, *MAIN)
            strings += [(si, s) for i, si in enumerate(root.iterfind(f"{s}si")) if i not in kept]
        read = [_string_items(string, s) for string, s in strings]
        done = markup.translate_segments([items for items, _ in read], job.translate, job.split)
        for (string, s), (_, source), items in zip(strings, read, done):
            if items is not None:
                runs.write(string, items, source, _run_text(s), _kept(s))
        changed = package.changed()
        return rewrite_zip(archive, changed) if changed else data
