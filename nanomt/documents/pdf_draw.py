"""The translations drawn with reportlab, one overlay page for each page: each block's text wrapped inside the block's
box in the largest size up to its original that fits (at least MIN_SIZE; below that the text runs past the box's
bottom rather than be lost), in its colour, its alignment (left, centred, right, justified) and a standard font of
its kind. A block's paragraphs start where they started (a table's rows stay level), or lower where the ones before
need the room. A block with nothing to translate (numbers, symbols) is drawn line by line where it was.

Fonts: text that Windows-1252 (PDF's WinAnsi) covers is drawn in Helvetica, Times or Courier (by the original font's
name), bold and italic where the original was; these are PDF's standard fonts, not embedded. Other text is drawn in
DejaVu Sans (or Serif) where the system has it (embedded, subset), else in Bitstream Vera (which reportlab bundles;
Latin only); Chinese, Japanese and Korean in Adobe's CID fonts that PDF readers supply (not embedded). A character
none of them has is drawn as "?". Text is drawn left to right without shaping: Arabic and Indic scripts come out
unjoined."""

from __future__ import annotations

import io
import re
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nanomt.documents.file_items import library
from nanomt.documents.pdf_clean import inverse, page_matrix
from nanomt.documents.pdf_text import CJK, Block, Page

MIN_SIZE = 4.0  # the smallest size a translation is shrunk to (points)
TOKEN = re.compile(rf"(\s*)([{CJK}]|[^\s{CJK}]+)")  # a word, or one CJK character (a line may break after any)
STANDARD = {
    "sans": ("Helvetica", "Helvetica-Bold", "Helvetica-Oblique", "Helvetica-BoldOblique"),
    "serif": ("Times-Roman", "Times-Bold", "Times-Italic", "Times-BoldItalic"),
    "mono": ("Courier", "Courier-Bold", "Courier-Oblique", "Courier-BoldOblique"),
}
SERIF = re.compile(
    r"times|serif|roman|georgia|garamond|minion|cambria|palatino|antiqua|baskerville|caslon|charter|"
    r"utopia|bookman|century|^cm[rb]|lmroman|nimbusrom|tinos|pt-?serif|source-?serif|noto-?serif"
)
MONO = re.compile(r"courier|mono|consol|code|^cmtt|lmtypewriter|menlo|inconsolata")
# The TrueType fonts tried, by kind and style (regular, bold, italic, bold italic): DejaVu from the system's font
# folders, then reportlab's own Vera.
DEJAVU = {
    "sans": ("DejaVuSans", "DejaVuSans-Bold", "DejaVuSans-Oblique", "DejaVuSans-BoldOblique"),
    "serif": ("DejaVuSerif", "DejaVuSerif-Bold", "DejaVuSerif-Italic", "DejaVuSerif-BoldItalic"),
    "mono": ("DejaVuSansMono", "DejaVuSansMono-Bold", "DejaVuSansMono-Oblique", "DejaVuSansMono-BoldOblique"),
}
VERA = ("Vera", "VeraBd", "VeraIt", "VeraBI")
FONT_DIRS = (
    "/usr/share/fonts/truetype/dejavu",
    "/usr/share/fonts/dejavu",
    "/usr/share/fonts/TTF",
    "/usr/share/fonts/dejavu-sans-fonts",
    "/usr/share/fonts/dejavu-serif-fonts",
    "/usr/share/fonts/dejavu-sans-mono-fonts",
    "/usr/local/share/fonts",
    "/usr/local/share/fonts/dejavu",
)
# Adobe's CID fonts for Chinese (simplified, traditional), Japanese and Korean, by the target language.
CID = {
    "zh": "STSong-Light",
    "zh-tw": "MSung-Light",
    "zh-hant": "MSung-Light",
    "ja": "HeiseiKakuGo-W5",
    "ko": "HYGothic-Medium",
}
HANGUL = re.compile("[\uac00-\ud7af]")
KANA = re.compile("[\u3040-\u30ff]")
HAS_CJK = re.compile(f"[{CJK}]")
_registering = threading.Lock()


def overlay(pages: list[Page], texts: list[list[list[str] | None]], language: str | None) -> bytes:
    """A PDF of one page for each page, holding the translations: texts[page][block] is a block's paragraphs
    translated, or None to draw its original lines as they were (a block with no words to translate)."""
    canvas = library("pdf", "reportlab.pdfgen.canvas")
    out = io.BytesIO()
    c = canvas.Canvas(out, invariant=1, pageCompression=1)
    for page, page_texts in zip(pages, texts):
        x0, y0, x1, y1 = page.mediabox
        c.setPageSize((max(1.0, x1 - x0), max(1.0, y1 - y0)))
        for block, paragraphs in zip(page.blocks, page_texts):
            c.saveState()
            c.transform(*inverse(page_matrix(page.mediabox, block.view)))  # where pdfminer read it, on the page turned
            if paragraphs is None:
                _draw_lines(c, block)
            else:
                _draw_block(c, block, paragraphs, language)
            c.restoreState()
        c.showPage()
    c.save()
    return out.getvalue()


