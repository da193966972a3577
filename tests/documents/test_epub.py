"""EPUB e-books: the spine's chapters translated as XHTML (well-formed XML, tags on their words), the navigation
document, styles, pictures and metadata but its language kept byte for byte; bad books refused in one line."""

import io
import re
import zipfile

import pytest
from test_files import identity, reversed_upper, upper

from nanomt.documents import epub, files, markup
from nanomt.documents.files import FileError, FileTooLarge, UnsupportedFile

etree = pytest.importorskip("lxml.etree")

CONTAINER = b"""<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles>
    <rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>
  </rootfiles>
</container>
"""

OPF = """<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="{version}" unique-identifier="uid" xml:lang="en">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:opf="http://www.idpf.org/2007/opf">
    <dc:identifier id="uid">urn:uuid:0f3c1b9e-8a47-4a8e-9d7e-2f6f2b1c5a10</dc:identifier>
    <dc:title>A Walk in the Park</dc:title>
    <dc:creator>N. Author</dc:creator>
    <dc:language>en</dc:language>
    <meta property="dcterms:modified">2024-05-01T12:00:00Z</meta>
  </metadata>
  <manifest>
    <item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="css" href="style.css" media-type="text/css"/>
    <item id="dog" href="images/dog.png" media-type="image/png"/>
    <item id="map" href="images/map.svg" media-type="image/svg+xml"/>
    <item id="one" href="text/chapter%201.xhtml" media-type="application/xhtml+xml"/>
    <item id="two" href="text/chapter2.xhtml" media-type="application/xhtml+xml"/>
  </manifest>
  <spine toc="ncx">
    <itemref idref="nav" linear="no"/>
    <itemref idref="one"/>
    <itemref idref="map"/>
    <itemref idref="two"/>
  </spine>
</package>
"""

NAV = b"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" lang="en" xml:lang="en">
<head><title>Contents</title></head>
<body>
  <nav epub:type="toc" id="toc"><h1>Contents</h1>
    <ol>
      <li><a href="text/chapter%201.xhtml">The dog</a></li>
      <li><a href="text/chapter2.xhtml">What it likes</a></li>
    </ol>
  </nav>
</body>
</html>
"""

NCX = b"""<?xml version="1.0" encoding="UTF-8"?>
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1" xml:lang="en">
  <head><meta name="dtb:uid" content="urn:uuid:0f3c1b9e-8a47-4a8e-9d7e-2f6f2b1c5a10"/></head>
  <docTitle><text>A Walk in the Park</text></docTitle>
  <navMap>
    <navPoint id="p1" playOrder="1"><navLabel><text>The dog</text></navLabel>
      <content src="text/chapter%201.xhtml"/></navPoint>
    <navPoint id="p2" playOrder="2"><navLabel><text>What it likes</text></navLabel>
      <content src="text/chapter2.xhtml"/></navPoint>
  </navMap>
</ncx>
"""

CSS = b"body { font-family: serif; }\nb { color: #802020; }\ntable, td, th { border: 1px solid black; }\n"

SVG = b"""<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="100" height="50"><text x="5" y="25">The park</text></svg>
"""

# Chapter 1: a heading, a bold word and a link mid-sentence, a no-break space, a picture inside a sentence.
CHAPTER_1 = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" lang="en" xml:lang="en">
<head>
  <title>The dog</title>
  <link rel="stylesheet" type="text/css" href="../style.css"/>
</head>
<body>
  <h1 id="c1">The dog</h1>
  <p>The <b>brown</b> dog runs across <a href="chapter2.xhtml#likes">the park</a> every day.</p>
  <p>It weighs 30&#160;kg and sleeps <img src="../images/dog.png" alt="A dog asleep"/> after lunch.</p>
</body>
</html>
"""

# Chapter 2: a list and a table; its <html> has no language.
CHAPTER_2 = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE html>
<html xmlns="http://www.w3.org/1999/xhtml">
<head><title>What it likes</title></head>
<body>
  <h2 id="likes">What it likes</h2>
  <ul>
    <li>Long walks</li>
    <li>Green <i>tennis</i> balls</li>
  </ul>
  <table>
    <tr><th>Day</th><th>Walks</th></tr>
    <tr><td>Monday</td><td>2</td></tr>
  </table>
