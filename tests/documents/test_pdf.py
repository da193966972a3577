"""PDF files translated with each text block in its place: built here with reportlab (a heading, two columns, a
picture and a drawing), translated by the fake translators of test_files, and read back with pdfminer.six and pypdf."""

import io
import re
import subprocess
from pathlib import Path

import pytest
from office import SOFFICE
from servers import missing
from test_files import identity, upper

from nanomt.documents import files, markup
from nanomt.documents.files import FileTooLarge, UnsupportedFile

pypdf = pytest.importorskip("pypdf")
canvas = pytest.importorskip("reportlab.pdfgen.canvas")
high_level = pytest.importorskip("pdfminer.high_level")
from pdfminer.layout import LTChar, LTTextBox  # noqa: E402
from PIL import Image, ImageOps  # noqa: E402
from reportlab.lib.utils import ImageReader  # noqa: E402

HEADING = "a heading across the top of the page"
LEFT = [
    "the quick brown fox jumps over the lazy dog near the river bank.",
    "a small bird sings in the green garden every morning at dawn.",
    "many people walk along the old road to the quiet village.",
]
RIGHT = [
    "seven bright stars shine above the calm dark sea tonight.",
    "every winter the cold wind blows through empty wooden houses.",
    "several sailors repair their boats before the long journey.",
]
SIZE = (595, 842)
doubled = markup.plain(lambda sentences: [f"{s} {s}".upper() for s in sentences])


def png(color=(200, 30, 30), size=(40, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def lines_of(text: str, c, width: float, font: str, size: float) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and c.stringWidth(f"{line} {word}", font, size) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*lines, line]


def draw_columns(c, top: float = 720) -> None:
    """The heading across the top, then a column of sentences on the left and another on the right."""
    c.setFont("Helvetica-Bold", 20)
    c.drawString(60, 780, HEADING)
    c.setFont("Helvetica", 11)
    for x, sentences in ((60, LEFT), (320, RIGHT)):
        y = top
        for sentence in sentences:
            for line in lines_of(sentence, c, 210, "Helvetica", 11):
                c.drawString(x, y, line)
                y -= 14


def pdf_of(*pages) -> bytes:
    """A PDF of one page for each function given, which draws the page on a reportlab canvas."""
    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=SIZE, invariant=1)
    for draw in pages:
        draw(c)
        c.showPage()
    c.save()
    return out.getvalue()


def columns_page(c) -> None:
    """The sample: a heading, two columns, a picture under the left column, a rectangle under the right one."""
    draw_columns(c)
    c.drawImage(ImageReader(io.BytesIO(png())), 60, 500, 120, 90)
    c.linkURL("https://example.org/", (60, 500, 180, 590))  # the picture is a link
    c.rect(320, 500, 200, 90, stroke=1, fill=0)


def scanned_page(c) -> None:
    c.drawImage(ImageReader(io.BytesIO(png((240, 240, 230), (60, 80)))), 0, 0, *SIZE)


def words(text: str) -> list[str]:
    return text.split()


def expected(transform) -> list[str]:
    return words(" ".join(transform(s) for s in [HEADING, *LEFT, *RIGHT]))


def text_of(data: bytes) -> str:
    return high_level.extract_text(io.BytesIO(data))


def boxes(data: bytes, page: int = 0) -> list[tuple[float, float, float, float]]:
    layout = list(high_level.extract_pages(io.BytesIO(data)))[page]
    return [item.bbox for item in layout if isinstance(item, LTTextBox)]


def chars(data: bytes, page: int = 0) -> list:
    layout = list(high_level.extract_pages(io.BytesIO(data)))[page]
    found = []

    def walk(item):
        if isinstance(item, LTChar):
            found.append(item)
        elif hasattr(item, "__iter__"):
            for child in item:
                walk(child)

    walk(layout)
    return [c for c in found if c.get_text().strip()]


def inside(char, box, slack: float = 1.0) -> bool:
    x0, y0, x1, y1 = box
    return x0 - slack <= char.x0 and char.x1 <= x1 + slack and y0 - slack <= char.y0 and char.y1 <= y1 + slack


@pytest.fixture(scope="module")
def sample() -> bytes:
    return pdf_of(columns_page)


def test_the_translation_reads_heading_then_left_column_then_right_column(sample):
    assert words(text_of(sample)) == expected(str)  # the sample reads in that order before translation too
    out = files.translate_file(sample, "pdf", upper)
    text = text_of(out)
    assert words(text) == expected(str.upper)
    assert not re.search("[a-z]", text)  # none of the original text is left


def test_identity_keeps_each_line_where_it_was(sample):
    out = files.translate_file(sample, "pdf", identity)
    assert words(text_of(out)) == expected(str)
    for before, after in zip(boxes(sample), boxes(out), strict=True):
        assert all(abs(a - b) < 1.5 for a, b in zip(before, after)), (before, after)


