"""OpenDocument (.odt text, .odp presentations, .ods spreadsheets): every paragraph and heading translated with its
spans, links and fields in place; spreadsheets' numbers, dates and formulas kept; the western language tags set to
the target; every other member of the archive byte for byte as it was."""

# A paragraph (text:p, text:h) is mixed content: text, then inline elements with their tails. A span or a link is an
# element whose words follow the alignment, as an HTML inline tag does; spaces, tabs and line breaks are voids that
# keep their place as whitespace; anything else (a picture, a field, a bookmark, a note, a comment, a text box) is a
# void kept whole. A paragraph inside such a void (a footnote's, a text box's, a comment's) is a segment of its own,
# translated once: the void holds the same element, so neither write undoes the other.

from __future__ import annotations

import re

from nanomt.documents import markup
from nanomt.documents.file_items import FileJob, UnsupportedFile, library, text_items
from nanomt.documents.formats import BY_NAME, MEDIA_TYPES
from nanomt.documents.markup import Item, Tag, Text
from nanomt.documents.zipped import open_zip, read_member, rewrite_zip

NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "dc": "http://purl.org/dc/elements/1.1/",
}
OFFICE, STYLE, TEXT, TABLE = (f"{{{NS[p]}}}" for p in ("office", "style", "text", "table"))
FO, DC, SVG, PRESENTATION = (f"{{{NS[p]}}}" for p in ("fo", "dc", "svg", "presentation"))

# The elements translated: paragraphs and headings; a presentation's header and footer text; pictures' and shapes'
# titles and descriptions (their alternative text), where they hold text only.
PARAGRAPHS = (f"{TEXT}p", f"{TEXT}h")
PLAIN = (f"{PRESENTATION}header-decl", f"{PRESENTATION}footer-decl", f"{SVG}title", f"{SVG}desc")
# Inline elements whose words follow the alignment (they may hold further inline content).
CONTAINERS = frozenset({f"{TEXT}span", f"{TEXT}a", f"{TEXT}meta"})
# Voids that stand for whitespace: a run of spaces, a tab, a line break.
SPACES = frozenset({f"{TEXT}s", f"{TEXT}tab", f"{TEXT}line-break"})
CELLS = frozenset({f"{TABLE}table-cell", f"{TABLE}covered-table-cell"})
UNTRANSLATED = frozenset({f"{TEXT}tracked-changes"})  # deleted text, kept for the record: never shown
# Ranges, marked by a start and an end element (the attribute naming them): they follow their words as a span does.
RANGES = {
    f"{TEXT}bookmark-start": (f"{TEXT}bookmark-end", f"{TEXT}name"),
    f"{TEXT}reference-mark-start": (f"{TEXT}reference-mark-end", f"{TEXT}name"),
    f"{TEXT}alphabetical-index-mark-start": (f"{TEXT}alphabetical-index-mark-end", f"{TEXT}id"),
    f"{TEXT}toc-mark-start": (f"{TEXT}toc-mark-end", f"{TEXT}id"),
    f"{TEXT}user-index-mark-start": (f"{TEXT}user-index-mark-end", f"{TEXT}id"),
    f"{TEXT}change-start": (f"{TEXT}change-end", f"{TEXT}change-id"),
    f"{OFFICE}annotation": (f"{OFFICE}annotation-end", f"{OFFICE}name"),  # a comment on a range of words
}
RANGE_ENDS = dict(RANGES.values())
MAX_NESTING = markup.MAX_DEPTH // 2  # spans nested deeper are kept whole (markup would unpair them)
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # characters XML 1.0 cannot hold


def translate_odt(data: bytes, job: FileJob) -> bytes:
    """OpenDocument text (.odt): the body (tables, lists, text frames, footnotes, comments) and the master pages'
    headers and footers."""
    return _translate(data, job, "odt")


def translate_odp(data: bytes, job: FileJob) -> bytes:
    """OpenDocument presentation (.odp): the slides' text boxes and shapes, the speaker notes, the master pages'
    text, and the slides' header and footer texts."""
    return _translate(data, job, "odp")


def translate_ods(data: bytes, job: FileJob) -> bytes:
    """OpenDocument spreadsheet (.ods): text cells, comments on them, shapes, and the master pages' headers and
    footers; a cell with a formula or a value that is not text (number, date, time, percentage, currency, boolean)
    is never touched, nor are the sheets' names (formulas refer to them)."""
    return _translate(data, job, "ods")