</body>
</html>
"""

ONE, TWO, OPF_NAME = "OEBPS/text/chapter 1.xhtml", "OEBPS/text/chapter2.xhtml", "OEBPS/content.opf"
CHAPTERS = (ONE, TWO)


def png() -> bytes:
    image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    image.new("RGB", (8, 6), (200, 120, 40)).save(buffer, "PNG")
    return buffer.getvalue()


def members(changed: dict[str, bytes | None] | None = None, version: str = "3.0") -> dict[str, bytes]:
    """The book's members in order (mimetype first), with `changed` ones given new bytes (None: left out)."""
    entries = {
        "mimetype": b"application/epub+zip",
        "META-INF/container.xml": CONTAINER,
        OPF_NAME: OPF.format(version=version).encode(),
        "OEBPS/nav.xhtml": NAV,
        "OEBPS/toc.ncx": NCX,
        "OEBPS/style.css": CSS,
        "OEBPS/images/dog.png": png(),
        "OEBPS/images/map.svg": SVG,
        ONE: CHAPTER_1.encode(),
        TWO: CHAPTER_2.encode(),
    }
    for name, value in (changed or {}).items():
        if value is None:
            del entries[name]
        else:
            entries[name] = value
    return entries


def book(entries: dict[str, bytes] | None = None) -> bytes:
    """An EPUB as a reader wants it: mimetype first and stored, everything else deflated."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, content in (entries or members()).items():
            z.writestr(name, content, zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def read(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def text_uppercased(doc: str) -> str:
    """The reference for an uppercasing translator: text between tags uppercased (the numeric character reference
    stays one), tags, the XML declaration and the doctype kept."""
    return "".join(p if i % 2 else p.upper() for i, p in enumerate(re.split(r"(<[^>]*>)", doc)))


def test_identity_gives_the_book_back():
    data = book()
    assert read(files.translate_file(data, "epub", identity)) == read(data)


def test_uppercased_changes_the_chapters_text_only():
    data = book()
    out = read(files.translate_file(data, "epub", upper))
    assert out[ONE].decode() == text_uppercased(CHAPTER_1)
    assert out[TWO].decode() == text_uppercased(CHAPTER_2)
    assert "RUNS ACROSS" in out[ONE].decode() and "30&#160;KG" in out[ONE].decode()
    assert "<li>GREEN <i>TENNIS</i> BALLS</li>" in out[TWO].decode()
    assert {n: b for n, b in out.items() if n not in CHAPTERS} == {
        n: b for n, b in read(data).items() if n not in CHAPTERS
    }


def test_tags_follow_their_words_when_they_move():
    out = read(files.translate_file(book(), "epub", reversed_upper))
    one, two = out[ONE].decode(), out[TWO].decode()
    assert '<p>DAY. EVERY <a href="chapter2.xhtml#likes">PARK THE</a> ACROSS RUNS DOG <b>BROWN</b> THE</p>' in one
    assert '<p>LUNCH. AFTER <img src="../images/dog.png" alt="A dog asleep"/> SLEEPS AND KG 30 WEIGHS IT</p>' in one
    assert "<li>BALLS <i>TENNIS</i> GREEN</li>" in two and "<th>WALKS</th>" in two
    for name in CHAPTERS:
        etree.fromstring(out[name])


def test_the_target_language_goes_into_the_metadata_and_every_chapter():
    data = book()
    out = read(files.translate_file(data, "epub", upper, target="de"))
    opf = out[OPF_NAME]
    assert b"<dc:language>de</dc:language>" in opf
    assert opf.replace(b"<dc:language>de</dc:language>", b"<dc:language>en</dc:language>") == read(data)[OPF_NAME]
    xml_lang = "{http://www.w3.org/XML/1998/namespace}lang"
    for name in CHAPTERS:
        html = etree.fromstring(out[name])
        assert html.get("lang") == html.get(xml_lang) == "de"
    assert out[ONE].decode() == text_uppercased(CHAPTER_1).replace('lang="en" xml:lang="en"', 'lang="de" xml:lang="de"')
    assert '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="de" lang="de">' in out[TWO].decode()
    assert out["OEBPS/nav.xhtml"] == NAV and out["OEBPS/toc.ncx"] == NCX  # the navigation stays as it was


def test_every_other_member_keeps_its_bytes_place_and_compression():
    data = book()
    out = files.translate_file(data, "epub", reversed_upper, target="fr")
    before, after = read(data), read(out)
    assert list(after) == list(before)
    for name in ("mimetype", "META-INF/container.xml", "OEBPS/nav.xhtml", "OEBPS/toc.ncx", "OEBPS/style.css"):
        assert after[name] == before[name]
    assert after["OEBPS/images/dog.png"] == png() and after["OEBPS/images/map.svg"] == SVG  # an SVG in the spine
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        infos = z.infolist()
    assert infos[0].filename == "mimetype" and infos[0].compress_type == zipfile.ZIP_STORED
    assert out[30:58] == b"mimetypeapplication/epub+zip"  # where a reader sniffs it, as the OCF requires
    assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in infos[1:])


def test_every_translated_chapter_is_well_formed_xml():
    out = read(files.translate_file(book(), "epub", reversed_upper, target="de"))
    for name in CHAPTERS:
        root = etree.fromstring(out[name])
        assert root.tag == "{http://www.w3.org/1999/xhtml}html"
    assert "&nbsp;" not in out[ONE].decode()


# Inline elements that cross a run's ends (an <i> around a <br/>): two of them between words, which the translation
# swaps. Placed alone as markup places them, </i> would follow <b>; cut apart, each keeps its place.
CROSSING = """<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Poem</title></head>
<body><p><i>one line<br/>two words</i> and then <b>three more<br/>four</b></p></body></html>
"""


def test_inline_elements_around_line_breaks_stay_well_formed_when_words_move():
    broken = markup.translate_html([CROSSING], reversed_upper)[0]
    with pytest.raises(etree.XMLSyntaxError):
        etree.fromstring(broken.encode())  # markup's HTML path alone would cross them
    out = read(files.translate_file(book(members({TWO: CROSSING.encode()})), "epub", reversed_upper))
    etree.fromstring(out[TWO])
    assert "<p><i>LINE ONE<br/>WORDS TWO</i> THEN AND <b>MORE THREE<br/>FOUR</b></p>" in out[TWO].decode()


def test_the_whole_book_is_translated_in_one_call_that_progress_counts():
    calls, heard = [], []
    counting = lambda s: calls.append(len(s)) or identity(s)  # noqa: E731
    files.translate_file(book(), "epub", counting, progress=lambda done, total: heard.append((done, total)))
    assert len(calls) == 1 and heard[0] == (0, calls[0]) and heard[-1] == (calls[0], calls[0])
    assert calls[0] == 11  # 2 titles, 2 headings, 2 paragraphs, 2 items, 4 cells but "2"


def test_a_no_break_space_and_characters_xml_forbids_are_written_as_xml():
    out = read(files.translate_file(book(), "epub", markup.plain(lambda s: [t + "\x0b\xa0&" for t in s])))
    for name in CHAPTERS:
        etree.fromstring(out[name])
    assert " day.&#160;&amp;</p>" in out[ONE].decode() and "\x0b" not in out[ONE].decode()


def test_a_body_with_a_language_gets_the_target_too():
    chapter = CHAPTER_2.replace("<body>", '<body xml:lang="en" class="x">').encode()
    out = read(files.translate_file(book(members({TWO: chapter})), "epub", identity, target="de"))
    assert '<body xml:lang="de" class="x">' in out[TWO].decode()


def test_a_chapter_that_was_xml_and_would_not_be_is_refused(monkeypatch):
    monkeypatch.setattr(epub, "_cut", lambda part: [part])  # markup's runs as they are: the crossing tags cross
    with pytest.raises(FileError, match="chapter2.xhtml is not well-formed XML") as e:
        files.translate_file(book(members({TWO: CROSSING.encode()})), "epub", reversed_upper)
    assert "\n" not in str(e.value)


def test_an_epub_2_chapter_without_a_language_gets_xml_lang_only():
    out = read(files.translate_file(book(members(version="2.0")), "epub", identity, target="de"))
    assert '<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="de">' in out[TWO].decode()


def test_utf16_chapters_are_written_back_in_utf16():
    chapter = CHAPTER_2.replace('encoding="UTF-8"', 'encoding="UTF-16"').encode("utf-16")
    out = read(files.translate_file(book(members({TWO: chapter})), "epub", upper))
    assert out[TWO] == text_uppercased(CHAPTER_2.replace('encoding="UTF-8"', 'encoding="UTF-16"')).encode("utf-16")


def test_an_epub_from_the_command_line_format_table_is_sniffed():
    assert files.file_format("book", book()) == "epub" and files.file_format("a.epub") == "epub"


ENCRYPTION = b"""<?xml version="1.0" encoding="UTF-8"?>
<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" xmlns:enc="http://www.w3.org/2001/04/xmlenc#">
  <enc:EncryptedData><enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>
    <enc:CipherData><enc:CipherReference URI="OEBPS/text/chapter2.xhtml"/></enc:CipherData></enc:EncryptedData>