def test_the_picture_the_drawing_and_the_link_are_kept(sample):
    out = files.translate_file(sample, "pdf", upper)
    before, after = pypdf.PdfReader(io.BytesIO(sample)).pages[0], pypdf.PdfReader(io.BytesIO(out)).pages[0]
    assert [i.data for i in after.images] == [i.data for i in before.images] and len(after.images) == 1
    operations = after.get_contents().operations
    assert ([320, 500, 200, 90], b"re") in [([float(x) for x in o], op) for o, op in operations if op == b"re"]
    assert b"S" in [op for _, op in operations]  # the rectangle is still stroked
    assert after.mediabox == before.mediabox and after.cropbox == before.cropbox
    links = [(a.get_object()["/A"]["/URI"], list(a.get_object()["/Rect"])) for a in after["/Annots"]]
    assert links == [("https://example.org/", [60, 500, 180, 590])]


def test_a_longer_translation_is_shrunk_into_each_block_box(sample):
    out = files.translate_file(sample, "pdf", doubled)
    assert words(text_of(out)) == expected(lambda s: f"{s} {s}".upper())
    original = boxes(sample)
    drawn = chars(out)
    assert drawn and all(any(inside(c, box) for box in original) for c in drawn)
    heading = [c for c in drawn if c.y0 > 760]
    assert heading and max(c.size for c in heading) < 20  # shrunk from 20 points to fit its one line's box


def test_the_whole_file_is_translated_in_one_call(sample):
    calls, progress = [], []
    counting = lambda s: calls.append(len(s)) or upper(s)  # noqa: E731
    files.translate_file(pdf_of(columns_page, columns_page), "pdf", counting, progress=lambda *a: progress.append(a))
    assert len(calls) == 1 and calls[0] == 2 * (1 + len(LEFT) + len(RIGHT))
    assert progress[-1] == (calls[0], calls[0])


def test_the_target_language_goes_into_the_catalog(sample):
    out = files.translate_file(sample, "pdf", upper, target="de")
    assert pypdf.PdfReader(io.BytesIO(out)).trailer["/Root"]["/Lang"] == "de"
    out = files.translate_file(sample, "pdf", upper)
    assert "/Lang" not in pypdf.PdfReader(io.BytesIO(out)).trailer["/Root"]


def turned(data: bytes, degrees: int) -> bytes:
    """The file with each page's /Rotate turned clockwise by `degrees`."""
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    for page in writer.pages:
        page.rotate(degrees)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("degrees", [90, 180, 270])
def test_a_turned_page_is_translated_where_its_text_was(sample, degrees):
    out = files.translate_file(turned(sample, degrees), "pdf", upper)
    assert pypdf.PdfReader(io.BytesIO(out)).pages[0].rotation == degrees
    upright = turned(out, -degrees)  # the page as it was drawn: its text runs left to right
    assert words(text_of(upright)) == expected(str.upper)
    original = boxes(sample)
    assert all(any(inside(c, box) for box in original) for c in chars(upright))


def test_text_in_a_form_and_sideways_text_are_translated_and_text_at_an_angle_is_kept():
    def page(c):
        c.beginForm("letterhead")
        c.setFont("Helvetica", 14)
        c.drawString(60, 800, "the letterhead of the company")
        c.endForm()
        c.doForm("letterhead")
        c.setFont("Helvetica", 11)
        c.drawString(60, 700, "a plain line of text")
        for x, y, angle, text in ((40, 300, 90, "a sideways label"), (300, 300, 45, "a diagonal watermark")):
            c.saveState()
            c.translate(x, y)
            c.rotate(angle)
            c.drawString(0, 0, text)
            c.restoreState()

    out = files.translate_file(pdf_of(page), "pdf", upper)
    text = text_of(out)
    assert "THE LETTERHEAD OF THE COMPANY" in text and "A PLAIN LINE OF TEXT" in text
    assert "letterhead" not in text and "plain" not in text
    assert "A SIDEWAYS LABEL" in text_of(turned(out, 90))  # turned so that the label stands upright
    assert b"(a diagonal watermark) Tj" in pypdf.PdfReader(io.BytesIO(out)).pages[0].get_contents().get_data()


def test_an_ocr_layer_over_a_scan_is_translated_and_drawn_visible():
    def page(c):
        scanned_page(c)
        t = c.beginText(60, 700)
        t.setTextRenderMode(3)  # invisible, as OCR tools write the text they read over the scan
        t.setFont("Helvetica", 12)
        t.textLine("the words the scanner read on the page")
        c.drawText(t)

    data = pdf_of(page)
    out = files.translate_file(data, "pdf", upper)
    assert words(text_of(out)) == words("THE WORDS THE SCANNER READ ON THE PAGE")
    operations = [op for _, op in pypdf.PdfReader(io.BytesIO(out)).pages[0].get_contents().operations]
    assert b"Tr" not in operations  # drawn visible
    assert b"re" in operations and b"f*" in operations  # on a white box over the scan's own words


