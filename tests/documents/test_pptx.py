"""PowerPoint files (.pptx) translated with their formatting kept: a deck built here with python-pptx, translated by
the fake translators of test_files (identity, uppercase, words reversed) and read back."""

import io
import zipfile

import pytest
from test_files import identity, reversed_upper, upper, zip_of

from nanomt.documents import files
from nanomt.documents.files import FileTooLarge, UnsupportedFile

pptx = pytest.importorskip("pptx")
etree = pytest.importorskip("lxml.etree")
Image = pytest.importorskip("PIL.Image")
from pptx.chart.data import CategoryChartData  # noqa: E402
from pptx.enum.chart import XL_CHART_TYPE  # noqa: E402
from pptx.oxml.ns import qn  # noqa: E402
from pptx.util import Inches  # noqa: E402

A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
C = "{http://schemas.openxmlformats.org/drawingml/2006/chart}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
LINK = "https://example.com/guide"
# The translated parts; every other member (layouts, masters, pictures, the chart's workbook) stays as it was.
TRANSLATED = {
    "ppt/slides/slide1.xml",
    "ppt/slides/slide2.xml",
    "ppt/notesSlides/notesSlide1.xml",
    "ppt/charts/chart1.xml",
}


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def field(kind: str, text: str):
    """A DrawingML field (the slide number, the date) as PowerPoint writes one."""
    fld = etree.SubElement(
        etree.Element(qn("a:p")), qn("a:fld"), id="{B6F15528-21DE-4FAA-801E-634DDDAF4B2B}", type=kind
    )
    etree.SubElement(fld, qn("a:rPr"), lang="en-US")
    etree.SubElement(fld, qn("a:t")).text = text
    return fld


def deck() -> bytes:
    """Two slides: a title, a text box whose sentence has a bold word and a link, a line break, a field, a group, a
    table, a picture, speaker notes (with a slide-number field); a title and a bullet, a chart with a title."""
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])  # Title Only
    slide.shapes.title.text = "A report on the dog"
    frame = slide.shapes.add_textbox(Inches(1), Inches(1.5), Inches(6), Inches(2)).text_frame
    p = frame.paragraphs[0]
    for text, bold, link in [
        ("The quick ", False, None),
        ("brown", True, None),
        (" fox reads ", False, None),
        ("the guide", False, LINK),
        (" today.", False, None),
    ]:
        run = p.add_run()
        run.text = text
        if bold:
            run.font.bold = True
        if link:
            run.hyperlink.address = link
    etree.SubElement(p._p, qn("a:endParaRPr"), lang="en-US", dirty="0")
    frame.add_paragraph().text = "First line\vsecond line"  # \v: a line break (a:br)
    numbered = frame.add_paragraph()
    numbered.text = "Slide "
    numbered._p.append(field("slidenum", "1"))
    numbered.add_run().text = " of the deck"
    group = slide.shapes.add_group_shape()
    group.shapes.add_textbox(Inches(1), Inches(6), Inches(3), Inches(1)).text_frame.text = " Grouped words here "
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(4), Inches(1)).table
    for (r, c), text in {(0, 0): "One cell", (0, 1): "Another cell", (1, 0): "2024", (1, 1): "Last cell"}.items():
        table.cell(r, c).text = text
    slide.shapes.add_picture(io.BytesIO(png()), Inches(8), Inches(1))
    notes = slide.notes_slide
    notes.notes_text_frame.text = "Speak slowly about the dog."
    number = next(
        s for s in notes.placeholders if s.placeholder_format.type == pptx.enum.shapes.PP_PLACEHOLDER.SLIDE_NUMBER
    )
    body = etree.SubElement(number._element, qn("p:txBody"))
    etree.SubElement(body, qn("a:bodyPr"))
    etree.SubElement(body, qn("a:p")).append(field("slidenum", "Slide 1"))
    second = prs.slides.add_slide(prs.slide_layouts[1])  # Title and Content
    second.shapes.title.text = "Second slide"
    second.placeholders[1].text = "A point to make"
    data = CategoryChartData()
    data.categories = ["East", "West"]
    data.add_series("Sales", (1.0, 2.0))
    chart = second.shapes.add_chart(
        XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(3), Inches(4), Inches(3), data
    ).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Sales by region"
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


