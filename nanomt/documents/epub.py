"""EPUB e-books: a zip of XHTML chapters, read with the standard library and lxml (EbookLib is AGPL).

META-INF/container.xml names the package document (the OPF); its spine lists the chapters in reading order, its
manifest says where each is and what it is. Every XHTML chapter of the spine is translated by markup's HTML path, the
whole book in one call (so that progress counts the book's sentences), and written back as well-formed XML (a no-break
space as &#160;, which XHTML defines, not &nbsp;). The navigation document, toc.ncx, pictures, fonts, styles and every
other member keep their bytes, and so does the metadata but for its language: where a target is given, dc:language
becomes it, and so do each chapter's lang and xml:lang on <html> (and on <body>, where it has them)."""

from __future__ import annotations

import codecs
import posixpath
import re
from urllib.parse import unquote, urlsplit

from nanomt.documents import markup
from nanomt.documents.file_items import FileError, FileJob, UnsupportedFile, library
from nanomt.documents.markup import Item, Tag, Text
from nanomt.documents.zipped import open_zip, read_member, rewrite_zip

WHAT = "EPUB"
MEDIA_TYPE = "application/epub+zip"
CONTAINER = "META-INF/container.xml"
ENCRYPTION = "META-INF/encryption.xml"
CONTAINER_NS = "{urn:oasis:names:tc:opendocument:xmlns:container}"
OPF_NS = "{http://www.idpf.org/2007/opf}"
DC_NS = "{http://purl.org/dc/elements/1.1/}"
ENC_NS = "{http://www.w3.org/2001/04/xmlenc#}"
PACKAGE_TYPE = "application/oebps-package+xml"
XHTML_TYPE = "application/xhtml+xml"
# Font obfuscation (IDPF's, Adobe's) hides fonts, not text: a book that uses it is translated.
OBFUSCATION = frozenset({"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"})

XML_ENCODING = re.compile(rb"""\A<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# What XML 1.0 allows in a document; anything else a model writes is left out.
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# What may come before a start tag without being one: comments, CDATA, processing instructions, the doctype, scripts.
SKIPPED = (
    r"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<\?.*?\?>|<!DOCTYPE(?:[^>\[]|\[.*?\])*>"
    r"|<(?P<raw>script|style)\b.*?</(?P=raw)\s*>"
)
ATTRIBUTE = re.compile(r"""(\s+)([^\s=/>]+)(\s*=\s*)("[^"]*"|'[^']*')""")
LANGUAGE_ATTRIBUTES = ("lang", "xml:lang")


def translate_epub(data: bytes, job: FileJob) -> bytes:
    """An EPUB (2 or 3) with its spine's XHTML chapters translated and every other member's bytes kept."""
    with open_zip(data, job.unzipped, WHAT) as archive:
        etree = library("epub")
        mimetype = read_member(archive, "mimetype", WHAT).decode("ascii", "replace").strip()
        if mimetype != MEDIA_TYPE:
            raise UnsupportedFile(f"not a valid EPUB file (its mimetype is {mimetype[:60]!r}, not {MEDIA_TYPE})")
        opf_name = _package_name(etree, archive)
        opf = read_member(archive, opf_name, WHAT)
        package = _parse(etree, opf, opf_name)
        chapters = _chapters(package, opf_name, set(archive.namelist()))
        _refuse_encrypted(etree, archive, chapters)
        sources = {name: read_member(archive, name, WHAT) for name in chapters}
        decoded = {name: _decode(source, name) for name, source in sources.items()}
        translated = translate_xhtml([text for text, _ in decoded.values()], job)
        epub3 = package.get("version", "").strip().startswith("3")
        replaced = {}
        for (name, (_, encoding)), doc in zip(decoded.items(), translated):
            if job.target:
                doc = _chapter_language(doc, job.target, ("xml:lang", "lang") if epub3 else ("xml:lang",))
            out = _encode(doc, encoding)
            # A chapter that was XML stays XML (one that was not, HTML a reader may still take, is written as it reads).
            if _xml_error(etree, sources[name]) is None and (error := _xml_error(etree, out)) is not None:
                raise FileError(f"the translation of the EPUB's {name} is not well-formed XML ({error})")
            replaced[name] = out
        if job.target:
            replaced[opf_name] = _package_language(package, opf, opf_name, job.target)
        return rewrite_zip(archive, replaced)


def _xml_root(etree, data: bytes):
    """The root element of XML bytes, read with no DTD loaded, no entity expanded and nothing fetched."""
    return etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False))


