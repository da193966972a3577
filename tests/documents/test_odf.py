"""OpenDocument files (.odt, .odp, .ods) translated with their formatting kept: each built here with odfpy, then
translated by the fake translators of test_files (identity, uppercase, words reversed) and read back."""

import io
import re
import zipfile

import pytest
from test_files import identity, reversed_upper, upper, zip_of

from nanomt.documents import files, formats, odf
from nanomt.documents.files import FileTooLarge, UnsupportedFile

odfpy = pytest.importorskip("odf.opendocument")
etree = pytest.importorskip("lxml.etree")
from odf import dc, draw, office, presentation, style, svg, table, text  # noqa: E402

# A 1x1 PNG: the picture every test file holds, which must come back byte for byte.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f80f0000010101005a4d6e0b0000000049454e44ae426082"
)
T, OFFICE, TABLE, FO, STYLE, DC = ("{" + odf.NS[p] + "}" for p in ("text", "office", "table", "fo", "style", "dc"))


def default_style(family: str) -> style.DefaultStyle:
    """A default style with the document's languages, as LibreOffice writes one (western, Asian, complex)."""
    props = style.TextProperties(language="en", country="US", languageasian="zh", countryasian="CN")
    props.setAttrNS(odf.NS["style"], "language-complex", "hi")
    default = style.DefaultStyle(family=family)
    default.addElement(props)
    return default


def master_page(doc, header: str | None = None) -> style.MasterPage:
    layout = style.PageLayout(name="pm1")
    doc.automaticstyles.addElement(layout)
    master = style.MasterPage(name="Standard", pagelayoutname=layout)
    if header is not None:
        head = style.Header()
        head.addElement(text.P(text=header))
        master.addElement(head)
        foot = style.Footer()
        p = text.P(text="Page ")
        p.addElement(text.PageNumber(selectpage="current", text="1"))
        p.addText(" of the report")
        foot.addElement(p)
        master.addElement(foot)
    doc.masterstyles.addElement(master)
    return master


def saved(doc) -> bytes:
    out = io.BytesIO()
    doc.write(out)
    return out.getvalue()