@pytest.fixture(scope="module")
def sample() -> bytes:
    return deck()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def translatable(name: str, root) -> list:
    """The a:t elements the translation rewrites in a part: a slide's outside fields, the notes' body placeholder's,
    a chart's title's."""
    if name.startswith("ppt/charts/"):
        return [t for title in root.iter(f"{C}title") for t in title.iter(f"{A}t")]
    if name.startswith("ppt/notesSlides/"):
        bodies = [s for s in root.iter(f"{P}sp") if s.findall(f"{P}nvSpPr/{P}nvPr/{P}ph[@type='body']")]
        return [t for shape in bodies for t in shape.iter(f"{A}t")]
    return [t for t in root.iter(f"{A}t") if t.getparent().tag == f"{A}r"]


def test_identity_gives_the_presentation_back(sample):
    assert files.translate_file(sample, "pptx", identity) == sample


def test_uppercase_changes_the_text_and_nothing_else(sample):
    out = files.translate_file(sample, "pptx", upper)
    before, after = members(sample), members(out)
    assert list(after) == list(before)
    assert {n for n in before if after[n] != before[n]} == TRANSLATED  # layouts, masters, the picture: as they were
    for name in TRANSLATED:
        expected = etree.fromstring(before[name])
        for t in translatable(name, expected):
            if t.text != t.text.upper():
                t.text = t.text.upper()
                if t.text != t.text.strip():
                    t.set(XML_SPACE, "preserve")
        assert etree.tostring(etree.fromstring(after[name])) == etree.tostring(expected), name
    slide = etree.fromstring(after["ppt/slides/slide1.xml"])
    spaced = [t for t in slide.iter(f"{A}t") if t.text == " FOX READS "]
    assert len(spaced) == 1 and spaced[0].get(XML_SPACE) == "preserve"
    fields = [etree.tostring(f) for f in slide.iter(f"{A}fld")]
    assert fields == [etree.tostring(f) for f in etree.fromstring(before["ppt/slides/slide1.xml"]).iter(f"{A}fld")]


def test_the_translation_opens_in_python_pptx_with_its_text(sample):
    prs = pptx.Presentation(io.BytesIO(files.translate_file(sample, "pptx", upper)))
    first, second = prs.slides
    texts = [s.text_frame.text for s in first.shapes if s.has_text_frame]
    assert texts == [
        "A REPORT ON THE DOG",
        "THE QUICK BROWN FOX READS THE GUIDE TODAY.\nFIRST LINE\vSECOND LINE\nSLIDE 1 OF THE DECK",
    ]
    group = next(s for s in first.shapes if s.shape_type == pptx.enum.shapes.MSO_SHAPE_TYPE.GROUP)
    assert [s.text_frame.text for s in group.shapes] == [" GROUPED WORDS HERE "]  # its spaces at the edges kept
    table = next(s for s in first.shapes if s.has_table).table
    assert [[c.text for c in row.cells] for row in table.rows] == [["ONE CELL", "ANOTHER CELL"], ["2024", "LAST CELL"]]
    picture = next(s for s in first.shapes if s.shape_type == pptx.enum.shapes.MSO_SHAPE_TYPE.PICTURE)
    assert picture.image.blob == png()
    assert first.notes_slide.notes_text_frame.text == "SPEAK SLOWLY ABOUT THE DOG."
    assert [s.text_frame.text for s in second.placeholders] == ["SECOND SLIDE", "A POINT TO MAKE"]
    chart = next(s for s in second.shapes if s.has_chart).chart
    assert chart.chart_title.text_frame.text == "SALES BY REGION"
    assert list(chart.plots[0].categories) == ["East", "West"]  # the chart's data: as it was


def test_bold_and_link_follow_their_words_when_they_move(sample):
    prs = pptx.Presentation(io.BytesIO(files.translate_file(sample, "pptx", reversed_upper)))
    box = prs.slides[0].shapes[1].text_frame
    runs = box.paragraphs[0].runs
    assert "".join(r.text for r in runs) == "TODAY. GUIDE THE READS FOX BROWN QUICK THE"
    assert [r.text for r in runs if r.font.bold] == ["BROWN"]
    assert [(r.text, r.hyperlink.address) for r in runs if r.hyperlink.address] == [("GUIDE THE", LINK)]
    assert box.paragraphs[1].text == "LINE SECOND\vLINE FIRST"  # the break between its words, as it stood
    p = box.paragraphs[2]._p
    assert [c.tag for c in p] == [f"{A}r", f"{A}fld", f"{A}r"] and p.find(f"{A}fld/{A}t").text == "1"
    assert "".join(t.text for t in p.iter(f"{A}t")) == "DECK THE OF 1 SLIDE"  # the field between its words
    assert [c.tag for c in box.paragraphs[0]._p][-1] == f"{A}endParaRPr"  # DrawingML's order: it stays last