</encryption>
"""


def with_encryption() -> bytes:
    entries = members()
    entries = {**dict(list(entries.items())[:2]), "META-INF/encryption.xml": ENCRYPTION, **entries}
    return book(entries)


@pytest.mark.parametrize(
    "data, message",
    [
        (lambda: b"PK\x03\x04 not really a zip", "not a zip archive"),
        (lambda: book(members({"mimetype": b"application/zip"})), "its mimetype is 'application/zip'"),
        (lambda: book(members({"mimetype": None})), r"no mimetype"),
        (lambda: book(members({"META-INF/container.xml": None})), "no META-INF/container.xml"),
        (lambda: book(members({"META-INF/container.xml": b"<container/>"})), "names no package document"),
        (lambda: book(members({OPF_NAME: None})), "no OEBPS/content.opf"),
        (lambda: book(members({OPF_NAME: b"<package>"})), r"OEBPS/content.opf: .*line 1"),
        (lambda: book(members({TWO: None})), "spine's OEBPS/text/chapter2.xhtml is not in"),
        (lambda: book(members({"OEBPS/images/map.svg": None})), "spine's OEBPS/images/map.svg is not in"),
        (
            lambda: book(members({OPF_NAME: OPF.format(version="3.0").replace('idref="two"', 'idref="x"').encode()})),
            "'x', not in the manifest",
        ),
        (with_encryption, r"chapter2.xhtml is encrypted \(DRM\)"),
        (lambda: book(members({TWO: b"<p>caf\xe9</p>"})), "chapter2.xhtml is not utf-8 text"),
    ],
)
def test_bad_books_raise_unsupported_file_with_one_line(data, message):
    with pytest.raises(UnsupportedFile, match=message) as e:
        files.translate_file(data(), "epub", identity)
    assert "\n" not in str(e.value) and isinstance(e.value, FileError)


def test_a_zip_bomb_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr(files, "MAX_UNZIPPED_BYTES", 1_000_000)
    bomb = book(members({"OEBPS/style.css": b" " * 2_000_000}))
    assert len(bomb) < 10_000
    with pytest.raises(FileTooLarge, match="the EPUB file unpacks to 2,0") as e:
        files.translate_file(bomb, "epub", identity)
    assert "\n" not in str(e.value)


def test_a_chapter_that_is_not_well_formed_is_translated_as_html():
    chapter = b"<html><body><p>A dog&nbsp;runs.<br></p></body></html>"
    out = read(files.translate_file(book(members({TWO: chapter})), "epub", upper))
    assert out[TWO] == b"<html><body><p>A DOG&#160;RUNS.<br></p></body></html>"


def test_the_handler_is_the_registered_one():
    assert files.HANDLERS["epub"] is epub.translate_epub


def test_the_translated_book_reads_back_whole():
    """Read again from the start (container, package, spine, every chapter), the translated book is itself."""
    out = files.translate_file(book(), "epub", reversed_upper, target="de")
    assert read(files.translate_file(out, "epub", identity)) == read(out)
    assert files.file_format("translated", out) == "epub"


# LibreOffice (7.4) cannot open an EPUB: its EPUB filter only exports ("source file could not be loaded"). Each
# translated chapter is opened alone instead, as XHTML in Writer/Web, and printed to PDF.
PDF_TEXT = {ONE: ["ACROSS RUNS DOG BROWN THE", "SLEEPS AND KG 30 WEIGHS IT"], TWO: ["BALLS TENNIS GREEN", "MONDAY"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_libreoffice_opens_each_translated_chapter(name, tmp_path):
    from office import to_pdf

    pypdf = pytest.importorskip("pypdf")
    out = read(files.translate_file(book(), "epub", reversed_upper, target="de"))
    pdf = pypdf.PdfReader(io.BytesIO(to_pdf(out[name], ".xhtml", tmp_path)))
    words = " ".join(" ".join(page.extract_text().split()) for page in pdf.pages)
    for expected in PDF_TEXT[name]:
        assert expected in words
