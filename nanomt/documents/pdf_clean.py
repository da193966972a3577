"""A PDF page's text taken out of its content stream, everything else kept: paths, images, shadings, clipping, the
graphics state, marked content. The text that goes is the text nanomt redraws translated: turned by a multiple of 90
degrees (upright, or sideways as a table turned on its page), in horizontal writing, not used as a clipping path. Text
at another angle (a diagonal watermark), mirrored or written top to bottom (vertical Japanese) stays as it was.

The form XObjects a page draws are cleaned the same way, once each: a form shared by several pages loses its text on
all of them, and pdfminer finds (and nanomt redraws) it wherever it is drawn. As pdfminer reads them, a form starts
with the default text state and one without a /BBox is not drawn (so it keeps its text)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanomt.documents.file_items import FileTooLarge, library

Matrix = tuple[float, float, float, float, float, float]
IDENTITY: Matrix = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
SKEW = 0.02  # the most a text's axes may lean (about a degree) off a multiple of 90 degrees

SHOW = frozenset({b"Tj", b"TJ", b"'", b'"'})
POSITION = frozenset({b"Td", b"TD", b"Tm", b"T*"})
TEXT_STATE = frozenset({b"Tc", b"Tw", b"Tz", b"TL", b"Tf", b"Tr", b"Ts"})  # part of the graphics state: outlives ET
MAX_FORM_DEPTH = 32


def multiply(m1: Matrix, m0: Matrix) -> Matrix:
    """m1 then m0 (PDF's row-vector order, as pdfminer's mult_matrix)."""
    a1, b1, c1, d1, e1, f1 = m1
    a0, b0, c0, d0, e0, f0 = m0
    return (
        a0 * a1 + c0 * b1,
        b0 * a1 + d0 * b1,
        a0 * c1 + c0 * d1,
        b0 * c1 + d0 * d1,
        a0 * e1 + c0 * f1 + e0,
        b0 * e1 + d0 * f1 + f0,
    )


def inverse(m: Matrix) -> Matrix:
    a, b, c, d, e, f = m
    det = a * d - b * c
    ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det
    return (ia, ib, ic, id_, -(e * ia + f * ic), -(e * ib + f * id_))


def page_matrix(mediabox: tuple[float, float, float, float], rotate: int) -> Matrix:
    """User space to the page as shown (rotated, its corner at 0, 0): the matrix pdfminer reads a page with."""
    x0, y0, x1, y1 = mediabox
    return {
        90: (0.0, -1.0, 1.0, 0.0, -y0, x1),
        180: (-1.0, 0.0, 0.0, -1.0, x1, y1),
        270: (0.0, 1.0, -1.0, 0.0, y1, -x0),
    }.get(rotate % 360, (1.0, 0.0, 0.0, 1.0, -x0, -y0))


def turn(matrix: Matrix, scaling: float = 100.0) -> int | None:
    """How far text shown with this matrix (the text matrix times the CTM, on the page as shown) and horizontal
    scaling is turned: 0, 90, 180 or 270 degrees counterclockwise; None for text at another angle or mirrored."""
    a, b, c, d = matrix[:4]
    if scaling < 0:
        a, b = -a, -b
    if abs(b) <= SKEW * abs(a) and abs(c) <= SKEW * abs(d):
        return 0 if a > 0 and d > 0 else 180 if a < 0 and d < 0 else None
    if abs(a) <= SKEW * abs(b) and abs(d) <= SKEW * abs(c):
        return 90 if b > 0 and c < 0 else 270 if b < 0 and c > 0 else None
    return None


def redrawn(matrix: Matrix, scaling: float, render: int, vertical: bool) -> bool:
    """Whether text is taken out and redrawn translated: turned a multiple of 90 degrees (not at another angle, nor
    mirrored), not a clipping path (render modes 4-7), written horizontally."""
    return render < 4 and not vertical and turn(matrix, scaling) is not None


def _number(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


@dataclass
class Cleaner:
    """Takes the text out of pages' content streams (pypdf's parsed operations), counting the bytes they unpack to."""

    pdf: object  # the PdfWriter the pages belong to
    limit: int  # the most bytes of content streams a file may unpack to
    unpacked: int = 0
    seen: set = field(default_factory=set)  # forms already cleaned, by id
    verticals: dict = field(default_factory=dict)  # font dictionary id -> vertical writing

    def page(self, page, matrix: Matrix) -> None:
        """Clean a page (its forms too); its fonts left unused are dropped from its own (copied) resources."""
        generic = _pypdf_generic()
        resources = page.get_inherited("/Resources", None)
        resources = resources.get_object() if resources is not None else None
        resources = _own(resources if isinstance(resources, dict) else generic.DictionaryObject())
        page[generic.NameObject("/Resources")] = resources
        contents = page.get_contents()
        if contents is None:
            return
        self._count(page["/Contents"].get_object())
        ops, fonts = self.operations(contents.operations, resources, matrix, 0)
        _prune_fonts(resources, fonts)
        stream = generic.ContentStream(None, self.pdf)
        stream.operations = ops
        page.replace_contents(stream)

    def operations(self, ops: list, resources, ctm: Matrix, depth: int) -> tuple[list, set]:
        """The operations without the redrawn text, and the font names their Tf operators still use."""
        out, inherited = [], set()  # inherited: fonts used by forms that draw with these resources
        state = [ctm, 0, 100.0, False]  # CTM, render mode, horizontal scaling, vertical font
        stack = []
        text: list | None = None  # the operations of the open text object (BT ... ET)
        kept = False  # whether the open text object keeps any of its text
        loose: list[int] = []  # indices in out of text state operators moved out of dropped text objects
        anything_kept = False
        linear: Matrix = IDENTITY  # the text matrix's (Td, TD, T*, ' and " only move it)

        def close():
            nonlocal text, kept, anything_kept
            if kept:
                out.append(([], b"BT"))
                out.extend((operands, op) for operands, op, _ in text)
                out.append(([], b"ET"))
                anything_kept = True
            else:
                for operands, op, kind in text:
                    if kind == "state":
                        loose.append(len(out))
                    if kind in ("state", "other"):
                        out.append((operands, op))
            text = None

        for operands, op in ops:
            if op == b"BT":
                if text is not None:
                    close()
                text, kept, linear = [], False, IDENTITY
                continue
            if op == b"ET":
                if text is not None:
                    close()
                continue
            if op == b"q":
                stack.append(list(state))
            elif op == b"Q" and stack:
                state = stack.pop()
            elif op == b"cm" and len(operands) == 6:
                state[0] = multiply(tuple(_number(x) for x in operands), state[0])
            elif op == b"Tr" and operands:
                state[1] = int(_number(operands[0]))
            elif op == b"Tz" and operands:
                state[2] = _number(operands[0])
            elif op == b"Tf" and operands:
                state[3] = self._vertical(resources, operands[0])
            elif op == b"Tm" and len(operands) == 6:
                linear = tuple(_number(x) for x in operands[:4]) + (0.0, 0.0)
            elif op == b"Do" and operands:
                inherited |= self._form(resources, operands[0], state[0], depth)
            if text is None:
                out.append((operands, op))
                continue
            if op in SHOW:
                if not redrawn(multiply(linear, state[0]), state[2], state[1], state[3]):
                    text.append((operands, op, "show"))
                    kept = True
                elif op == b"'":
                    text.append(([], b"T*", "position"))
                elif op == b'"' and len(operands) == 3:
                    text += [([operands[0]], b"Tw", "state"), ([operands[1]], b"Tc", "state"), ([], b"T*", "position")]
            elif op in POSITION:
                text.append((operands, op, "position"))
            elif op in TEXT_STATE:
                text.append((operands, op, "state"))
            else:  # colours, graphics state, marked content: they outlive the text object
                text.append((operands, op, "other"))
        if text is not None:
            close()
        if not anything_kept:  # no text left to show: the text state moved out of text objects is of no use
            dropped = set(loose)
            out = [o for i, o in enumerate(out) if i not in dropped]
        return out, inherited | {str(operands[0]) for operands, op in out if op == b"Tf" and operands}

    def _vertical(self, resources, name) -> bool:
        """Whether a font (by its resource name) writes top to bottom (an Identity-V or other -V CMap, or WMode 1)."""
        try:
            font = resources["/Font"].get_object()[name].get_object()
        except (KeyError, TypeError, AttributeError):
            return False
        if id(font) not in self.verticals:
            encoding = font.get("/Encoding")
            encoding = encoding.get_object() if encoding is not None else None
            if hasattr(encoding, "get_data"):
                vertical = _number(encoding.get("/WMode", 0)) == 1
            else:
                vertical = str(encoding or "").endswith("-V")
            self.verticals[id(font)] = vertical
        return self.verticals[id(font)]

    def _form(self, resources, name, ctm: Matrix, depth: int) -> set[str]:
        """Clean a form XObject drawn by Do (the first time it is met), its own forms too; the fonts it still uses
        from `resources` where it has none of its own."""
        generic = _pypdf_generic()
        try:
            reference = resources["/XObject"].get_object()[name]
            form = reference.get_object()
        except (KeyError, TypeError, AttributeError):
            return set()
        if form.get("/Subtype") != "/Form" or "/BBox" not in form or id(form) in self.seen or depth >= MAX_FORM_DEPTH:
            return set()
        self.seen.add(id(form))
        own = form.get("/Resources")
        form_resources = _own(own.get_object()) if own is not None else resources
        matrix = tuple(_number(x) for x in form.get("/Matrix", IDENTITY))
        matrix = matrix if len(matrix) == 6 else IDENTITY
        self._count(form)
        parsed = generic.ContentStream(form, self.pdf).operations
        ops, fonts = self.operations(parsed, form_resources, multiply(matrix, ctm), depth + 1)
        stream = generic.ContentStream(None, self.pdf)
        stream.operations = ops
        _set_stream(form, stream.get_data())
        if own is None:
            return fonts
        _prune_fonts(form_resources, fonts)
        form[generic.NameObject("/Resources")] = form_resources
        return set()

    def _count(self, streams) -> None:
        """Count the bytes a content stream (or an array of them) unpacks to against the limit."""
        for stream in streams if isinstance(streams, list) else [streams]:
            self.unpacked += len(stream.get_object().get_data())
            if self.unpacked > self.limit:
                raise FileTooLarge(f"the PDF's content unpacks to more than {self.limit:,} bytes")


def _pypdf_generic():
    return library("pdf", "pypdf.generic")


def _own(resources):
    """A copy of a resource dictionary whose /Font and /ProcSet are copies too: shared ones are changed for one page
    (its fonts pruned, the translation's fonts merged in) without touching the pages that share them."""
    generic = _pypdf_generic()
    copy = generic.DictionaryObject(resources.items())
    if "/Font" in copy:
        copy[generic.NameObject("/Font")] = generic.DictionaryObject(copy["/Font"].get_object().items())
    if "/ProcSet" in copy:
        copy[generic.NameObject("/ProcSet")] = generic.ArrayObject(copy["/ProcSet"].get_object())
    return copy


def _prune_fonts(resources, used: set[str]) -> None:
    """Drop the fonts nothing shows text with any more (their bytes go from the file with them)."""
    if "/Font" not in resources:
        return
    fonts = resources["/Font"]
    for name in [n for n in fonts if n not in used]:
        del fonts[name]


def _set_stream(stream, data: bytes) -> None:
    """A stream's new content, Flate-compressed (whatever filters it had before)."""
    generic = _pypdf_generic()
    flate = _pypdf_filters().FlateDecode
    stream.pop("/DecodeParms", None)
    stream[generic.NameObject("/Filter")] = generic.NameObject("/FlateDecode")
    generic.StreamObject.set_data(stream, flate.encode(data))
    if hasattr(stream, "decoded_self"):
        stream.decoded_self = None


def _pypdf_filters():
    return library("pdf", "pypdf.filters")