def _parse(etree, data: bytes, name: str):
    """A member's XML root, or a one-line UnsupportedFile naming it."""
    try:
        return _xml_root(etree, data)
    except etree.XMLSyntaxError as e:
        raise UnsupportedFile(f"not a valid EPUB file ({name}: {_first_line(e)})") from None


def _xml_error(etree, data: bytes) -> str | None:
    """Why the bytes are not well-formed XML, or None where they are."""
    try:
        _xml_root(etree, data)
    except etree.XMLSyntaxError as e:
        return _first_line(e)
    return None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _package_name(etree, archive) -> str:
    """The package document's name in the archive, from META-INF/container.xml's (first OPF) rootfile."""
    container = _parse(etree, read_member(archive, CONTAINER, WHAT), CONTAINER)
    rootfiles = [r for r in container.iter(f"{CONTAINER_NS}rootfile") if r.get("full-path")]
    opf = [r for r in rootfiles if r.get("media-type") == PACKAGE_TYPE] or rootfiles
    if not opf:
        raise UnsupportedFile(f"not a valid EPUB file ({CONTAINER} names no package document)")
    return opf[0].get("full-path")


def _chapters(package, opf_name: str, names: set[str]) -> list[str]:
    """The archive names of the spine's XHTML content documents in reading order, each once, the navigation document
    left out; an UnsupportedFile where the spine names something the manifest or the archive lacks."""
    if package.tag != f"{OPF_NS}package":
        raise UnsupportedFile(f"not a valid EPUB file ({opf_name} is not a package document)")
    manifest, spine = package.find(f"{OPF_NS}manifest"), package.find(f"{OPF_NS}spine")
    if manifest is None or spine is None:
        lacking = "manifest" if manifest is None else "spine"
        raise UnsupportedFile(f"not a valid EPUB file ({opf_name} has no {lacking})")
    items = {item.get("id"): item for item in manifest.iter(f"{OPF_NS}item")}
    chapters = []
    for ref in spine.iter(f"{OPF_NS}itemref"):
        item = items.get(ref.get("idref"))
        if item is None:
            raise UnsupportedFile(f"not a valid EPUB file (its spine names {ref.get('idref')!r}, not in the manifest)")
        href = urlsplit(item.get("href", ""))
        if href.scheme or href.netloc:  # a remote resource: nothing in the archive to translate
            continue
        name = posixpath.normpath(posixpath.join(posixpath.dirname(opf_name), unquote(href.path)))
        if name not in names:
            raise UnsupportedFile(f"not a valid EPUB file (its spine's {name} is not in the archive)")
        nav = "nav" in item.get("properties", "").split()
        if item.get("media-type", "").strip() == XHTML_TYPE and not nav and name not in chapters:
            chapters.append(name)
    return chapters


def _refuse_encrypted(etree, archive, chapters: list[str]) -> None:
    """An UnsupportedFile where META-INF/encryption.xml encrypts a chapter (DRM); obfuscated fonts are no matter."""
    if ENCRYPTION not in archive.namelist():
        return
    encryption = _parse(etree, read_member(archive, ENCRYPTION, WHAT), ENCRYPTION)
    for data in encryption.iter(f"{ENC_NS}EncryptedData"):
        method = data.find(f"{ENC_NS}EncryptionMethod")
        if method is not None and method.get("Algorithm") in OBFUSCATION:
            continue
        for ref in data.iter(f"{ENC_NS}CipherReference"):
            name = posixpath.normpath(unquote(ref.get("URI", "")))
            if name in chapters:
                raise UnsupportedFile(f"the EPUB's {name} is encrypted (DRM): nanomt translates unencrypted books only")


def _decode(data: bytes, name: str) -> tuple[str, tuple[str, bytes]]:
    """An XML member's text and how to write it back: (its encoding, its byte order mark)."""
    bom, encoding = next(((b, e) for b, e in BOMS if data.startswith(b)), (b"", None))
    if encoding is None:
        declared = XML_ENCODING.match(data)
        encoding = declared.group(1).decode("ascii") if declared else "utf-8"
    try:
        return data[len(bom) :].decode(encoding), (encoding, bom)
    except LookupError:
        raise UnsupportedFile(f"the EPUB's {name} declares an unknown encoding {encoding!r}") from None
    except UnicodeDecodeError as e:
        raise UnsupportedFile(f"the EPUB's {name} is not {encoding} text (invalid byte at offset {e.start})") from None


def _encode(text: str, how: tuple[str, bytes]) -> bytes:
    encoding, bom = how
    return bom + text.encode(encoding, errors="xmlcharrefreplace")  # characters the encoding lacks become &#...;


