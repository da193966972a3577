"""What the Office Open XML formats share. Runs: Word's w:r, DrawingML's a:r (PowerPoint) and SpreadsheetML's r
(Excel) are stretches of a paragraph's text with one formatting, read as markup elements around their text and
written back with the words aligned with them, in the translation's order. Packages: a .pptx or .xlsx read as the
zip it is, its parts found through [Content_Types].xml and their relationships, and the parts that changed written
back (Word is read with python-docx, which does this for it)."""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Callable
from urllib.parse import unquote

from nanomt.documents.file_items import UnsupportedFile, text_items
from nanomt.documents.markup import Item, Tag, Text
from nanomt.documents.zipped import read_member

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


def properties(child) -> bool:
    """Whether a child of a paragraph is its properties (w:pPr, a:pPr, a:endParaRPr): kept where it stands."""
    return isinstance(child.tag, str) and child.tag.endswith("Pr")


def run_items(run, text: str) -> list[Item]:
    """A run as markup: an element around its text."""
    return [Tag("open", run, str(id(run))), *text_items(text), Tag("close", run, str(id(run)))]


def edges(items: list[Item]) -> list[Item]:
    """The items with the spaces before the first word and after the last taken out of their runs, so that
    translation keeps them (it keeps a segment's own edges, not an element's): they go back into the runs that come
    first and last in the translation."""
    lead, out = _spaces(list(items), range(len(items)), str.lstrip)
    trail, out = _spaces(out, range(len(out) - 1, -1, -1), str.rstrip)
    return ([Text(lead)] if lead else []) + out + ([Text(trail)] if trail else [])


def _spaces(items: list[Item], order: range, strip) -> tuple[str, list[Item]]:
    """The spaces at one end of the items (walked in `order`, past runs' tags) and the items without them."""
    taken = []
    for i in order:
        item = items[i]
        if isinstance(item, Tag) and item.kind != "void":
            continue
        if not isinstance(item, Text):
            break
        body = strip(item.text, " ")
        taken.append(" " * (len(item.text) - len(body)))
        items[i] = Text(body)
        if body:
            break
    return "".join(taken), [i for i in items if not (isinstance(i, Text) and not i.text)]


def set_text(t, text: str) -> None:
    """A text element's (a:t's, Excel's t's) new text, with xml:space="preserve" where it starts or ends with space
    (text as it was is left as it was: a file that read well reads the same)."""
    if (t.text or "") == text:
        return
    t.text = text
    if text[:1].isspace() or text[-1:].isspace():
        t.set(XML_SPACE, "preserve")


def write(
    paragraph,
    items: list[Item],
    source: dict,
    set_run_text: Callable[[object, str], None],
    kept: Callable[[object], bool] = properties,
) -> None:
    """Put a paragraph's translated items back: each run (a key of `source`, which holds its text before) gets its
    text, every other element its children in their new order. Children that are `kept` (properties) stay where
    they stood: those before the content stay before it, those after it after it."""
    order, texts, stack = {paragraph: []}, {}, [paragraph]
    loose = Loose(texts, source)
    for item in items:
        top = stack[-1]
        if isinstance(item, Text) or (item.kind == "void" and isinstance(item.raw, str)):
            text = item.text if isinstance(item, Text) else item.raw
            (texts[top] if top in texts else loose.pending).append(text)
        elif item.kind == "open":
            order[top].append(item.raw)
            stack.append(item.raw)
            if item.raw in source:
                texts[item.raw] = []
                loose.settle(item.raw)
            else:
                order[item.raw] = []
        elif item.kind == "close":
            stack.pop()
        else:
            order[top].append(item.raw)
            loose.cross()
    loose.settle(None)
    for run, parts in texts.items():
        set_run_text(run, "".join(parts))
    for element, children in order.items():
        old = list(element)
        lead = next((i for i, c in enumerate(old) if not kept(c)), len(old))
        for child in old[lead:]:
            if not kept(child):
                element.remove(child)
        element[lead:lead] = children