def _translate(data: bytes, job: FileJob, fmt: str) -> bytes:
    what = BY_NAME[fmt].title
    archive = open_zip(data, job.unzipped, what)
    etree = library(fmt)
    _check_media_type(archive, fmt, what)
    manifest = "META-INF/manifest.xml"
    if manifest in archive.NameToInfo and b"encryption-data" in read_member(archive, manifest, what):
        raise UnsupportedFile(f"the {what} file is encrypted (saved with a password); save it without one first")
    parts = {"content.xml": _parse(etree, read_member(archive, "content.xml", what), "content.xml", what)}
    for name in ("styles.xml", "meta.xml"):
        if name in archive.NameToInfo:
            parts[name] = _parse(etree, read_member(archive, name, what), name, what)
    if parts["content.xml"].getroot().tag != f"{OFFICE}document-content":
        raise UnsupportedFile(f"not a valid {what} file (content.xml holds no document content)")
    elements = _translatable(parts["content.xml"].getroot(), f"{OFFICE}body")
    if "styles.xml" in parts:
        elements += _translatable(parts["styles.xml"].getroot(), f"{OFFICE}master-styles")
    segments = []
    for element in elements:
        items: list[Item] = []
        _items(element, items, 0)
        segments.append(items)
    done = markup.translate_segments(segments, job.translate, job.split)
    changed = set()
    for element, items in zip(elements, done):
        if items is not None:
            _write(element, items)
            changed.add(_part_of(element, parts))
    if job.target is not None:
        changed |= _set_language(parts, job.target)
    if not changed:  # nothing to translate: the file as it came
        return data
    return rewrite_zip(archive, {name: _serialize(etree, parts[name]) for name in changed})


def _check_media_type(archive, fmt: str, what: str) -> None:
    """The archive's `mimetype` names the format (or its template); another OpenDocument type, or none, is refused."""
    found = read_member(archive, "mimetype", what).decode("ascii", "replace").strip()
    if found in (MEDIA_TYPES[fmt], MEDIA_TYPES[fmt] + "-template"):
        return
    other = next((f for f, media_type in MEDIA_TYPES.items() if found in (media_type, media_type + "-template")), None)
    if other is not None:
        raise UnsupportedFile(f"the file is an {BY_NAME[other].title} (.{other}), not an {what} (.{fmt})")
    shown = found if len(found) <= 80 else found[:77] + "..."
    raise UnsupportedFile(f"not a valid {what} file (its mimetype is {shown!r})")


def _parse(etree, data: bytes, name: str, what: str):
    """A member's XML as a tree (namespace declarations and prefixes kept as they were); no entity is expanded, no
    DTD or network read."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    try:
        return etree.fromstring(data, parser).getroottree()
    except etree.XMLSyntaxError as e:
        raise UnsupportedFile(f"not a valid {what} file ({name}: {' '.join(str(e).split())})") from None


def _serialize(etree, tree) -> bytes:
    """A tree as its member's bytes: UTF-8, with the declaration LibreOffice writes."""
    standalone = ' standalone="yes"' if tree.docinfo.standalone else ""  # lxml: False where none was declared
    return f'<?xml version="1.0" encoding="UTF-8"{standalone}?>\n'.encode() + etree.tostring(tree, encoding="UTF-8")


def _translatable(root, scope: str) -> list:
    """The elements under `scope` translated, in document order: paragraphs and headings, except those in a cell
    with a formula or a value that is not text and those of deleted text; plain text elements."""
    out = []
    for container in root.iter(scope):
        for element in container.iter(*PARAGRAPHS, *PLAIN):
            if element.tag in PLAIN and len(element):
                continue
            if not any(_untouched(a) for a in element.iterancestors()):
                out.append(element)
    return out


def _untouched(element) -> bool:
    """Whether what an element holds is kept as it is: deleted text, or a cell with a formula or a value type other
    than string (or none)."""
    if element.tag in CELLS:
        return element.get(f"{TABLE}formula") is not None or element.get(f"{OFFICE}value-type", "string") != "string"
    return element.tag in UNTRANSLATED


def _part_of(element, parts: dict) -> str:
    root = element.getroottree().getroot()
    return next(name for name, tree in parts.items() if tree.getroot() is root)


def _items(parent, items: list[Item], depth: int) -> None:
    """An element's mixed content as items: its text, then each child (an element around its words, a range's start
    or end, or a void) and the text after it."""
    if parent.text:
        items += text_items(parent.text)
    pairs, opened = _ranges(parent), set()
    for child in parent:
        if child.tag in CONTAINERS and depth + len(opened) < MAX_NESTING:
            name = str(id(child))
            items.append(Tag("open", child, name))
            _items(child, items, depth + len(opened) + 1)
            items.append(Tag("close", child, name))
        elif child in pairs and child.tag in RANGES and depth + len(opened) < MAX_NESTING:
            opened.add(child)
            items.append(Tag("open", child, str(id(child))))
        elif child in pairs and pairs[child] in opened:
            opened.discard(pairs[child])
            items.append(Tag("close", child, str(id(pairs[child]))))
        else:  # comments and processing instructions too: kept where they stood
            items.append(Tag("void", child, space=child.tag in SPACES))
        if child.tail:
            items += text_items(child.tail)