def translate_xhtml(docs: list[str], job: FileJob) -> list[str]:
    """XHTML documents translated sentence by sentence with their inline tags put back (markup.translate_html, all
    documents in one call), written as XML: &, < and > escaped, a no-break space as &#160;."""
    parts = lambda doc: [p for part in markup.html_parts(doc) for p in _cut(part)]  # noqa: E731
    return markup.translate_html(docs, job.translate, job.split, parts, _xml_text)


def _xml_text(item: Item) -> str:
    """An item of a translated run as XML: its tag as it was, or its text escaped, what XML forbids left out."""
    if isinstance(item, Tag):
        return str(item.raw)
    text = NOT_XML.sub("", item.text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\xa0", "&#160;")


def _cut(part: str | tuple[list[Item], str]) -> list[str | tuple[list[Item], str]]:
    """A run of inline content, cut at the tags of elements that cross its ends (an <i> around a <br/>) where two or
    more of them stand between its words. Such a tag is kept where it stood but placed alone, like a void; two of
    them whose words the translation swaps would cross (</i> after <b>): cut apart, each keeps its place."""
    if isinstance(part, str):
        return [part]
    items, raw = part
    balanced = markup.balance(items)
    worded = [k for k, item in enumerate(items) if isinstance(item, Text) and markup.WORD.search(item.text)]
    between = range(worded[0] + 1, worded[-1]) if worded else range(0)
    crossing = [k for k in between if isinstance(items[k], Tag) and items[k].kind != balanced[k].kind]
    if len(crossing) < 2:
        return [part]
    spans, at = {}, 0  # each tag's place in the run's raw text (text between tags holds no tag)
    for k, item in enumerate(items):
        if isinstance(item, Tag):
            start = raw.find(item.raw, at)
            if start < 0:
                return [part]
            spans[k] = (start, start + len(item.raw))
            at = start + len(item.raw)
    out, first, at = [], 0, 0
    for k in crossing:
        start, end = spans[k]
        if k > first:
            out.append((items[first:k], raw[at:start]))
        out.append(raw[start:end])
        first, at = k + 1, end
    return [*out, (items[first:], raw[at:])]


def _attribute_value(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;").replace("'", "&apos;")


def _start_tag(doc: str, name: str) -> re.Match | None:
    """The first start tag of element `name` that no comment, CDATA section, doctype or script holds."""
    tag = rf"<{name}(?=[\s/>])(?:\s+[^\s=/>]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*\s*/?>"
    for m in re.finditer(rf"{SKIPPED}|(?P<tag>{tag})", doc, re.DOTALL):
        if m.group("tag"):
            return m
    return None


def _set_language(tag: str, name: str, value: str, added: tuple[str, ...]) -> str:
    """A start tag with its lang and xml:lang set to value; where it has neither, `added` are added."""
    out, at, found = [tag[: len(name) + 1]], len(name) + 1, False
    while m := ATTRIBUTE.match(tag, at):
        if m.group(2) in LANGUAGE_ATTRIBUTES:
            quote = m.group(4)[0]
            out.append(f"{m.group(1)}{m.group(2)}{m.group(3)}{quote}{_attribute_value(value)}{quote}")
            found = True
        else:
            out.append(m.group())
        at = m.end()
    if not found:
        out += [f' {attribute}="{_attribute_value(value)}"' for attribute in added]
    return "".join(out) + tag[at:]


def _chapter_language(doc: str, target: str, added: tuple[str, ...]) -> str:
    """A chapter with <html>'s language set to target (`added` where it has none), and <body>'s where it has one."""
    for name, add in (("html", added), ("body", ())):
        m = _start_tag(doc, name)
        if m is not None:
            doc = doc[: m.start()] + _set_language(m.group(), name, target, add) + doc[m.end() :]
    return doc


def _package_language(package, opf: bytes, opf_name: str, target: str) -> bytes:
    """The package document with the text of each dc:language set to target, every other byte as it was."""
    text, encoding = _decode(opf, opf_name)
    for prefix in {element.prefix for element in package.iter(f"{DC_NS}language")}:
        name = re.escape(f"{prefix}:language" if prefix else "language")
        element = re.compile(rf"<!--.*?-->|(?P<open><{name}(?:\s[^>]*)?>)[^<]*(?P<close></{name}\s*>)", re.DOTALL)
        text = element.sub(lambda m: m["open"] + _attribute_value(target) + m["close"] if m["open"] else m[0], text)
    return _encode(text, encoding)