def test_the_target_language_goes_on_the_translated_runs(sample):
    out = members(files.translate_file(sample, "pptx", upper, target="pt-BR"))
    before = members(sample)
    for name in TRANSLATED:
        root = etree.fromstring(out[name])
        for t in translatable(name, root):
            if t.text.isdigit():  # a cell with no words: not translated, its language as it was
                assert t.getparent().find(f"{A}rPr") is None
            else:
                assert t.getparent().find(f"{A}rPr").get("lang") == "pt-BR"
    slide = etree.fromstring(out["ppt/slides/slide1.xml"])
    assert [e.get("lang") for e in slide.iter(f"{A}endParaRPr")] == ["pt-BR"]
    assert [r.get("lang") for r in slide.iterfind(f".//{A}fld/{A}rPr")] == ["en-US"]  # a field is kept whole
    assert {n: out[n] for n in out if n not in TRANSLATED} == {n: before[n] for n in before if n not in TRANSLATED}


def test_one_call_translates_the_whole_deck_and_no_layout_or_master(sample):
    calls = []
    files.translate_file(sample, "pptx", lambda s: calls.append(s) or identity(s))
    assert len(calls) == 1
    assert "Speak slowly about the dog." in calls[0] and "Sales by region" in calls[0] and "Last cell" in calls[0]
    assert not [s for s in calls[0] if "Click to" in s or "Master" in s]  # the layouts' and masters' prompts
    assert not [s for s in calls[0] if "Slide 1" in s]  # the notes' slide number


def test_a_deck_without_text_comes_back_as_it_was():
    prs = pptx.Presentation()
    prs.slides.add_slide(prs.slide_layouts[6])  # Blank
    buffer = io.BytesIO()
    prs.save(buffer)
    calls = []
    assert (
        files.translate_file(buffer.getvalue(), "pptx", lambda s: calls.append(s) or identity(s)) == buffer.getvalue()
    )
    assert calls == []


def with_member(data: bytes, name: str, content: bytes | None) -> bytes:
    """The archive with one member replaced (or dropped, for None)."""
    entries = members(data)
    if content is None:
        del entries[name]
    else:
        entries[name] = content
    return zip_of(entries)


def word_file() -> bytes:
    docx = pytest.importorskip("docx")
    out = io.BytesIO()
    docx.Document().save(out)
    return out.getvalue()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: b"PK\x03\x04 not really a zip", "not a zip archive"),
        (lambda d: zip_of({"hello.txt": b"hello"}), r"no \[Content_Types\].xml"),
        (lambda d: word_file(), "no presentation"),
        (lambda d: with_member(d, "ppt/slides/slide2.xml", b"<p:sld><a:p>"), "ppt/slides/slide2.xml"),
        (lambda d: with_member(d, "[Content_Types].xml", b"<Types"), r"\[Content_Types\].xml: "),
    ],
)
def test_bad_files_raise_one_line(sample, make, message):
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(make(sample), "pptx", identity)
    assert "\n" not in str(e.value) and "not a valid PowerPoint .pptx file" in str(e.value)


def test_a_zip_bomb_is_refused_before_it_is_read(sample, monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIPPED_BYTES", 1_000_000)
    bomb = with_member(sample, "ppt/media/filler.bin", b"\0" * 2_000_000)
    with pytest.raises(FileTooLarge, match="PowerPoint .pptx file unpacks to"):
        files.translate_file(bomb, "pptx", identity)


def test_a_run_without_properties_gets_them_for_its_language(sample):
    entries = members(sample)
    slide = etree.fromstring(entries["ppt/slides/slide2.xml"])
    run = next(slide.iter(f"{A}r"))
    assert run.find(f"{A}rPr") is None
    out = members(files.translate_file(sample, "pptx", upper, target="de"))
    run = next(etree.fromstring(out["ppt/slides/slide2.xml"]).iter(f"{A}r"))
    assert [c.tag for c in run] == [f"{A}rPr", f"{A}t"] and run[0].get("lang") == "de" and run[1].text == "SECOND SLIDE"


@pytest.mark.slow
def test_libreoffice_opens_the_translated_deck(sample, tmp_path):
    from office import to_pdf

    pypdf = pytest.importorskip("pypdf")
    out = files.translate_file(sample, "pptx", upper, target="de")
    pdf = pypdf.PdfReader(io.BytesIO(to_pdf(out, ".pptx", tmp_path)))
    words = " ".join(" ".join(page.extract_text().split()) for page in pdf.pages)
    for expected in ["A REPORT ON THE DOG", "THE QUICK BROWN FOX READS THE GUIDE TODAY.", "ONE CELL", "SECOND SLIDE"]:
        assert expected in words
    assert len(pdf.pages) == 2