def test_characters_outside_latin_1_are_drawn_in_fonts_that_have_them(sample):
    chinese = markup.plain(lambda sentences: ["你好世界" for _ in sentences])
    out = files.translate_file(sample, "pdf", chinese, target="zh")
    assert text_of(out).split() == ["你好世界"] * 7
    czech = markup.plain(lambda sentences: ["Žluťoučký kůň úpěl" for _ in sentences])  # Vera, or DejaVu, has these
    assert words(text_of(files.translate_file(sample, "pdf", czech))) == words("Žluťoučký kůň úpěl") * 7


def test_scanned_pages_are_reported_in_one_line(sample):
    with pytest.raises(UnsupportedFile, match=r"has no text layer \(scanned\?\): run OCR first") as e:
        files.translate_file(pdf_of(scanned_page, scanned_page), "pdf", upper)
    assert "\n" not in str(e.value)
    with pytest.raises(UnsupportedFile, match=r"^page 2 of the PDF file has no text layer") as e:
        files.translate_file(pdf_of(columns_page, scanned_page), "pdf", upper)
    assert "\n" not in str(e.value)


def test_a_page_without_text_or_pictures_is_kept_as_it_was(sample):
    out = files.translate_file(pdf_of(columns_page, lambda c: c.rect(100, 100, 50, 50)), "pdf", upper)
    assert len(pypdf.PdfReader(io.BytesIO(out)).pages) == 2


def encrypted(data: bytes, password: str) -> bytes:
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=password, owner_password="the owner's")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "data, message",
    [
        (b"this is not a PDF at all", "not a valid PDF file"),
        (b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF", "not a valid PDF file"),
        ("encrypted", "encrypted with a password"),
    ],
)
def test_bad_files_raise_unsupported_file_with_one_line(sample, data, message):
    data = encrypted(sample, "secret") if data == "encrypted" else data
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(data, "pdf", upper)
    assert "\n" not in str(e.value)


def test_a_file_encrypted_without_a_user_password_is_translated(sample):
    out = files.translate_file(encrypted(sample, ""), "pdf", upper)
    assert words(text_of(out)) == expected(str.upper)


def test_content_that_unpacks_past_the_limit_is_refused_before_it_is_read():
    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=SIZE, invariant=1, pageCompression=1)
    c.drawString(60, 700, "a line of text")
    for _ in range(20_000):  # a content stream that compresses a hundredfold
        c.rect(10, 10, 5, 5)
    c.showPage()
    c.save()
    data = out.getvalue()
    calls = []
    with pytest.raises(FileTooLarge, match="the PDF's content unpacks to more than"):
        files.translate_file(data, "pdf", lambda s: calls.append(s) or upper(s), max_bytes=len(data))
    assert calls == []


def test_the_original_embedded_fonts_go_from_the_file():
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    pdfmetrics.registerFont(TTFont("test-Vera", "Vera.ttf"))  # reportlab's own

    def page(c):
        c.setFont("test-Vera", 12)
        c.drawString(60, 700, "a line in an embedded font")

    data = pdf_of(page)
    out = files.translate_file(data, "pdf", upper)
    assert b"Vera" in data and b"Vera" not in out and len(out) < len(data) / 4
    assert words(text_of(out)) == words("A LINE IN AN EMBEDDED FONT")


def test_pages_whose_fonts_give_no_unicode_values_are_reported():
    from nanomt.documents.pdf import _check_text_layer
    from nanomt.documents.pdf_text import Page

    readable = Page((0, 0, 595, 842), 0, 595, 842, chars=1000, undefined=5)
    unreadable = Page((0, 0, 595, 842), 0, 595, 842, chars=1000, undefined=800)
    _check_text_layer([readable, readable])
    with pytest.raises(UnsupportedFile, match="^pages 2, 3 of the PDF file have text whose fonts give no Unicode"):
        _check_text_layer([readable, unreadable, unreadable])


@pytest.mark.slow
def test_libreoffice_opens_the_translated_file(sample, tmp_path):
    if not Path(SOFFICE).exists():
        missing("LibreOffice is not installed: apt-get install libreoffice-draw-nogui")
    source = tmp_path / "translated.pdf"
    source.write_bytes(files.translate_file(sample, "pdf", doubled, target="de"))
    profile = (tmp_path / "profile").as_uri()
    done = subprocess.run(
        [
            SOFFICE,
            f"-env:UserInstallation={profile}",
            "--headless",
            "--convert-to",
            "png",
            "--outdir",
            str(tmp_path),
            source,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    image = tmp_path / "translated.png"
    assert done.returncode == 0 and image.exists(), f"LibreOffice could not open it: {done.stdout}{done.stderr}"
    with Image.open(image) as shown:
        assert ImageOps.invert(shown.convert("L")).getbbox() is not None  # something is drawn on the white page
