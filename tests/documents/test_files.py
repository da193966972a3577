"""Files translated with their formatting kept: every format round-trips; bad, oversized and empty files."""

import html
import io
import re
import zipfile

import numpy as np
import pytest
from conftest import best_seconds
from office import to_pdf
from paths import DATA

from nanomt.documents import files, formats, markup
from nanomt.documents.files import FileTooLarge, UnsupportedFile

# Small hand-written samples (text of our own): one a format.
SAMPLES = {
    "text": "files_sample.txt",
    "html": "files_sample.html",
    "markdown": "files_sample.md",
    "srt": "files_sample.srt",
}
identity = markup.plain(list)
upper = markup.plain(lambda sentences: [s.upper() for s in sentences])


def reversed_upper(sentences):
    """Words reversed and uppercased, with the permutation as the alignment (a language that orders words back)."""
    out = []
    for s in sentences:
        src = s.split()
        tgt = [w.upper() for w in reversed(src)]
        weights = np.zeros((len(tgt) + 1, len(src) + 1))
        weights[np.arange(len(tgt)), np.arange(len(src))[::-1]] = 1
        weights[-1, -1] = 1
        pieces = lambda words: (*("▁" + w for w in words), "</s>")  # noqa: E731
        out.append(markup.Alignment(" ".join(tgt), pieces(src), pieces(tgt), weights))
    return out


def sample(fmt):
    return (DATA / SAMPLES[fmt]).read_bytes()


def docx_sample() -> bytes:
    """A Word file with runs of several formats, a hyperlink, a bookmark, a tab, a break, a table, a header and a
    footer with a page-number field."""
    docx = pytest.importorskip("docx")
    from docx.oxml import parse_xml
    from docx.oxml.ns import nsdecls

    doc = docx.Document()
    doc.add_heading("A report on the dog", level=1)
    p = doc.add_paragraph("This is ")
    p.add_run("important").bold = True
    p.add_run(" text with ")
    p.add_run("italic words").italic = True
    p.add_run(". A second sentence\tafter a tab.\nA new line after a break.")
    link = doc.add_paragraph("See ")
    link._p.append(parse_xml(f'<w:bookmarkStart {nsdecls("w")} w:id="0" w:name="top"/>'))
    link._p.append(
        parse_xml(
            f'<w:hyperlink {nsdecls("w")} w:anchor="top"><w:r><w:rPr><w:u w:val="single"/></w:rPr>'
            "<w:t>the first page</w:t></w:r></w:hyperlink>"
        )
    )
    link.add_run(" for more.")
    table = doc.add_table(rows=1, cols=2)
    table.cell(0, 0).text = "One cell"
    table.cell(0, 1).paragraphs[0].add_run("Another cell").underline = True
    doc.sections[0].header.paragraphs[0].text = "The header"
    footer = doc.sections[0].footer.paragraphs[0]
    footer.add_run("Page ")
    for xml in (
        '<w:fldChar w:fldCharType="begin"/>',
        '<w:instrText xml:space="preserve"> PAGE </w:instrText>',
        '<w:fldChar w:fldCharType="separate"/>',
        "<w:t>1</w:t>",
        '<w:fldChar w:fldCharType="end"/>',
    ):
        footer._p.append(parse_xml(f"<w:r {nsdecls('w')}>{xml}</w:r>"))
    footer.add_run(" of the report")
    doc.add_paragraph("")
    doc.add_paragraph("2024")
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def word_parts(data: bytes) -> dict[str, str]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n).decode() for n in z.namelist() if n.startswith("word/") and n.endswith(".xml")}


@pytest.mark.parametrize("fmt", SAMPLES)
def test_identity_translation_gives_the_file_back(fmt):
    data = sample(fmt)
    assert files.translate_file(data, fmt, identity) == data


def test_identity_translation_gives_the_word_file_back():
    data = docx_sample()
    assert word_parts(files.translate_file(data, "docx", identity)) == word_parts(data)


@pytest.mark.parametrize("fmt", ["text", "markdown", "srt", "html"])
def test_line_endings_and_byte_order_mark_are_kept(fmt):
    data = b"\xef\xbb\xbf" + sample(fmt).replace(b"\n", b"\r\n")
    assert files.translate_file(data, fmt, identity) == data