@dataclass
class _Font:
    name: str  # as registered with reportlab
    descent: float  # at size 1 (negative)
    covers: object  # a character -> whether the font has it


def _kind(block: Block) -> str:
    name = block.font.lower()
    return "mono" if MONO.search(name) else "serif" if SERIF.search(name) and "sans" not in name else "sans"


def _font(text: str, block: Block, language: str | None) -> tuple[_Font, str]:
    """The font a block's text is drawn in, and the text with the characters it lacks as '?'."""
    style = 2 * block.italic + block.bold
    kind = _kind(block)
    try:
        text.encode("cp1252")
        return _standard(STANDARD[kind][style]), text
    except UnicodeEncodeError:
        pass
    if HAS_CJK.search(text):
        return _cid(_cid_name(text, language)), text
    candidates = [
        f
        for f in (
            _ttf(DEJAVU[kind][style]),
            _ttf(DEJAVU["sans"][style]),
            _ttf(DEJAVU["sans"][0]),
            _ttf(VERA[style], bundled=True),
        )
        if f is not None
    ]
    chars = {ch for ch in text if not ch.isspace()}
    best = max(candidates, key=lambda f: sum(map(f.covers, chars)))  # the first with the most
    return best, "".join(ch if ch.isspace() or best.covers(ch) else "?" for ch in text)


def _cid_name(text: str, language: str | None) -> str:
    code = (language or "").lower().replace("_", "-")
    for key in (code, code.split("-")[0]):
        if key in CID:
            return CID[key]
    return CID["ko"] if HANGUL.search(text) else CID["ja"] if KANA.search(text) else CID["zh"]


@cache
def _standard(name: str) -> _Font:
    pdfmetrics = library("pdf", "reportlab.pdfbase.pdfmetrics")
    return _Font(name, pdfmetrics.getAscentDescent(name, 1.0)[1], lambda ch: True)


@cache
def _cid(name: str) -> _Font:
    pdfmetrics = library("pdf", "reportlab.pdfbase.pdfmetrics")
    cidfonts = library("pdf", "reportlab.pdfbase.cidfonts")
    with _registering:
        pdfmetrics.registerFont(cidfonts.UnicodeCIDFont(name))
    return _Font(name, pdfmetrics.getAscentDescent(name, 1.0)[1], lambda ch: True)


@cache
def _ttf(stem: str, bundled: bool = False) -> _Font | None:
    """A TrueType font by its file's stem, registered with reportlab, or None where no folder has it."""
    pdfmetrics = library("pdf", "reportlab.pdfbase.pdfmetrics")
    ttfonts = library("pdf", "reportlab.pdfbase.ttfonts")
    rl_config = library("pdf", "reportlab.rl_config")
    reportlab = library("pdf", "reportlab")
    dirs = [Path(reportlab.__file__).parent / "fonts"] if bundled else [*FONT_DIRS, *rl_config.TTFSearchPath]
    path = next((Path(d) / f"{stem}.ttf" for d in dirs if (Path(d) / f"{stem}.ttf").is_file()), None)
    if path is None:
        return None
    name = f"nanomt-{stem}"
    with _registering:
        font = ttfonts.TTFont(name, str(path))
        pdfmetrics.registerFont(font)
    glyphs = font.face.charToGlyph
    return _Font(name, pdfmetrics.getAscentDescent(name, 1.0)[1], lambda ch: ord(ch) in glyphs)


def _cover(c, block: Block) -> None:
    """Under the text of an OCR layer (invisible text over a scan), a white box hiding the scan's own words."""
    if block.hidden:
        x0, y0, x1, y1 = block.box
        c.setFillGray(1.0)
        c.rect(x0 - 1, y0 - 1, x1 - x0 + 2, y1 - y0 + 2, stroke=0, fill=1)


def _set_color(c, color: tuple[float, ...]) -> None:
    if len(color) == 4:
        c.setFillColorCMYK(*color)
    elif len(color) == 3:
        c.setFillColorRGB(*color)
    else:
        c.setFillGray(color[0])


def _draw_lines(c, block: Block) -> None:
    """A block drawn as it was, line by line at its lines' places (numbers, symbols), each line shrunk where the
    standard font is wider than the original one."""
    pdfmetrics = library("pdf", "reportlab.pdfbase.pdfmetrics")
    _cover(c, block)
    _set_color(c, (0.0,) if block.hidden else block.color)
    for paragraph in block.paragraphs:
        for line in paragraph.lines:
            font, text = _font(line.text, block, None)
            width = pdfmetrics.stringWidth(text, font.name, line.size)
            size = line.size * min(1.0, (line.box[2] - line.box[0]) / width) if width > 0 else line.size
            c.setFont(font.name, size)
            c.drawString(line.box[0], line.baseline, text)


Token = tuple[str, bool, float]  # text, whether a space comes before it, width at size 1