def odt_sample() -> bytes:
    """A text document: a heading, a sentence with a bold word and a link, a tab and a line break, a table, a picture
    in a sentence, a text box and a footnote inside paragraphs, a comment, a list with a bold word in a link, runs of
    spaces, a bookmark and a page break, a tracked deletion, a header and a footer with a page number."""
    doc = odfpy.OpenDocumentText()
    doc.styles.addElement(default_style("paragraph"))
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    code = style.Style(name="Code", family="text")
    code.addElement(style.TextProperties(language="zxx", country="none"))
    doc.automaticstyles.addElement(code)
    master_page(doc, header="The header")
    body = doc.text
    body.addElement(text.H(outlinelevel=1, text="A report on the dog"))
    p = text.P(text="This is ")
    p.addElement(text.Span(stylename=bold, text="important"))
    p.addText(" text with ")
    p.addElement(text.A(href="https://example.com/dog", type="simple", text="a link"))
    p.addText(" here.")
    body.addElement(p)
    p = text.P(text="A second sentence")
    p.addElement(text.Tab())
    p.addText("after a tab.")
    p.addElement(text.LineBreak())
    p.addText("A new line after a break.")
    body.addElement(p)
    grid = table.Table(name="Table1")
    grid.addElement(table.TableColumn(numbercolumnsrepeated=2))
    row = table.TableRow()
    for words in ("One cell", "Another cell"):
        cell = table.TableCell(valuetype="string")
        cell.addElement(text.P(text=words))
        row.addElement(cell)
    grid.addElement(row)
    body.addElement(grid)
    p = text.P(text="Look at this picture ")
    frame = draw.Frame(name="Dog", anchortype="as-char", width="1cm", height="1cm")
    frame.addElement(draw.Image(href=doc.addPicture("Pictures/dog.png", "image/png", PNG)))
    p.addElement(frame)
    p.addText(" of a dog.")
    body.addElement(p)
    p = text.P(text="A box ")
    frame = draw.Frame(name="Box", anchortype="as-char", width="4cm", height="1cm")
    box = draw.TextBox()
    box.addElement(text.P(text="Inside a box."))
    frame.addElement(box)
    p.addElement(frame)
    p.addText(" stands here.")
    body.addElement(p)
    p = text.P(text="A claim")
    note = text.Note(id="ftn1", noteclass="footnote")
    note.addElement(text.NoteCitation(text="1"))
    note_body = text.NoteBody()
    note_body.addElement(text.P(text="A note about it."))
    note.addElement(note_body)
    p.addElement(note)
    p.addText(" with a footnote.")
    body.addElement(p)
    p = text.P(text="Run ")
    p.addElement(text.Span(stylename=code, text="ls"))
    p.addText(" to ")
    annotation = office.Annotation(check_grammar=False)  # a comment on a range of words: "see them"
    annotation.setAttrNS(odf.NS["office"], "name", "c1")
    annotation.addElement(dc.Creator(text="Ann"))
    annotation.addElement(dc.Date(text="2024-01-02T10:00:00"))
    annotation.addElement(text.P(text="A comment on it."))
    p.addElement(annotation)
    p.addText("see them")
    p.addElement(office.AnnotationEnd(name="c1"))
    p.addText(" now.")
    body.addElement(p)
    items = text.List()
    item = text.ListItem()
    p = text.P(text="See ")
    link = text.A(href="#top", type="simple", text="the ")
    link.addElement(text.Span(stylename=bold, text="first"))
    link.addText(" page")
    p.addElement(link)
    p.addText(" for more.")
    item.addElement(p)
    items.addElement(item)
    item = text.ListItem()
    p = text.P(text="Two")
    p.addElement(text.S(c=2))
    p.addText("spaces and a ")
    p.addElement(text.BookmarkStart(name="word"))
    p.addText("marked")
    p.addElement(text.BookmarkEnd(name="word"))
    p.addText(" word")
    p.addElement(text.SoftPageBreak())
    p.addText(" on a new page.")
    item.addElement(p)
    items.addElement(item)
    body.addElement(items)
    body.addElement(tracked_deletion())
    p = text.P(text="Words")
    p.addElement(text.Change(changeid="ct1"))
    p.addText(" were deleted here.")
    body.addElement(p)
    body.addElement(text.P(text=""))
    body.addElement(text.P(text="2024"))
    return saved(doc)


def tracked_deletion() -> text.TrackedChanges:
    """A paragraph deleted with changes tracked: kept for the record, never shown, not translated."""
    region = text.ChangedRegion(check_grammar=False)
    region.setAttrNS(odf.NS["text"], "id", "ct1")
    deletion = text.Deletion()
    info = office.ChangeInfo()
    info.addElement(dc.Creator(text="Bob"))
    info.addElement(dc.Date(text="2024-01-02T10:00:00"))
    deletion.addElement(info)
    deletion.addElement(text.P(text="Deleted words."))
    region.addElement(deletion)
    changes = text.TrackedChanges()
    changes.addElement(region)
    return changes


def text_box(x: str, y: str, words: str, cls: str | None = None) -> draw.Frame:
    frame = draw.Frame(width="20cm", height="3cm", x=x, y=y, **({"class": cls} if cls else {}))
    box = draw.TextBox()
    box.addElement(text.P(text=words))
    frame.addElement(box)
    return frame