def _ranges(parent) -> dict:
    """The starts and ends of ranges (bookmarks, index marks, tracked insertions, comments) among an element's
    children, each mapped to its other end; a range whose ends are not siblings is left out (its ends are voids)."""
    pairs, started = {}, {}
    for child in parent:
        if child.tag in RANGES:
            end, key = RANGES[child.tag]
            started.setdefault((end, child.get(key)), []).append(child)
        elif child.tag in RANGE_ENDS and started.get((child.tag, child.get(RANGE_ENDS[child.tag]))):
            start = started[child.tag, child.get(RANGE_ENDS[child.tag])].pop()
            pairs[start], pairs[child] = child, start
    return pairs


def _write(element, items: list[Item]) -> None:
    """Put an element's translated items back: each container gets the words placed in it, as its text and its
    children's tails; children keep their attributes and content, in their new order; a range's start and end go
    into the container around them, with the words placed between them."""
    content, stack = {element: []}, [element]
    for item in items:
        top = stack[-1]
        if isinstance(item, Text) or isinstance(item.raw, str):  # text, or whitespace kept as it was
            content[top].append(item.text if isinstance(item, Text) else item.raw)
        elif item.kind == "open":
            content[top].append(item.raw)
            if item.raw.tag in RANGES:
                stack.append(top)
            else:
                content[item.raw] = []
                stack.append(item.raw)
        elif item.kind == "close":
            stack.pop()
            if item.raw.tag in RANGE_ENDS:
                content[stack[-1]].append(item.raw)
        else:
            content[top].append(item.raw)
    for parent, parts in content.items():
        for child in list(parent):
            parent.remove(child)
        parent.text, last, pending = None, None, []
        for part in [*parts, None]:
            if isinstance(part, str):
                pending.append(part)
                continue
            text = NOT_XML.sub("", "".join(pending)) or None
            if last is None:
                parent.text = text
            else:
                last.tail = text
            if part is not None:
                parent.append(part)
                last, pending = part, []


# The target language's code as OpenDocument's western language tags: fo:language, fo:country ("none" without a
# region, as LibreOffice writes it), fo:script and style:rfc-language-tag (with a script only).
LANGUAGE_CODE = re.compile(
    r"(?P<language>[A-Za-z]{2,8})(?:[-_](?P<script>[A-Za-z]{4}))?(?:[-_](?P<region>[A-Za-z]{2}|\d{3}))?"
)
NO_LANGUAGE = frozenset({"zxx"})  # text marked as no language (code, names) stays so
DEFAULT_FAMILIES = frozenset({"paragraph", "graphic", "table-cell"})  # default styles that set a document's language


def _language_attributes(target: str) -> tuple[str, dict[str, str | None]] | None:
    """The target as a language tag (pt-BR) and the attributes it sets (None: removed), or None for a code that is
    no language tag."""
    m = LANGUAGE_CODE.fullmatch(target.strip())
    if m is None:
        return None
    script, region = m["script"], m["region"]
    tag = "-".join(p for p in (m["language"].lower(), script and script.title(), region and region.upper()) if p)
    return tag, {
        f"{FO}language": m["language"].lower(),
        f"{FO}country": region.upper() if region else "none",
        f"{FO}script": script.title() if script else None,
        f"{STYLE}rfc-language-tag": tag if script else None,
    }


def _set_language(parts: dict, target: str) -> set[str]:
    """Set the target language in the styles' text properties and in meta.xml; the parts changed."""
    found = _language_attributes(target)
    if found is None:
        return set()
    tag, attributes = found
    changed = set()
    for name in ("content.xml", "styles.xml"):
        if name not in parts:
            continue
        root = parts[name].getroot()
        for default in root.iter(f"{STYLE}default-style"):
            if default.get(f"{STYLE}family") in DEFAULT_FAMILIES and default.find(f"{STYLE}text-properties") is None:
                default.append(default.makeelement(f"{STYLE}text-properties", {}))
        for properties in root.iter(f"{STYLE}text-properties"):
            style = properties.getparent()
            default = style.tag == f"{STYLE}default-style" and style.get(f"{STYLE}family") in DEFAULT_FAMILIES
            language = properties.get(f"{FO}language")
            if language in NO_LANGUAGE or not (default or language is not None or f"{FO}country" in properties.attrib):
                continue
            for key, value in attributes.items():
                if value is not None:
                    properties.set(key, value)
                else:
                    properties.attrib.pop(key, None)
            changed.add(name)
    meta = parts.get("meta.xml")
    office_meta = meta.getroot().find(f"{OFFICE}meta") if meta is not None else None
    if office_meta is not None:
        element = office_meta.find(f"{DC}language")
        if element is None:
            declared = NS["dc"] in office_meta.nsmap.values()
            element = office_meta.makeelement(f"{DC}language", {}, nsmap=None if declared else {"dc": NS["dc"]})
            office_meta.append(element)
        element.text = tag
        changed.add("meta.xml")
    return changed