def _tokens(text: str, width) -> list[Token]:
    return [(m.group(2), bool(m.group(1)), width(m.group(2))) for m in TOKEN.finditer(text)]


def _wrap(tokens: list[Token], first: float, rest: float, space: float, width) -> tuple[list[list[Token]], bool]:
    """Tokens in lines (greedy) no wider than `first` (the first line) and `rest` (the others), at size 1, and
    whether a word wider than a line had to be broken between its characters."""
    lines, line, used, limit, broke = [], [], 0.0, first, False
    for text, spaced, w in tokens:
        gap = space if line and spaced else 0.0
        if line and used + gap + w > limit:
            lines.append(line)
            line, used, limit, gap = [], 0.0, rest, 0.0
        if not line and w > limit:
            broke, piece, pw = True, "", 0.0
            for ch in text:
                cw = width(ch)
                if piece and pw + cw > limit:
                    lines.append([(piece, False, pw)])
                    piece, pw, limit = "", 0.0, rest
                piece, pw = piece + ch, pw + cw
            line, used = [(piece, False, pw)], pw
            continue
        line.append((text, spaced and bool(line), w))
        used += gap + w
    if line:
        lines.append(line)
    return lines, broke


@dataclass
class _Laid:
    lines: list[list[list[Token]]]  # each paragraph's
    tops: list[float]  # where each paragraph's first line's characters reach up to
    fits: bool


def _layout(block: Block, tokens: list[list[Token]], space: float, width, size: float, breaking: bool) -> _Laid:
    """Each paragraph's lines at a size, placed from the box's top: a paragraph starts where it started in the
    original, or lower where the ones before it need the room. They fit if they end above the box's bottom
    without a word broken (unless `breaking`)."""
    x0, y0, x1, y1 = block.box
    wide, step = x1 - x0, block.pitch * size
    laid, tops, cursor, bottom, broken = [], [], y1, y1, False
    for p, t in zip(block.paragraphs, tokens):
        lines, broke = _wrap(t, max(1e-6, wide - p.first) / size, max(1e-6, wide - p.rest) / size, space, width)
        top = min(cursor, p.top)
        laid.append(lines)
        tops.append(top)
        if lines:
            bottom = top - (len(lines) - 1) * step - size
            cursor = top - len(lines) * step
        broken |= broke
    return _Laid(laid, tops, bottom >= y0 - 0.01 - 1e-9 * abs(y0) and (breaking or not broken))


def _draw_block(c, block: Block, paragraphs: list[str], language: str | None) -> None:
    """A block's translation in its box, in the largest size (up to the original) at which it fits."""
    pdfmetrics = library("pdf", "reportlab.pdfbase.pdfmetrics")
    font, joined = _font("\n".join(paragraphs), block, language)
    widths: dict[str, float] = {}

    def width(text: str) -> float:
        if text not in widths:
            widths[text] = pdfmetrics.stringWidth(text, font.name, 1.0)
        return widths[text]

    tokens = [_tokens(p, width) for p in joined.split("\n")]
    space = width(" ")
    size = block.size
    laid = _layout(block, tokens, space, width, size, False)
    if not laid.fits:
        low, high = min(MIN_SIZE, block.size), block.size
        if _layout(block, tokens, space, width, low, False).fits:
            for _ in range(14):  # the largest size that fits, to within 0.01% of the original
                middle = (low + high) / 2
                if _layout(block, tokens, space, width, middle, False).fits:
                    low = middle
                else:
                    high = middle
        size = low
        laid = _layout(block, tokens, space, width, size, True)  # at the floor: words broken, the bottom passed
    x0, y0, x1, y1 = block.box
    _cover(c, block)
    _set_color(c, (0.0,) if block.hidden else block.color)
    c.setFont(font.name, size)
    for paragraph, lines, top in zip(block.paragraphs, laid.lines, laid.tops):
        baseline = top - (1 + font.descent) * size  # its first line's characters reach up to its top
        for k, line in enumerate(lines):
            indent = paragraph.first if k == 0 else paragraph.rest
            _draw_line(c, line, x0 + indent, x1, baseline, size, space, block.align, last=k == len(lines) - 1)
            baseline -= block.pitch * size


def _draw_line(
    c, line: list[Token], left: float, right: float, y: float, size: float, space: float, align: str, last: bool
) -> None:
    used = sum(w + (space if spaced else 0.0) for _, spaced, w in line) * size
    free = max(0.0, right - left - used)
    gaps = sum(spaced for _, spaced, _ in line)
    if align == "justify" and not last and gaps:
        x, extra = left, free / gaps
        for text, spaced, w in line:
            x += (space * size + extra) if spaced else 0.0
            c.drawString(x, y, text)
            x += w * size
        return
    text = "".join((" " if spaced else "") + t for t, spaced, _ in line)
    shift = {"center": free / 2, "right": free}.get(align, 0.0)
    c.drawString(left + shift, y, text)