def odp_sample() -> bytes:
    """A presentation: two slides with a title and a text box each, one with a bold word, a picture with a title and
    a description (its alternative text), a footer's text, and speaker notes."""
    doc = odfpy.OpenDocumentPresentation()
    doc.styles.addElement(default_style("graphic"))
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    master = master_page(doc)
    doc.presentation.addElement(presentation.FooterDecl(name="ftr1", text="Our little company"))
    for n, (title, words) in enumerate([("The first slide", "Dogs bark at night."), ("The last slide", "")], 1):
        page = draw.Page(name=f"page{n}", masterpagename=master, usefootername="ftr1")
        page.addElement(text_box("1cm", "1cm", title, "title"))
        if n == 1:
            frame = draw.Frame(name="Dog", width="2cm", height="2cm", x="20cm", y="10cm")
            frame.addElement(draw.Image(href=doc.addPicture("Pictures/dog.png", "image/png", PNG)))
            frame.addElement(svg.Title(text="A sleeping dog"))
            frame.addElement(svg.Desc(text="A brown dog asleep on a rug."))
            page.addElement(frame)
        if words:
            page.addElement(text_box("1cm", "5cm", words))
        else:
            frame = text_box("1cm", "5cm", "Cats sleep ")
            p = frame.getElementsByType(text.P)[0]
            p.addElement(text.Span(stylename=bold, text="all day"))
            p.addText(" long.")
            page.addElement(frame)
        notes = presentation.Notes()
        notes.addElement(text_box("1cm", "1cm", f"Say hello to the room on slide {n}.", "notes"))
        page.addElement(notes)
        doc.presentation.addElement(page)
    return saved(doc)