def test_html_without_a_charset_or_byte_order_mark_gets_none():
    data = b"<p>Der <b>gro\xc3\x9fe</b> Hund.</p>\n"
    assert files.translate_file(data, "html", identity) == data


def test_plain_text_uppercased_is_the_file_uppercased():
    data = sample("text")
    assert files.translate_file(data, "text", upper).decode() == data.decode().upper()


OPAQUE = re.compile(r"<(pre|code|kbd|script|style)\b.*?</\1>|<p translate=\"no\">.*?</p>|<!--.*?-->", re.DOTALL)


def upper_text_between_tags(doc: str) -> str:
    """The reference for an uppercasing translator: text between tags uppercased, tags and opaque parts kept."""
    out, at = [], 0
    for m in [*OPAQUE.finditer(doc), None]:
        for j, part in enumerate(re.split(r"(<[^>]*>)", doc[at : m.start() if m else len(doc)])):
            out.append(part if j % 2 else html.escape(html.unescape(part).upper(), quote=False))
        if m:
            out.append(m.group())
            at = m.end()
    return "".join(out)


def test_html_uppercased_changes_text_only():
    data = sample("html").decode()
    out = files.translate_file(data.encode(), "html", upper).decode()
    assert out == upper_text_between_tags(data)
    assert "<code>ls -l</code>" in out and "Brand Name stays too." in out and "ACROSS THE PARK" in out


def markdown_tokens(doc: str):
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    flat = []
    for token in md.parse(doc):
        flat.append((token.type, token.tag, token.markup, token.info, dict(token.attrs)))
        autolink = False
        for child in token.children or []:
            kind = "autolink text" if autolink and child.type == "text" else child.type  # a URL: kept
            flat.append((kind, child.tag, child.markup, child.content, dict(child.attrs)))
            autolink = child.type == "link_open" and child.markup == "autolink"
        if token.type in ("fence", "code_block", "html_block"):
            flat.append(token.content)
    return flat


def test_markdown_uppercased_changes_text_only():
    data = sample("markdown").decode()
    out = files.translate_file(data.encode(), "markdown", upper).decode()
    before, after = markdown_tokens(data), markdown_tokens(out)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        if isinstance(a, tuple) and a[0] in ("text", "image"):  # text (and an image's alt text) is translated
            assert b[:3] == a[:3] and b[3] == a[3].upper() and b[4] == a[4]
        elif isinstance(a, str) and "<div>" in a:
            assert b == upper_text_between_tags(a)
        else:
            assert b == a  # structure, code, links' URLs, emphasis markers
    assert "https://example.com/park" in out and 'print("code stays")' in out and "`loudly`" in out


def test_srt_uppercased_changes_text_only():
    srt = pytest.importorskip("srt")
    data = sample("srt").decode()
    out = files.translate_file(data.encode(), "srt", upper).decode()
    before, after = list(srt.parse(data)), list(srt.parse(out))
    assert [(s.index, s.start, s.end, s.proprietary) for s in after] == [
        (s.index, s.start, s.end, s.proprietary) for s in before
    ]
    for a, b in zip(before, after):
        pieces = re.split(r"(<[^>]*>|\{[^}]*\})", a.content)
        assert b.content == "".join(p if i % 2 else p.upper() for i, p in enumerate(pieces))


def paragraphs(data: bytes):
    """Every paragraph of a Word file (body, tables, headers, footers) as a list of (run format XML, text)."""
    docx = pytest.importorskip("docx")
    from lxml import etree

    doc = docx.Document(io.BytesIO(data))
    parts = [p for p in doc.part.package.iter_parts() if p.content_type in files.WORD_PARTS]
    out = []
    for part in parts:
        for p in part.element.iter(f"{files.W}p"):
            runs = p.iter(f"{files.W}r")
            out.append([(etree.tostring(r.rPr) if r.rPr is not None else b"", r.text) for r in runs])
    return out


