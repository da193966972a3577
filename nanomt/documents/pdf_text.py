"""A PDF's text as pdfminer.six lays it out: each page's text blocks (LTTextBox) in pdfminer's reading order (a column
before the next), each with its box, lines, paragraphs, size, font, colour and alignment; and what each page holds
besides (how much of it images cover, how many of its characters have no Unicode value), for telling scanned pages."""

from __future__ import annotations

import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

from nanomt.documents.file_items import library
from nanomt.documents.pdf_clean import multiply, redrawn, turn

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 on the page as shown (pdfminer's space), turned as read

MIN_SIZE = 0.5  # points: a line's characters smaller than this are not seen
UNDEFINED = "\ufffd"  # what a character whose font maps it to no Unicode value reads as
LIGATURES = re.compile("[\ufb00-\ufb06]")  # ﬁ, ﬂ, ...: written out as their letters for the model
BULLET = re.compile(r"([•◦▪▫■□‣⁃●○–—*-]|\(?\d{1,3}[.)]|\(?[a-zA-Z][.)])\s")  # a line that starts a list item
MARKER = re.compile(r"^(?:[^\w\s]{1,2}|\(?\d{1,3}[.)]|\(?[a-zA-Z][.)])$")  # a list item's bullet or number, alone
# Word's bullets in the Symbol and Wingdings fonts, read as private-use characters: the characters they show.
SYMBOL_CHARS = {
    "\uf0b7": "•",
    "\uf0a7": "▪",
    "\uf0d8": "➢",
    "\uf0fc": "✓",
    "\uf06e": "■",
    "\uf076": "❖",
    "\uf0a8": "□",
    "\uf06f": "□",
    "\uf0e0": "→",
    "\uf0d2": "®",
    "\uf02d": "-",
    "\uf0ad": "-",
}
SYMBOLS = re.compile("|".join(SYMBOL_CHARS))
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\uff00-\uffef\u3000-\u303f"
ENDS_SENTENCE = re.compile(r"[.!?:;。！？]['\"’”)]*$")


@dataclass
class Line:
    text: str
    box: Box
    size: float  # its characters' median size
    baseline: float
    font: str  # the font most of its characters are in (its subset prefix dropped)
    color: tuple[float, ...]  # 1 (gray), 3 (RGB) or 4 (CMYK) components
    hidden: bool  # invisible (render mode 3): an OCR layer over a scan


@dataclass
class Paragraph:
    """Lines of a block that make one paragraph: its text (lines joined), and where its first and other lines start
    (from the block's left edge)."""

    lines: list[Line]
    text: str
    first: float
    rest: float
    top: float  # where its first line's characters reach up to


@dataclass
class Block:
    """Lines of one style in one of pdfminer's text boxes."""

    box: Box
    paragraphs: list[Paragraph]
    size: float  # the original font size (the median of its characters')
    pitch: float  # line spacing over size (1.2 where it has one line)
    font: str  # the original font's name (its subset prefix dropped)
    bold: bool
    italic: bool
    color: tuple[float, ...]  # 1 (gray), 3 (RGB) or 4 (CMYK) components
    align: str  # left, center, right or justify
    hidden: bool  # invisible text (render mode 3): an OCR layer over a scan
    view: int  # the page's /Rotate it was read (and is drawn) with: the page's own, or turned to stand it upright


@dataclass
class Page:
    mediabox: Box  # as pdfminer read it (user space)
    rotate: int
    width: float  # as shown
    height: float
    blocks: list[Block] = field(default_factory=list)
    chars: int = 0  # every character shown, redrawn or not
    undefined: int = 0  # characters without a Unicode value
    image_area: float = 0.0  # the area images cover (overlaps counted twice)


def read_pages(fp, password: str = "") -> list[Page]:
    """Each page's text blocks and counts (pdfminer.six, every page in the file's order). Text turned sideways or
    upside down is read in a pass of its own, the page turned so that it stands upright."""
    layout = library("pdf", "pdfminer.layout")
    pdfpage = library("pdf", "pdfminer.pdfpage")
    interp = library("pdf", "pdfminer.pdfinterp")
    converter = library("pdf", "pdfminer.converter")
    device_class = _device_class(converter.PDFPageAggregator, layout.LTChar)
    manager = interp.PDFResourceManager(caching=True)
    device = device_class(manager, laparams=layout.LAParams(all_texts=True))
    interpreter = interp.PDFPageInterpreter(manager, device)
    pages = []
    for pdf_page in pdfpage.PDFPage.get_pages(fp, password=password):
        rotate, turns = pdf_page.rotate, [0]
        x0, y0, x1, y1 = (float(v) for v in pdf_page.mediabox)
        for k in turns:  # grows after the first pass: the turns it met
            pdf_page.rotate = (rotate + k) % 360
            device.chars, device.undefined, device.turns = 0, 0, set()
            interpreter.process_page(pdf_page)
            result = device.get_result()
            if k == 0:
                page = Page((x0, y0, x1, y1), rotate, result.width, result.height)
                page.chars, page.undefined = device.chars, device.undefined
                turns += sorted(device.turns - {0})
            _walk(result, page, layout, pdf_page.rotate, result.width, images=k == 0)
        pdf_page.rotate = rotate
        pages.append(page)
    return pages


def _device_class(aggregator, ltchar):
    """pdfminer's page aggregator keeping only the characters nanomt redraws that stand upright on the page as it
    is turned (pdf_clean decides, on the same matrix); it counts all characters, those with no Unicode value, and
    the turns of the others it would redraw; it marks invisible ones."""

    class Device(aggregator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.chars = self.undefined = 0
            self.turns: set[int] = set()
            self.skip = self.hidden = False

        def render_string(self, textstate, seq, ncs, graphicstate):
            font = textstate.font
            matrix = multiply(tuple(textstate.matrix), tuple(self.ctm))
            vertical = font is not None and font.is_vertical()
            drawn = redrawn(matrix, textstate.scaling, textstate.render, vertical)
            turned = turn(matrix, textstate.scaling)
            self.skip = not drawn or turned != 0
            if drawn and turned:
                self.turns.add(turned)
            self.hidden = textstate.render in (3, 7)
            super().render_string(textstate, seq, ncs, graphicstate)

        def render_char(self, matrix, font, fontsize, scaling, rise, cid, ncs, graphicstate):
            adv = super().render_char(matrix, font, fontsize, scaling, rise, cid, ncs, graphicstate)
            self.chars += 1
            item = self.cur_item._objs[-1]
            if self.skip:
                self.cur_item._objs.pop()
            elif isinstance(item, ltchar):
                item.hidden = self.hidden
            return adv

        def handle_undefined_char(self, font, cid):
            self.undefined += 1
            return UNDEFINED

    return Device


def _walk(container, page: Page, layout, view: int, width: float, images: bool) -> None:
    """The blocks (and images, where `images`) of a page read with the page turned to `view` (its /Rotate as
    pdfminer was told) and so `width` wide; a figure's blocks after the page's, as pdfminer orders them."""
    boxes: list[list[Line]] = []
    _collect(container, page, layout, images, boxes)
    markers = [lines[0] for lines in boxes if len(lines) == 1 and MARKER.match(lines[0].text)]
    for lines in boxes:
        for run in _runs(lines):
            page.blocks.append(_block(run, _edges(lines), markers, view, width))


def _collect(container, page: Page, layout, images: bool, boxes: list[list[Line]]) -> None:
    """The lines of each text box of a page or figure (those of a figure after the page's), and its images' area."""
    for item in container:
        if isinstance(item, layout.LTTextBox):
            lines = [line for line in (_line(x, layout) for x in item if isinstance(x, layout.LTTextLine)) if line]
            if lines:
                boxes.append(lines)
        elif isinstance(item, layout.LTImage) and images:
            w = max(0.0, min(item.x1, page.width) - max(item.x0, 0.0))
            h = max(0.0, min(item.y1, page.height) - max(item.y0, 0.0))
            page.image_area += w * h
        elif isinstance(item, layout.LTFigure):
            _collect(item, page, layout, images, boxes)


def _text(chars) -> str:
    text = "".join(c.get_text() for c in chars).replace(UNDEFINED, "")
    text = LIGATURES.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)
    return SYMBOLS.sub(lambda m: SYMBOL_CHARS[m.group()], text)


def _line(line, layout) -> Line | None:
    """A text line with its style: the size, font, colour and visibility most of its characters have."""
    chars = [c for c in line if isinstance(c, layout.LTChar) and c.get_text().strip()]
    text = " ".join(_text(line).split())
    size = statistics.median(c.size for c in chars) if chars else 0.0
    if not text or size < MIN_SIZE:  # too small to see: taken out with the rest, not drawn again
        return None
    sample = chars[:: max(1, len(chars) // 16)]
    font = re.sub(r"^[A-Z]{6}\+", "", Counter(c.fontname for c in sample).most_common(1)[0][0])
    return Line(
        text,
        line.bbox,
        size,
        chars[0].matrix[5],
        font,
        Counter(_color(c) for c in sample).most_common(1)[0][0],
        sum(getattr(c, "hidden", False) for c in sample) * 2 > len(sample),
    )


def _runs(lines: list[Line]) -> list[list[Line]]:
    """A text box's lines in runs of one style: a heading pdfminer put in one box with the text under it, a
    caption in another colour, become blocks of their own. A run ends where the size changes, or where the font
    or colour changes after a line that may end a paragraph (a sentence's end, or short of the box's right edge):
    a line all in italics or in a link's colour inside a paragraph stays in it."""
    right = max(line.box[2] for line in lines)
    runs = [[lines[0]]]
    for prev, line in zip(lines, lines[1:]):
        first = runs[-1][0]
        resized = abs(line.size - first.size) > 0.1 * first.size
        restyled = line.font != first.font or not _same_color(line.color, first.color)
        ends = ENDS_SENTENCE.search(prev.text) is not None or prev.box[2] < right - 2 * prev.size
        if resized or (restyled and ends):
            runs.append([line])
        else:
            runs[-1].append(line)
    return runs


def _same_color(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(abs(x - y) <= 0.05 for x, y in zip(_rgb(a), _rgb(b)))


def _rgb(color: tuple[float, ...]) -> tuple[float, ...]:
    if len(color) == 4:
        c, m, y, k = color
        return (1 - c) * (1 - k), (1 - m) * (1 - k), (1 - y) * (1 - k)
    return color if len(color) == 3 else color * 3


def _edges(lines: list[Line]) -> tuple[float, float]:
    return min(line.box[0] for line in lines), max(line.box[2] for line in lines)


def _block(lines: list[Line], edges: tuple[float, float], markers: list[Line], view: int, width: float) -> Block:
    """A run of lines as a block: its box spans its text box's width (the column) and its own lines' height."""
    box = (edges[0], min(line.box[1] for line in lines), edges[1], max(line.box[3] for line in lines))
    size = statistics.median(line.size for line in lines)
    steps = [a.box[1] - b.box[1] for a, b in zip(lines, lines[1:]) if a.box[1] > b.box[1]]
    pitch = min(2.0, max(1.0, statistics.median(steps) / size)) if steps else 1.2
    align = _line_alignment(lines, box, size, width)
    paragraphs = _paragraphs(lines, box, size, markers, flowing=align in ("left", "justify"))
    name = lines[0].font.lower()
    return Block(
        box,
        paragraphs,
        size,
        pitch,
        lines[0].font,
        bold=bool(re.search(r"bold|black|heavy|demi|cmbx", name)),
        italic=bool(re.search(r"italic|oblique|cmti|cmsl|-it\b", name)),
        color=lines[0].color,
        align=_justified(paragraphs, box, size) if align == "left" else align,
        hidden=lines[0].hidden,
        view=view,
    )


def _color(char) -> tuple[float, ...]:
    """A character's fill colour where its colour space is gray, RGB or CMYK (or an ICC space of as many); black
    for any other (a spot colour's tint read as gray could turn text white)."""
    color = char.graphicstate.ncolor
    values = color if isinstance(color, (list, tuple)) else (color,)
    if char.ncs.name not in ("DeviceGray", "DeviceRGB", "DeviceCMYK", "ICCBased"):
        return (0.0,)
    try:
        values = tuple(min(1.0, max(0.0, float(v))) for v in values)
    except (TypeError, ValueError):
        return (0.0,)
    return values if len(values) in (1, 3, 4) and len(values) == char.ncs.ncomponents else (0.0,)


def _paragraphs(lines: list[Line], box: Box, size: float, markers: list[Line], flowing: bool) -> list[Paragraph]:
    """A block's lines in paragraphs. One starts at a list item (a bullet or number at the line's start, or in a
    box of its own just left of it), at a first line indented from the lines around it, after a line that starts
    far right of it (a date set flush right), and (in text set flush left) after a line that ends well short of the
    right edge: by 2 em after a sentence's end, else by a third of the column (a table's cells, a list's items)."""
    em = size
    groups: list[list[Line]] = []
    for i, line in enumerate(lines):
        prev = lines[i - 1] if i else None
        after = lines[i + 1] if i + 1 < len(lines) else None
        new = prev is None
        if prev is not None:
            indented = line.box[0] > prev.box[0] + 0.8 * em and (after is None or after.box[0] < line.box[0] - 0.8 * em)
            gap = box[2] - prev.box[2]
            short = flowing and (gap > 2 * em and ENDS_SENTENCE.search(prev.text) or gap > (box[2] - box[0]) / 3)
            marked = any(
                abs(m.baseline - line.baseline) < 0.3 * em and m.box[2] <= line.box[0] + 1 < m.box[2] + 4 * em
                for m in markers
            )
            outdented = prev.box[0] - line.box[0] > max(3 * em, (box[2] - box[0]) / 4)  # after a line set right
            new = bool(BULLET.match(line.text)) or indented or outdented or bool(short) or marked
        if new:
            groups.append([])
        groups[-1].append(line)
    out = []
    for group in groups:
        first = group[0].box[0] - box[0]
        rest = group[1].box[0] - box[0] if len(group) > 1 else first
        out.append(Paragraph(group, _join(group), max(0.0, first), max(0.0, rest), group[0].box[3]))
    return out


def _join(lines: list[Line]) -> str:
    """Lines joined with spaces; a word hyphenated across a line end joined whole (its hyphen dropped before a
    lower-case letter); no space where either side is CJK."""
    text = ""
    for line in lines:
        t = line.text
        if not text:
            text = t
        elif text[-1] == "\u00ad":
            text = text[:-1] + t
        elif re.search(r"\w[-\u2010]$", text) and t[:1].isalpha():
            text = (text[:-1] if t[0].islower() else text) + t
        elif re.match(f"[{CJK}]", text[-1]) or re.match(f"[{CJK}]", t[:1]):
            text += t
        else:
            text += " " + t
    return text.replace("\u00ad", "")


def _line_alignment(lines: list[Line], box: Box, size: float, width: float) -> str:
    """How a block's lines sit in its box, by their edges: centred, set flush right, or left; one line is centred
    where it is centred on the page, away from its left margin."""
    tol = 0.5 * size
    lefts = [line.box[0] for line in lines]
    rights = [line.box[2] for line in lines]
    centers = [(a + b) / 2 for a, b in zip(lefts, rights)]
    if len(lines) == 1:  # centred on the page, and inset from its column (or, alone in it, from the page's edge)
        (x0, _, x1, _), em = lines[0].box, size
        inset = x0 - box[0] > 2 * em or (x0 - box[0] < 1 and x0 > 0.15 * width)
        return "center" if abs((x0 + x1) / 2 - width / 2) < 0.02 * width and inset else "left"
    if max(lefts) - min(lefts) > tol and max(centers) - min(centers) <= tol:
        return "center"
    if max(lefts) - min(lefts) > tol and max(rights) - min(rights) <= tol:
        return "right"
    return "left"


def _justified(paragraphs: list[Paragraph], box: Box, size: float) -> str:
    """justify where every line but a paragraph's last ends at one right edge (not ragged), else left."""
    inner = [line.box[2] for p in paragraphs for line in p.lines[:-1]]
    return "justify" if len(inner) >= 2 and max(inner) - min(inner) <= 0.1 * size else "left"
