"""Excel files (.xlsx) translated with their formatting kept: a workbook built here with openpyxl, its strings
moved into xl/sharedStrings.xml as Excel keeps them, translated by the fake translators of test_files (identity,
uppercase, words reversed) and read back."""

import datetime
import io
import zipfile

import pytest
from test_files import identity, reversed_upper, upper, zip_of

from nanomt.documents import files, markup
from nanomt.documents.files import FileTooLarge, UnsupportedFile

openpyxl = pytest.importorskip("openpyxl")
etree = pytest.importorskip("lxml.etree")
from openpyxl.cell.rich_text import CellRichText, TextBlock  # noqa: E402
from openpyxl.cell.text import InlineFont  # noqa: E402
from openpyxl.styles import Font, PatternFill  # noqa: E402
from openpyxl.worksheet.table import Table  # noqa: E402

S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
CONTENT_TYPES = "{http://schemas.openxmlformats.org/package/2006/content-types}"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
SHARED = "xl/sharedStrings.xml"
REPORT, DATA = "xl/worksheets/sheet1.xml", "xl/worksheets/sheet2.xml"
INLINE = (REPORT, "C1")  # the one cell that keeps its string in itself
TEXTS = {  # the Report sheet's text cells
    "A1": "A report on the dog",
    "B1": "A report on the dog",  # the same text: one shared string
    "B2": " Leading and trailing ",
    "B3": "First line\r\nsecond line",
    "C1": "An inline string stays inline",
}
VALUES = {"A3": 42, "A4": datetime.datetime(2024, 5, 17), "A5": "=A3*2", "A6": 3.5, "A7": '="a"&"b"'}


def excel_strings(data: bytes) -> bytes:
    """The workbook as Excel keeps it: each distinct string once in xl/sharedStrings.xml (openpyxl writes every
    string into its cell), a carriage return written _x000D_; the INLINE cell keeps its own."""
    entries = members(data)
    shared, index = etree.Element(f"{S}sst", nsmap={None: S[1:-1]}), {}
    for name in sorted(n for n in entries if n.startswith("xl/worksheets/sheet")):
        root = etree.fromstring(entries[name])
        for c in root.iter(f"{S}c"):
            if c.get("t") != "inlineStr" or (name, c.get("r")) == INLINE:
                continue
            string = c.find(f"{S}is")
            for t in string.iter(f"{S}t"):
                t.text = t.text.replace("\r", "_x000D_")
            key = etree.tostring(string)
            if key not in index:
                index[key] = len(index)
                etree.SubElement(shared, f"{S}si").extend(list(string))
            c.remove(string)
            c.set("t", "s")
            etree.SubElement(c, f"{S}v").text = str(index[key])
        entries[name] = etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)
    shared.set("uniqueCount", str(len(index)))
    entries[SHARED] = etree.tostring(shared, xml_declaration=True, encoding="UTF-8", standalone=True)
    types = etree.fromstring(entries["[Content_Types].xml"])
    kind = "application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"
    etree.SubElement(types, f"{CONTENT_TYPES}Override", PartName="/" + SHARED, ContentType=kind)
    entries["[Content_Types].xml"] = etree.tostring(types, xml_declaration=True, encoding="UTF-8", standalone=True)
    rels = etree.fromstring(entries["xl/_rels/workbook.xml.rels"])
    etree.SubElement(
        rels,
        "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship",
        Id="rIdStrings",
        Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings",
        Target="sharedStrings.xml",
    )
    entries["xl/_rels/workbook.xml.rels"] = etree.tostring(
        rels, xml_declaration=True, encoding="UTF-8", standalone=True
    )
    # A formula whose result is text (t="str"), as Excel saves it with its cached value.
    formula = b'<c r="A7"><f>"a"&amp;"b"</f><v/></c>'
    assert formula in entries[REPORT]
    entries[REPORT] = entries[REPORT].replace(formula, b'<c r="A7" t="str"><f>"a"&amp;"b"</f><v>ab words</v></c>')
    return zip_of(entries)