def ods_sample() -> bytes:
    """A spreadsheet: text cells (one with a bold word, one with a link), a number, a date, formulas (one with a text
    result) and a comment on a text cell."""
    doc = odfpy.OpenDocumentSpreadsheet()
    doc.styles.addElement(default_style("table-cell"))
    bold = style.Style(name="Bold", family="text")
    bold.addElement(style.TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    wide = style.Style(name="co1", family="table-column")
    wide.addElement(style.TableColumnProperties(columnwidth="5cm"))
    doc.automaticstyles.addElement(wide)
    sheet = table.Table(name="Sheet1")
    sheet.addElement(table.TableColumn(stylename=wide, numbercolumnsrepeated=6))
    row = table.TableRow()
    cell = table.TableCell(valuetype="string")
    cell.addElement(text.P(text="Hello world"))
    annotation = office.Annotation()
    annotation.addElement(dc.Creator(text="Ann"))
    annotation.addElement(text.P(text="A comment on the cell."))
    cell.addElement(annotation)
    row.addElement(cell)
    for attributes, shown in [
        ({"valuetype": "float", "value": "42"}, "42"),
        ({"valuetype": "date", "datevalue": "2024-01-02"}, "01/02/24"),
        ({"valuetype": "float", "value": "84", "formula": "of:=[.B1]*2"}, "84"),
        ({"valuetype": "string", "formula": 'of:=CONCATENATE("ab";"cd")'}, "abcd"),
        ({"valuetype": "boolean", "booleanvalue": "true"}, "true"),
    ]:
        cell = table.TableCell(**attributes)
        cell.addElement(text.P(text=shown))
        row.addElement(cell)
    sheet.addElement(row)
    row = table.TableRow()
    cell = table.TableCell(valuetype="string")
    p = text.P(text="A ")
    p.addElement(text.Span(stylename=bold, text="strong"))
    p.addText(" claim")
    cell.addElement(p)
    row.addElement(cell)
    cell = table.TableCell(valuetype="string")
    p = text.P(text="See ")
    p.addElement(text.A(href="https://example.com/", type="simple", text="the site"))
    cell.addElement(p)
    row.addElement(cell)
    sheet.addElement(row)
    doc.spreadsheet.addElement(sheet)
    return saved(doc)


SAMPLES = {"odt": odt_sample, "odp": odp_sample, "ods": ods_sample}
CONTENT = ("content.xml", "styles.xml", "meta.xml")  # the members a translation may write


@pytest.fixture(scope="module")
def samples() -> dict[str, bytes]:
    return {fmt: make() for fmt, make in SAMPLES.items()}


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def xml(data: bytes, name: str = "content.xml"):
    return etree.fromstring(members(data)[name])


def canonical(data: bytes, name: str) -> bytes:
    return etree.tostring(xml(data, name), method="c14n")


def kept(element) -> bool:
    """Whether an element's text is not translated: dates and authors of comments, cells of values and formulas,
    deleted text."""
    if element is None:  # the text after the root
        return True
    for e in element.iterancestors():
        if e.tag == f"{T}tracked-changes":
            return True
        if e.tag == f"{TABLE}table-cell" and (e.get(f"{TABLE}formula") or e.get(f"{OFFICE}value-type") != "string"):
            return True
    return element.tag.startswith(DC)


def nodes(root):
    """Every element in order: its tag, attributes, text and tail."""
    return [(e.tag, dict(e.attrib), e.text, e.tail) for e in root.iter()]


def expected_upper(root):
    """nodes() of a tree whose translatable text an uppercasing translator has translated."""
    up = lambda s, keep: s if s is None or keep else s.upper()  # noqa: E731
    return [(e.tag, dict(e.attrib), up(e.text, kept(e)), up(e.tail, kept(e.getparent()))) for e in root.iter()]


@pytest.mark.parametrize("fmt", SAMPLES)
def test_identity_gives_the_same_documents_back(fmt, samples):
    data = samples[fmt]
    out = files.translate_file(data, fmt, identity)
    for name in ("content.xml", "styles.xml"):
        assert canonical(out, name) == canonical(data, name)


@pytest.mark.parametrize("fmt", SAMPLES)
def test_uppercasing_changes_the_text_and_nothing_else(fmt, samples):
    data = samples[fmt]
    out = files.translate_file(data, fmt, upper)
    for name in ("content.xml", "styles.xml"):
        assert nodes(xml(out, name)) == expected_upper(xml(data, name))
        declarations = lambda d: re.findall(rb'xmlns:\w+="[^"]*"', members(d)[name])  # noqa: E731, B023
        assert declarations(out) == declarations(data)  # each prefix kept (formulas name of: in their text)
    before, after = members(data), members(out)
    assert list(after) == list(before)
    assert {n: b for n, b in after.items() if n not in CONTENT} == {n: b for n, b in before.items() if n not in CONTENT}
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        first = z.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
    assert out[30:38] == b"mimetype"  # first in the archive, where a reader looks for it
    assert members(out)["meta.xml"] == before["meta.xml"]  # no target: the language tags are kept
    odfpy.load(io.BytesIO(out))  # opens again


def own_text(element) -> str:
    """A paragraph's text with its spans' and links', without that of the notes, comments and frames in it."""
    inline = (f"{T}span", f"{T}a")
    return (element.text or "") + "".join((own_text(c) if c.tag in inline else "") + (c.tail or "") for c in element)


def test_a_text_document_uppercased_reads_as_expected(samples):
    out = files.translate_file(samples["odt"], "odt", upper)
    paragraphs = [etree.tostring(p, method="text", encoding=str) for p in xml(out).iter(f"{T}p", f"{T}h")]
    assert "A REPORT ON THE DOG" in paragraphs
    assert "THIS IS IMPORTANT TEXT WITH A LINK HERE." in paragraphs
    assert "INSIDE A BOX." in paragraphs and "A NOTE ABOUT IT." in paragraphs and "A COMMENT ON IT." in paragraphs
    assert [own_text(p) for p in xml(out).iter(f"{T}p") if p.find(f"{OFFICE}annotation") is not None] == [
        "RUN LS TO SEE THEM NOW."
    ]
    assert "LOOK AT THIS PICTURE  OF A DOG." in paragraphs  # the picture between the two spaces
    assert "SEE THE FIRST PAGE FOR MORE." in paragraphs and "Deleted words." in paragraphs
    assert "TWOSPACES AND A MARKED WORD ON A NEW PAGE." in paragraphs  # text:s holds its spaces as an element
    assert [etree.tostring(p, method="text", encoding=str) for p in xml(out, "styles.xml").iter(f"{T}p")] == [
        "THE HEADER",
        "PAGE 1 OF THE REPORT",
    ]
    assert "Pictures/dog.png" in members(out) and members(out)["Pictures/dog.png"] == PNG


def test_every_paragraph_is_translated_once_in_one_call(samples):
    calls = []
    out = files.translate_file(samples["odt"], "odt", lambda s: calls.append(s) or upper(s))
    assert len(calls) == 1  # content and styles together
    sentences = calls[0]
    assert len(sentences) == len(set(sentences))
    for nested in ("Inside a box.", "A note about it.", "A comment on it.", "The header"):
        assert sentences.count(nested) == 1
    assert "A box stands here." in sentences and "A claim with a footnote." in sentences  # the void left out
    assert "2024" not in sentences and "" not in sentences  # no letters: not sent
    box = next(xml(out).iter(f"{{{odf.NS['draw']}}}text-box"))
    assert [etree.tostring(p, method="text", encoding=str) for p in box] == ["INSIDE A BOX."]


def span_and_link(paragraph):
    spans = [s.text for s in paragraph.iter(f"{T}span")]
    links = [(a.text, a.get("{http://www.w3.org/1999/xlink}href")) for a in paragraph.iter(f"{T}a")]
    return spans, links


def test_the_bold_span_and_the_link_follow_their_words_when_they_move(samples):
    out = files.translate_file(samples["odt"], "odt", reversed_upper)
    paragraph = [p for p in xml(out).iter(f"{T}p") if "HERE." in etree.tostring(p, method="text", encoding=str)][0]
    assert etree.tostring(paragraph, method="text", encoding=str) == "HERE. LINK A WITH TEXT IMPORTANT IS THIS"
    assert span_and_link(paragraph) == (["IMPORTANT"], [("LINK A", "https://example.com/dog")])
    span = next(paragraph.iter(f"{T}span"))
    assert span.get(f"{T}style-name") == "Bold"
    item = [p for p in xml(out).iter(f"{T}p") if "PAGE" in etree.tostring(p, method="text", encoding=str)][0]
    assert etree.tostring(item, encoding=str).split(">", 1)[1] == (
        'MORE. FOR <text:a xlink:href="#top" xlink:type="simple">PAGE <text:span text:style-name="Bold">FIRST'
        "</text:span> THE</text:a> SEE</text:p>"
    )
    texts = lambda p: etree.tostring(p, encoding=str, with_tail=False).split(">", 1)[1]  # noqa: E731
    item = [p for p in xml(out).iter(f"{T}p") if "MARKED" in etree.tostring(p, method="text", encoding=str)][0]
    assert texts(item) == (
        'PAGE. NEW A ON<text:soft-page-break/> WORD <text:bookmark-start text:name="word"/>MARKED'
        '<text:bookmark-end text:name="word"/> A AND SPACES<text:s text:c="2"/>TWO</text:p>'
    )  # the bookmark around its word; the page break, a void, between the words it stood between
    item = [p for p in xml(out).iter(f"{T}p") if "RUN" in etree.tostring(p, method="text", encoding=str)][0]
    assert re.sub("<office:annotation .*</office:annotation>", "<office:annotation/>", texts(item)) == (
        'NOW. <office:annotation/>THEM SEE<office:annotation-end office:name="c1"/> TO '
        '<text:span text:style-name="Code">LS</text:span> RUN</text:p>'
    )  # the comment on the words it commented on
    out = files.translate_file(samples["ods"], "ods", reversed_upper)
    cells = {etree.tostring(p, method="text", encoding=str): p for p in xml(out).iter(f"{T}p")}
    assert span_and_link(cells["CLAIM STRONG A"]) == (["STRONG"], [])
    assert span_and_link(cells["SITE THE SEE"]) == ([], [("SITE THE", "https://example.com/")])
    out = files.translate_file(samples["odp"], "odp", reversed_upper)
    slide = [p for p in xml(out).iter(f"{T}p") if p.find(f"{T}span") is not None][0]
    assert etree.tostring(slide, method="text", encoding=str) == "LONG. DAY ALL SLEEP CATS"
    assert span_and_link(slide) == (["DAY ALL"], [])


def test_spreadsheet_values_and_formulas_are_never_touched(samples):
    data = samples["ods"]
    out = files.translate_file(data, "ods", upper)
    cells = lambda d: [etree.tostring(c) for c in xml(d).iter(f"{TABLE}table-cell")]  # noqa: E731
    before, after = cells(data), cells(out)
    assert len(before) == len(after) == 8
    assert after[1:6] == before[1:6]  # number, date, two formulas, a boolean: byte for byte
    assert b"abcd" in after[4] and b"of:=CONCATENATE" in after[4]
    assert b"HELLO WORLD" in after[0] and b"A COMMENT ON THE CELL." in after[0] and b">Ann<" in after[0]
    assert members(out)["content.xml"].count(b'xmlns:of="urn:oasis:names:tc:opendocument:xmlns:of:1.2"') == 1


def test_speaker_notes_and_slides_are_translated(samples):
    out = files.translate_file(samples["odp"], "odp", upper)
    notes = [
        etree.tostring(n, method="text", encoding=str) for n in xml(out).iter(f"{{{odf.NS['presentation']}}}notes")
    ]
    assert notes == ["SAY HELLO TO THE ROOM ON SLIDE 1.", "SAY HELLO TO THE ROOM ON SLIDE 2."]
    frames = [
        "".join(p.xpath("string()") for p in f.iter(f"{T}p")) for f in xml(out).iter(f"{{{odf.NS['draw']}}}frame")
    ]
    assert frames[:3] == ["THE FIRST SLIDE", "", "DOGS BARK AT NIGHT."]  # the picture's frame holds no text
    alternative = [e.text for e in xml(out).iter(f"{{{odf.NS['svg']}}}title", f"{{{odf.NS['svg']}}}desc")]
    assert alternative == ["A SLEEPING DOG", "A BROWN DOG ASLEEP ON A RUG."]
    assert [e.text for e in xml(out).iter(f"{{{odf.NS['presentation']}}}footer-decl")] == ["OUR LITTLE COMPANY"]
    assert members(out)["Pictures/dog.png"] == PNG


def language_tags(data: bytes):
    """Every style's western, Asian and complex language tags, and meta.xml's dc:language."""
    found = []
    for name in ("styles.xml", "content.xml"):
        for props in xml(data, name).iter(f"{STYLE}text-properties"):
            keys = ("language", "country", "language-asian", "language-complex")
            found.append(tuple(props.get(f"{FO if k in ('language', 'country') else STYLE}{k}") for k in keys))
    meta = [e.text for e in xml(data, "meta.xml").iter(f"{DC}language")]
    return found, meta


@pytest.mark.parametrize("fmt", SAMPLES)
def test_the_target_language_goes_into_the_language_tags(fmt, samples):
    data = samples[fmt]
    default = ("en", "US", "zh", "hi")
    (styles, meta) = language_tags(data)
    assert default in styles and meta == []
    styles, meta = language_tags(files.translate_file(data, fmt, identity, target="pt-BR"))
    assert ("pt", "BR", "zh", "hi") in styles and default not in styles and meta == ["pt-BR"]
    out = files.translate_file(data, fmt, identity, target="de")
    styles, meta = language_tags(out)
    assert ("de", "none", "zh", "hi") in styles and meta == ["de"]
    unchanged = lambda d: {n: b for n, b in members(d).items() if n not in CONTENT}  # noqa: E731
    assert unchanged(out) == unchanged(data)
    if fmt == "odt":
        assert ("zxx", "none", None, None) in styles  # text marked as no language stays so
        assert (None, None, None, None) in styles  # bold: no language of its own, none given


def test_a_language_with_a_script_is_written_as_libreoffice_writes_it(samples):
    out = files.translate_file(samples["odt"], "odt", identity, target="sr_Latn_RS")
    props = next(xml(out, "styles.xml").iter(f"{STYLE}text-properties"))
    assert (props.get(f"{FO}language"), props.get(f"{FO}country"), props.get(f"{FO}script")) == ("sr", "RS", "Latn")
    assert props.get(f"{STYLE}rfc-language-tag") == "sr-Latn-RS"
    assert [e.text for e in xml(out, "meta.xml").iter(f"{DC}language")] == ["sr-Latn-RS"]


ENCRYPTED = (  # a password-protected document's manifest: its content.xml is ciphertext
    b'<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
    b'<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml">'
    b'<manifest:encryption-data manifest:checksum-type="SHA1/1K" manifest:checksum="x"/>'
    b"</manifest:file-entry></manifest:manifest>"
)


def with_member(data: bytes, name: str, content: bytes | None) -> bytes:
    """The archive with one member's bytes replaced (None: left out)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as z:
        for info in source.infolist():
            if info.filename == name and content is None:
                continue
            z.writestr(info, content if info.filename == name else source.read(info))
    return out.getvalue()


@pytest.mark.parametrize(
    "make, fmt, message",
    [
        (lambda s: b"PK\x03\x04 not a zip", "odt", r"not a valid OpenDocument text file \(not a zip archive\)"),
        (lambda s: s["odp"], "odt", r"the file is an OpenDocument presentation \(.odp\), not an OpenDocument text"),
        (lambda s: s["odt"], "ods", r"is an OpenDocument text \(.odt\), not an OpenDocument spreadsheet"),
        (lambda s: with_member(s["odt"], "mimetype", b"text/plain"), "odt", "its mimetype is 'text/plain'"),
        (lambda s: with_member(s["odt"], "mimetype", None), "odt", r"\(no mimetype\)"),
        (lambda s: with_member(s["odp"], "content.xml", None), "odp", r"\(no content.xml\)"),
        (lambda s: with_member(s["ods"], "content.xml", b"<a><b></a>"), "ods", r"\(content.xml: .*line 1"),
        (lambda s: with_member(s["odt"], "content.xml", b"<a/>"), "odt", "holds no document content"),
        (lambda s: zip_of({"mimetype": b"application/vnd.oasis.opendocument.text"}), "odt", "no content.xml"),
        (
            lambda s: with_member(s["odt"], "META-INF/manifest.xml", ENCRYPTED),
            "odt",
            r"encrypted \(saved with a password\)",
        ),
    ],
)
def test_bad_files_are_refused_in_one_line(make, fmt, message, samples):
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(make(samples), fmt, identity)
    assert "\n" not in str(e.value)


def test_a_template_is_translated_as_its_document(samples):
    template = with_member(samples["odt"], "mimetype", b"application/vnd.oasis.opendocument.text-template")
    out = files.translate_file(template, "odt", upper)
    assert b"A REPORT ON THE DOG" in members(out)["content.xml"]


def test_a_zip_bomb_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIPPED_BYTES", 1_000_000)
    bomb = zip_of({"mimetype": formats.MEDIA_TYPES["odt"].encode(), "content.xml": b"\0" * 2_000_000})
    assert len(bomb) < 10_000
    with pytest.raises(FileTooLarge, match="the OpenDocument text file unpacks to 2,000,039 bytes") as e:
        files.translate_file(bomb, "odt", identity)
    assert "\n" not in str(e.value)


def test_entities_are_not_expanded(samples):
    data = with_member(
        samples["odt"],
        "content.xml",
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        b'<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        b'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
        b"<text:p>Read &e; now</text:p></office:text></office:body></office:document-content>",
    )
    out = files.translate_file(data, "odt", upper)
    assert b"root:" not in members(out)["content.xml"] and b"READ" in members(out)["content.xml"]


def test_a_document_without_text_comes_back_as_it_was():
    doc = odfpy.OpenDocumentText()
    doc.text.addElement(text.P(text="42"))
    data = saved(doc)
    calls = []
    assert files.translate_file(data, "odt", lambda s: calls.append(s) or identity(s)) == data
    assert calls == []


PDF_TEXT = {
    "odt": ["A REPORT ON THE DOG", "THIS IS IMPORTANT TEXT WITH A LINK HERE.", "ONE CELL", "THE HEADER", "PAGE 1 OF"],
    "odp": ["THE FIRST SLIDE", "DOGS BARK AT NIGHT.", "CATS SLEEP ALL DAY LONG."],
    "ods": ["HELLO WORLD", "A STRONG CLAIM", "42", "84", "abcd"],
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", SAMPLES)
def test_libreoffice_opens_the_translated_file(fmt, samples, tmp_path):
    from office import to_pdf

    pypdf = pytest.importorskip("pypdf")
    out = files.translate_file(samples[fmt], fmt, upper, target="de")
    pdf = pypdf.PdfReader(io.BytesIO(to_pdf(out, f".{fmt}", tmp_path)))
    words = " ".join(" ".join(page.extract_text().split()) for page in pdf.pages)
    for expected in PDF_TEXT[fmt]:
        assert expected in words