class Loose:
    """Text that falls between runs joins a run beside it, never across a field, bookmark or other void."""

    def __init__(self, texts: dict, source: dict):
        self.texts, self.source = texts, source
        self.pending, self.previous, self.crossed = [], None, False

    def cross(self) -> None:
        """A void: text before it stays with the run before it."""
        if self.pending and self.previous is not None:
            self.texts[self.previous].extend(self.pending)
            self.pending.clear()
        self.crossed = True

    def settle(self, run) -> None:
        """A run starts (None: the paragraph ends): the pending text joins it or the previous run."""
        prev, text = self.previous, "".join(self.pending)
        if text and run is not None and (prev is None or self.crossed or (text.isspace() and self._leans(prev, run))):
            self.texts[run][:0] = self.pending
        elif text and prev is not None:
            self.texts[prev].extend(self.pending)
        self.pending.clear()
        self.previous, self.crossed = prev if run is None else run, False

    def _leans(self, prev, run) -> bool:
        """Whether whitespace between two runs goes to the second: where the source had it on that side, else to a
        run that had whitespace at an edge (plain text) rather than one that hugs its words (a bold word)."""
        before, after = self.source[prev], self.source[run]
        if before[-1:].isspace() or after[:1].isspace():
            return not before[-1:].isspace()
        edged = lambda t: t[:1].isspace() or t[-1:].isspace()  # noqa: E731
        return edged(after) and not edged(before)


# Packages (Open Packaging Conventions).
CONTENT_TYPES = "[Content_Types].xml"
STRICT = "{http://purl.oclc.org/ooxml/"  # Strict Open XML's namespaces start so; Transitional's do not


def namespace(root, transitional: str, strict: str) -> str:
    """`transitional` or `strict` ("{...}", one vocabulary's namespace in either form), as the part's root is."""
    return strict if root.tag.startswith(STRICT) else transitional


class Package:
    """An Office Open XML package: each part's content type, the parts a part relates to, and its XML parts parsed
    (parse errors are one-line UnsupportedFiles), to be written back where they changed."""

    def __init__(self, archive: zipfile.ZipFile, what: str, etree):
        self.archive, self.what, self.etree = archive, what, etree
        self.parser = etree.XMLParser(resolve_entities=False, no_network=True)
        self.trees: dict[str, tuple[object, bytes]] = {}  # name -> (root, serialized as read)
        self.names = {name.lower(): name for name in archive.namelist()}  # part names are case-insensitive
        defaults, overrides = {}, {}
        for entry in self.xml(CONTENT_TYPES):
            kind = etree.QName(entry).localname if isinstance(entry.tag, str) else ""
            if kind == "Default":
                defaults[(entry.get("Extension") or "").lower()] = entry.get("ContentType")
            elif kind == "Override":
                overrides[self._name(entry.get("PartName") or "")] = entry.get("ContentType")
        self.types = {}
        for name in archive.namelist():
            ext = posixpath.splitext(name)[1][1:].lower()
            self.types[name] = overrides.get(name, defaults.get(ext))

    def _name(self, part: str) -> str:
        """A part name (an absolute URI, percent-encoded) as the archive's member name (as given where none is)."""
        name = unquote(part).lstrip("/")
        return self.names.get(name.lower(), name)

    def parts(self, content_types) -> list[str]:
        """The parts of these content types, in the archive's order."""
        return [name for name, kind in self.types.items() if kind in content_types]

    def related(self, part: str, kind: str) -> list[str]:
        """The parts `part` relates to with relationships of this kind (the last segment of their type: "chart")."""
        folder, base = posixpath.split(part)
        rels = posixpath.join(folder, "_rels", base + ".rels")
        if rels.lower() not in self.names:
            return []
        found = []
        for rel in self.xml(self.names[rels.lower()]):
            if not isinstance(rel.tag, str) or rel.get("TargetMode") == "External":
                continue
            if (rel.get("Type") or "").rsplit("/", 1)[-1] != kind:
                continue
            target = rel.get("Target") or ""
            path = target if target.startswith("/") else posixpath.normpath(posixpath.join(folder, target))
            name = self._name(path)
            if name in self.types and name not in found:
                found.append(name)
        return found

    def read(self, name: str) -> bytes:
        return read_member(self.archive, name, self.what)

    def xml(self, name: str):
        """A part's root element, parsed once."""
        if name not in self.trees:
            data = self.read(name)
            try:
                root = self.etree.fromstring(data, self.parser)
            except self.etree.XMLSyntaxError as e:
                message = " ".join((e.msg or "broken XML").split())  # one line: its own may hold a newline
                raise UnsupportedFile(f"not a valid {self.what} file ({name}: {message})") from None
            self.trees[name] = (root, self.etree.tostring(root))
        return self.trees[name][0]

    def changed(self) -> dict[str, bytes]:
        """The parts whose XML changed since they were read, serialized with the declaration they had."""
        out = {}
        for name, (root, before) in self.trees.items():
            if self.etree.tostring(root) == before:
                continue
            info = root.getroottree().docinfo
            out[name] = self.etree.tostring(
                root.getroottree(), xml_declaration=True, encoding=info.encoding or "UTF-8", standalone=info.standalone
            )
        return out