def workbook() -> bytes:
    """Text cells (one styled bold on a fill, two of the same text, spaces at the edges, a line break), a rich-text
    cell with a bold word in the middle, a number, a date, formulas; a second sheet with a table."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Report"
    for ref, text in TEXTS.items():
        ws[ref] = text
    ws["A1"].font = Font(bold=True)
    ws["A1"].fill = PatternFill("solid", fgColor="FFFF00")
    ws["A2"] = CellRichText("The quick ", TextBlock(InlineFont(b=True), "brown"), " fox jumps over the dog.")
    for ref, value in VALUES.items():
        ws[ref] = value
    data = wb.create_sheet("Data")
    for row in [["Name", "Count"], ["Red apples", 3], ["Green pears", 4]]:
        data.append(row)
    data["D1"] = "Name"  # the text of a table's header, in a cell of its own
    data.add_table(Table(displayName="Fruit", ref="A1:B3"))
    for sheet in (ws, data):
        for column in "ABCD":
            sheet.column_dimensions[column].width = 45  # every text in full on LibreOffice's page
    out = io.BytesIO()
    wb.save(out)
    return excel_strings(out.getvalue())


@pytest.fixture(scope="module")
def sample() -> bytes:
    return workbook()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def read(data: bytes):
    return openpyxl.load_workbook(io.BytesIO(data), rich_text=True)


def uppercased(root, keep=()) -> bytes:
    """The part's XML with every string's text uppercased (those at the indexes in `keep` as they were), as the
    translation writes it."""
    for i, string in enumerate(root.iter(f"{S}si", f"{S}is")):
        for t in [] if i in keep else string.iter(f"{S}t"):
            if t.text != t.text.upper():
                t.text = t.text.upper().replace("_X000D_", "_x000D_")
                if t.text != t.text.strip():
                    t.set(XML_SPACE, "preserve")
    return etree.tostring(root)


def test_the_sample_is_what_excel_writes(sample):
    entries = members(sample)
    assert b"inlineStr" in entries[REPORT] and b"<si>" in entries[SHARED] and b"_x000D_" in entries[SHARED]
    assert read(sample)["Report"]["B1"].value == "A report on the dog"


def test_identity_gives_the_workbook_back(sample):
    assert files.translate_file(sample, "xlsx", identity) == sample


def test_uppercase_changes_the_text_and_nothing_else(sample):
    out = files.translate_file(sample, "xlsx", upper)
    before, after = members(sample), members(out)
    assert list(after) == list(before)
    assert {n for n in before if after[n] != before[n]} == {SHARED, REPORT}  # styles, the table, sheet 2: as they were
    shared = etree.fromstring(before[SHARED])
    headers = {i for i, si in enumerate(shared) if si.findtext(f"{S}t") in ("Name", "Count")}
    assert etree.tostring(etree.fromstring(after[SHARED])) == uppercased(shared, keep=headers)
    assert etree.tostring(etree.fromstring(after[REPORT])) == uppercased(etree.fromstring(before[REPORT]))
    spaced = [si[0] for si in etree.fromstring(after[SHARED]) if si[0].text == " LEADING AND TRAILING "]
    assert len(spaced) == 1 and spaced[0].get(XML_SPACE) == "preserve"


def test_the_translation_opens_in_openpyxl_with_its_values(sample):
    book, original = read(files.translate_file(sample, "xlsx", upper)), read(sample)
    report = book["Report"]
    for ref in TEXTS:  # (openpyxl reads _x000D_, a carriage return, as it is written)
        assert report[ref].value == original["Report"][ref].value.upper().replace("_X000D_", "_x000D_")
    for ref in VALUES:  # numbers, the date, the formulas
        assert report[ref].value == original["Report"][ref].value
    assert report["A4"].value == datetime.datetime(2024, 5, 17) and report["A4"].number_format == "yyyy-mm-dd h:mm:ss"
    assert report["A1"].font.bold and report["A1"].fill.fgColor.rgb == "00FFFF00"
    assert [(block.font.b if hasattr(block, "font") else None, str(block)) for block in report["A2"].value] == [
        (None, "THE QUICK "),
        (True, "BROWN"),
        (None, " FOX JUMPS OVER THE DOG."),
    ]
    assert book.sheetnames == ["Report", "Data"]  # sheet names: formulas name them
    data = book["Data"]
    assert [[c.value for c in row] for row in data.iter_rows()] == [
        ["Name", "Count", None, "Name"],  # a table's header, and the string it shares: kept
        ["RED APPLES", 3, None, None],
        ["GREEN PEARS", 4, None, None],
    ]
    assert [c.name for c in data.tables["Fruit"].tableColumns] == ["Name", "Count"]


def test_a_formula_s_text_result_stays_as_it_was(sample):
    out = members(files.translate_file(sample, "xlsx", upper))
    assert b'<c r="A7" t="str"><f>"a"&amp;"b"</f><v>ab words</v></c>' in out[REPORT]


def test_bold_follows_its_word_when_the_words_move(sample):
    cell = read(files.translate_file(sample, "xlsx", reversed_upper))["Report"]["A2"].value
    assert "".join(map(str, cell)) == "DOG. THE OVER JUMPS FOX BROWN QUICK THE"
    assert [str(block) for block in cell if hasattr(block, "font") and block.font.b] == ["BROWN"]


def test_a_shared_string_is_translated_once(sample):
    calls = []
    files.translate_file(sample, "xlsx", lambda s: calls.append(s) or identity(s))
    assert len(calls) == 1 and calls[0].count("A report on the dog") == 1
    assert "ab words" not in calls[0] and "Name" not in calls[0]


def test_a_target_language_changes_nothing_more(sample):
    assert files.translate_file(sample, "xlsx", upper, target="de") == files.translate_file(sample, "xlsx", upper)


def test_the_workbook_openpyxl_writes_translates_too():
    wb = openpyxl.Workbook()
    wb.active["A1"] = CellRichText("Plain and ", TextBlock(InlineFont(i=True), "slanted"), " words")
    wb.active["A2"] = "Just text"
    buffer = io.BytesIO()
    wb.save(buffer)  # every string inline (t="inlineStr")
    sheet = read(files.translate_file(buffer.getvalue(), "xlsx", upper)).active
    assert [str(b) for b in sheet["A1"].value] == ["PLAIN AND ", "SLANTED", " WORDS"]
    assert sheet["A2"].value == "JUST TEXT"


def with_member(data: bytes, name: str, content: bytes) -> bytes:
    entries = members(data)
    entries[name] = content
    return zip_of(entries)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: b"PK\x03\x04 not really a zip", "not a zip archive"),
        (lambda d: zip_of({"hello.txt": b"hello"}), r"no \[Content_Types\].xml"),
        (lambda d: with_member(d, "[Content_Types].xml", b'<Types xmlns="x"/>'), "no workbook"),
        (lambda d: with_member(d, SHARED, b"<sst><si><t>x</si></sst>"), "xl/sharedStrings.xml: "),
        (lambda d: with_member(d, REPORT, b"<worksheet><c t='inlineStr'>"), "xl/worksheets/sheet1.xml: "),
    ],
)
def test_bad_files_raise_one_line(sample, make, message):
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(make(sample), "xlsx", identity)
    assert "\n" not in str(e.value) and "not a valid Excel .xlsx file" in str(e.value)


def test_a_zip_bomb_is_refused_before_it_is_read(sample, monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIPPED_BYTES", 1_000_000)
    with pytest.raises(FileTooLarge, match="Excel .xlsx file unpacks to"):
        files.translate_file(with_member(sample, "xl/media/filler.bin", b"\0" * 2_000_000), "xlsx", identity)


@pytest.mark.slow
def test_libreoffice_opens_the_translated_workbook(sample, tmp_path):
    from office import to_pdf

    pypdf = pytest.importorskip("pypdf")
    out = files.translate_file(sample, "xlsx", upper, target="de")
    pdf = pypdf.PdfReader(io.BytesIO(to_pdf(out, ".xlsx", tmp_path)))
    words = " ".join(" ".join(page.extract_text().split()) for page in pdf.pages)
    for expected in [
        "A REPORT ON THE DOG",
        "THE QUICK BROWN FOX JUMPS OVER THE DOG.",
        "AN INLINE STRING",
        "RED APPLES",
    ]:
        assert expected in words
    assert "84" in words and "ab words" in words


THREADED = "xl/threadedComments/threadedComment1.xml"
TC = "http://schemas.microsoft.com/office/spreadsheetml/2018/threadedcomments"


def with_comments() -> tuple[bytes, str]:
    """A workbook with three notes, as openpyxl writes them (plain text) and as Excel writes them (a bold run of the
    author's name and a colon, then the note in a run of its own), and a threaded comment of Excel 365's; the notes'
    part."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws["A1"], ws["A2"], ws["A3"] = "The dog", "The cat", "The bird"
    ws["A1"].comment = openpyxl.comments.Comment("Check the dog.", "Ann Lee")
    ws["A2"].comment = openpyxl.comments.Comment("Ann Lee: a cat.", "Ann Lee")
    ws["A3"].comment = openpyxl.comments.Comment("placeholder", "Ann Lee")
    out = io.BytesIO()
    wb.save(out)
    entries = members(out.getvalue())
    notes = next(n for n in entries if n.startswith("xl/comments/"))
    excel_note = b'<r><rPr><b/></rPr><t>Ann Lee:</t></r><r><t xml:space="preserve">\nThe bird sings.</t></r>'
    entries[notes] = entries[notes].replace(b"<t>placeholder</t>", excel_note)
    assert excel_note in entries[notes]
    entries[THREADED] = (
        f'<ThreadedComments xmlns="{TC}"><threadedComment ref="A1" id="{{1}}" personId="{{2}}">'
        "<text>A thread on the dog.\nA second line.</text></threadedComment></ThreadedComments>"
    ).encode()
    types = entries["[Content_Types].xml"]
    override = f'<Override PartName="/{THREADED}" ContentType="application/vnd.ms-excel.threadedcomments+xml"/>'
    entries["[Content_Types].xml"] = types.replace(b"</Types>", override.encode() + b"</Types>")
    return zip_of(entries), notes


def test_notes_and_threaded_comments_are_translated_and_an_author_s_label_kept():
    data, notes = with_comments()
    assert files.translate_file(data, "xlsx", identity) == data
    out = files.translate_file(data, "xlsx", upper)
    before, after = members(data), members(out)
    assert {n for n in before if after[n] != before[n]} == {notes, THREADED, "xl/worksheets/sheet1.xml"}
    root = etree.fromstring(after[notes])
    texts = ["".join(text.itertext()) for text in root.iter(f"{S}text")]
    assert texts == ["CHECK THE DOG.", "ANN LEE: A CAT.", "Ann Lee:\nTHE BIRD SINGS."]  # a label only as its own run
    label = root.find(f"{S}commentList/{S}comment[3]/{S}text/{S}r")
    assert label.findtext(f"{S}t") == "Ann Lee:" and label.find(f"{S}rPr/{S}b") is not None
    threaded = etree.fromstring(after[THREADED]).findtext(f"{{{TC}}}threadedComment/{{{TC}}}text")
    assert threaded == "A THREAD ON THE DOG.\nA SECOND LINE."  # its line break kept
    assert read(out).active["A1"].comment.text == "CHECK THE DOG."  # the workbook reads back


def test_page_headers_and_footers_are_translated_section_by_section_with_their_codes_kept():
    wb = openpyxl.Workbook()
    ws = wb.active
    ws["A1"] = 42
    ws.oddHeader.center.text = "Quarterly report"
    ws.oddHeader.right.text = "&B Bold words&B here"
    ws.oddFooter.left.text = "Confidential & internal"
    ws.oddFooter.right.text = "Page &P of &N"
    ws.firstFooter.center.text = "&P"  # a section of codes only: nothing to translate
    ws.evenHeader.center.text = "First line\nsecond  line"  # openpyxl writes the line break _x000A_
    out = io.BytesIO()
    wb.save(out)
    data = out.getvalue()
    assert files.translate_file(data, "xlsx", identity) == data
    seen = []
    files.translate_file(data, "xlsx", markup.plain(lambda sentences: seen.extend(sentences) or list(sentences)))
    assert seen == [
        "Quarterly report",
        "Bold words here",
        "Confidential internal",
        "Page of",
        "First line second line",  # the line break a spacing void, as in every format
    ]  # no code translated
    translated = files.translate_file(data, "xlsx", upper)
    sheet = etree.fromstring(members(translated)["xl/worksheets/sheet1.xml"])
    pages = {e.tag.removeprefix(S): e.text for e in sheet.find(f"{S}headerFooter") if e.text}
    assert pages == {
        "oddHeader": "&CQUARTERLY REPORT&R&B BOLD WORDS&B HERE",
        "oddFooter": "&LCONFIDENTIAL & INTERNAL&RPAGE &P OF &N",
        "firstFooter": "&C&P",
        "evenHeader": "&CFIRST LINE\nSECOND  LINE",  # the line break and two spaces kept (_x000A_ no longer needed)
    }
    assert read(translated).active.oddFooter.right.text == "PAGE &P OF &N"  # the workbook reads back


@pytest.mark.slow
def test_libreoffice_prints_the_translated_header_and_footer_with_their_fields(tmp_path):
    from office import to_pdf

    pypdf = pytest.importorskip("pypdf")
    wb = openpyxl.Workbook()
    ws = wb.active
    ws["A1"] = "The dog"
    ws.oddHeader.center.text = "Quarterly report"
    ws.oddFooter.right.text = "Page &P of &N"
    out = io.BytesIO()
    wb.save(out)
    pdf = pypdf.PdfReader(io.BytesIO(to_pdf(files.translate_file(out.getvalue(), "xlsx", upper), ".xlsx", tmp_path)))
    words = " ".join(" ".join(page.extract_text().split()) for page in pdf.pages)
    assert "QUARTERLY REPORT" in words and "PAGE 1 OF 1" in words and "THE DOG" in words  # &P and &N still fields