def test_word_uppercased_changes_text_only():
    data = docx_sample()
    out = files.translate_file(data, "docx", upper)
    before, after = paragraphs(data), paragraphs(out)
    assert [[f for f, _ in p] for p in after] == [[f for f, _ in p] for p in before]  # the same runs, formats
    assert [[t for _, t in p] for p in after] == [[t.upper() if t != "1" else t for _, t in p] for p in before]
    structure = lambda d: {n: re.sub(r"<w:t(?: [^>]*)?>[^<]*</w:t>", "", x) for n, x in word_parts(d).items()}  # noqa: E731
    assert structure(out) == structure(data)  # everything but the text: fields, bookmarks, links, tables


@pytest.mark.slow
def test_libreoffice_converts_the_translated_word_file(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    pdf = to_pdf(files.translate_file(docx_sample(), "docx", upper), ".docx", tmp_path)
    text = " ".join(page.extract_text() for page in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    assert "IMPORTANT" in text and "THE FIRST PAGE" in text and "important" not in text


def test_word_keeps_the_spaces_at_a_paragraphs_edges_inside_its_runs():
    docx = pytest.importorskip("docx")
    doc = docx.Document()
    p = doc.add_paragraph()
    p.add_run(" Leading").bold = True
    p.add_run(" and trailing ")
    buffer = io.BytesIO()
    doc.save(buffer)
    out = files.translate_file(buffer.getvalue(), "docx", identity)
    assert [t for _, t in paragraphs(out)[0]] == [" Leading", " and trailing "]


def test_word_formatting_follows_its_words_when_they_move():
    data = docx_sample()
    out = files.translate_file(data, "docx", reversed_upper)
    body = paragraphs(out)[1]
    bold = [t for f, t in body if b"<w:b/>" in f]
    italic = [t for f, t in body if b"<w:i/>" in f]
    assert bold == ["IMPORTANT"] and italic == ["WORDS. ITALIC"]
    assert "".join(t for _, t in body).split()[:3] == ["BREAK.", "A", "AFTER"]


def test_markdown_emphasis_follows_its_words_when_they_move():
    out = files.translate_file(b"a **bold** and *it* here\n", "markdown", reversed_upper)
    assert out == b"HERE *IT* AND **BOLD** A\n"


# Openers nothing on the line closes: an HTML comment, a backtick after an escaped one (no lone backtick follows),
# a link title in parentheses. A search for the closer from each of them made the line's time quadratic.
@pytest.mark.serial  # a ratio of two timings: alone, not beside another worker's test
@pytest.mark.parametrize("opener, n", [("<!--", 4000), ("\\``", 3000), ("]( (", 8000)])
def test_a_markdown_line_of_unclosed_openers_parses_in_linear_time(opener, n):
    small, large = ("der Hund " + opener * (k // len(opener)) for k in (n, 8 * n))
    assert best_seconds(files._markdown_line, large, []) < 3 * 8 * best_seconds(
        files._markdown_line, small, []
    )  # not 64x
    items = files._markdown_line(small, [])
    assert files.joined(items) == small
    assert all(len(str(i.raw)) <= len(opener) for i in items if isinstance(i, markup.Tag))  # none closed


def test_markdown_pieces_after_a_code_span_and_link_titles_read_as_commonmark_reads_them():
    def tags(line):
        return [i.raw for i in files._markdown_line(line, []) if isinstance(i, markup.Tag)]

    assert tags("`a <!--` [l](u) -->") == ["`a <!--`", "[", "](u)"]  # a comment opened inside code is no comment
    assert tags("[a](u (t\\(x\\))) b") == ["[", "](u (t\\(x\\)))"]  # escaped parentheses in a title
    assert tags("[a](u (t(x))) b") == ["[", "]"]  # an unescaped one: no link


def test_empty_file_gives_an_empty_file():
    for fmt in files.HANDLERS:
        assert files.translate_file(b"", fmt, identity) == b""


def test_a_word_file_without_text_comes_back_as_it_was():
    docx = pytest.importorskip("docx")
    buffer = io.BytesIO()
    docx.Document().save(buffer)
    data = buffer.getvalue()
    calls = []
    out = files.translate_file(data, "docx", lambda s: calls.append(s) or identity(s))
    assert word_parts(out) == word_parts(data) and calls == []


def zip_of(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, content in entries.items():
            z.writestr(name, content)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "data, fmt, message",
    [
        (b"caf\xe9 au lait", "text", "not UTF-8"),
        (b"# caf\xe9", "markdown", "not UTF-8"),
        (b"this is not a subtitle file\n", "srt", "not a valid SRT"),
        (b"1\n00:00:01,000 -> 00:00:02,000\ntext\n\n", "srt", "not a valid SRT"),
        (b"PK\x03\x04 not really a zip", "docx", "not a zip archive"),
        (zip_of({"hello.txt": b"hello"}), "docx", "not a valid Word"),
        (b'<meta charset="no-such-charset"><p>x</p>', "html", "unknown charset"),
        (b"<p>caf\xe9</p>", "html", "not UTF-8"),
        (b"{\\rtf1 text}", "rtf", "unsupported format"),
    ],
)
def test_bad_files_raise_unsupported_file_with_one_line(data, fmt, message):
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(data, fmt, identity)
    assert "\n" not in str(e.value) and isinstance(e.value, files.FileError) and isinstance(e.value, ValueError)


def test_file_format_comes_from_the_suffix():
    assert [files.file_format(n) for n in ("a.TXT", "b.htm", "c.md", "d.srt", "e.docx")] == [
        "text",
        "html",
        "markdown",
        "srt",
        "docx",
    ]
    for name in ("report.rtf", "noext"):
        with pytest.raises(UnsupportedFile, match="unsupported file type"):
            files.file_format(name)


def test_html_in_another_charset_is_written_back_in_it():
    data = '<meta charset="iso-8859-1"><p>café ☃</p>'.encode("iso-8859-1", errors="xmlcharrefreplace")
    out = files.translate_file(data, "html", upper)
    assert out == '<meta charset="iso-8859-1"><p>CAFÉ ☃</p>'.encode("iso-8859-1", errors="xmlcharrefreplace")


def test_oversized_files_raise_file_too_large_before_any_translation(monkeypatch):
    calls = []
    counting = lambda s: calls.append(s) or identity(s)  # noqa: E731
    data = sample("text")
    with pytest.raises(FileTooLarge, match="characters"):
        files.translate_file(data, "text", counting, max_chars=50)
    monkeypatch.setattr(files, "MAX_FILE_BYTES", len(data) - 1)
    with pytest.raises(FileTooLarge, match=f"limit is {len(data) - 1:,}"):
        files.translate_file(data, "text", counting)
    assert calls == []


def test_a_zip_bomb_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIPPED_BYTES", 1_000_000)
    bomb = zip_of({"word/document.xml": b"\0" * 2_000_000})
    assert len(bomb) < 10_000
    with pytest.raises(FileTooLarge, match="unpacks to 2,000,000 bytes"):
        files.translate_file(bomb, "docx", identity)


def test_media_types_cover_every_format():
    assert set(formats.MEDIA_TYPES) == set(files.HANDLERS) == set(formats.FORMATS.values())


def test_a_file_whose_name_has_no_suffix_is_known_by_its_bytes():
    assert files.file_format("upload", sample("html")) == "html"
    assert files.file_format("upload", sample("srt")) == "srt"
    assert files.file_format("upload", sample("text")) == "text"
    assert files.file_format("upload", zip_of({"word/document.xml": b"<w:document/>"})) == "docx"
    assert files.file_format("upload", zip_of({"ppt/presentation.xml": b"<p/>"})) == "pptx"
    assert files.file_format("upload", zip_of({"xl/workbook.xml": b"<w/>"})) == "xlsx"
    for fmt in ("odt", "odp", "ods", "epub"):
        assert files.file_format("upload", zip_of({"mimetype": formats.MEDIA_TYPES[fmt].encode()})) == fmt
    assert files.file_format("upload", b"%PDF-1.7\n") == "pdf"
    with pytest.raises(UnsupportedFile, match="no format nanomt knows"):
        files.file_format("upload", zip_of({"content.xml": b"<office/>"}))
    with pytest.raises(UnsupportedFile, match="unsupported file type '.rtf'"):
        files.file_format("a.rtf", b"<html><p>x</p>")  # a suffix says what the file is: no guessing past it
