"""PowerPoint (.pptx): every slide's text (shapes, tables, grouped shapes), the speaker notes and the charts' titles
translated, runs keeping their formatting and links; slide layouts, masters, pictures and every other part kept
byte for byte."""

# A DrawingML paragraph (a:p) holds its properties (a:pPr) first, then runs (a:r: a:rPr, then the text in a:t), line
# breaks (a:br) and fields (a:fld: the slide number, the date), then the end's properties (a:endParaRPr). A run is an
# element around its words, so its formatting, and a link (a:hlinkClick sits in the run's a:rPr), follows them; a
# break is a spacing void and a field a void kept whole. Layouts and masters are not translated: their text is the
# prompts of empty placeholders ("Click to add title"), not the deck's. A chart's title and its axes' titles are
# translated where they are text of their own (c:tx/c:rich); series and category names are cells of the chart's
# workbook and stay as they are, as do the workbook and SmartArt diagrams.

from __future__ import annotations

from nanomt.documents import markup, runs
from nanomt.documents.file_items import FileJob, UnsupportedFile, library
from nanomt.documents.markup import Item, Tag
from nanomt.documents.zipped import open_zip, rewrite_zip

WHAT = "PowerPoint .pptx"
PML = "application/vnd.openxmlformats-officedocument.presentationml."
PRESENTATIONS = frozenset(
    [PML + f"{kind}.main+xml" for kind in ("presentation", "slideshow", "template")]
    + [
        f"application/vnd.ms-powerpoint.{kind}.macroEnabled.main+xml"
        for kind in ("presentation", "slideshow", "template")
    ]
)
SLIDE, NOTES = PML + "slide+xml", PML + "notesSlide+xml"
# Each vocabulary's namespace, Transitional and Strict.
DRAWING = ("{http://schemas.openxmlformats.org/drawingml/2006/main}", "{http://purl.oclc.org/ooxml/drawingml/main}")
PRESENTATION = (
    "{http://schemas.openxmlformats.org/presentationml/2006/main}",
    "{http://purl.oclc.org/ooxml/presentationml/main}",
)
CHART = ("{http://schemas.openxmlformats.org/drawingml/2006/chart}", "{http://purl.oclc.org/ooxml/drawingml/chart}")
# Placeholders of a notes page that are not the notes: the slide's picture, its number, the header, footer and date.
NOT_NOTES = frozenset({"sldImg", "sldNum", "hdr", "ftr", "dt"})


def _paragraph_items(p, a: str) -> tuple[list[Item], dict]:
    """A paragraph's content as items, and each run's text (its a:t's)."""
    items, source = [], {}
    for child in p:
        if runs.properties(child):
            continue
        if child.tag == f"{a}r" and all(c.tag in (f"{a}rPr", f"{a}t") for c in child):
            text = child.findtext(f"{a}t") or ""
            items += runs.run_items(child, text)
            source[child] = text
        else:
            items.append(Tag("void", child, space=child.tag == f"{a}br"))
    return runs.edges(items), source


def _run_text(a: str):
    """What writes a run's text into its a:t."""

    def write(run, text: str) -> None:
        t = run.find(f"{a}t")
        if t is None:
            t = run.makeelement(f"{a}t", {})
            run.append(t)
        runs.set_text(t, text)

    return write


def _set_language(p, a: str, target: str) -> None:
    """The target language on a translated paragraph's runs and its end (a run without properties gets them)."""
    for run in p.iterchildren(f"{a}r"):
        props = run.find(f"{a}rPr")
        if props is None:
            props = run.makeelement(f"{a}rPr", {})
            run.insert(0, props)
        props.set("lang", target)
    end = p.find(f"{a}endParaRPr")
    if end is not None:
        end.set("lang", target)


def _slide_paragraphs(root, a: str) -> list:
    return list(root.iter(f"{a}p"))


def _notes_paragraphs(root, a: str) -> list:
    """The notes' paragraphs: the body placeholder's (and any text box's), not the slide number's or the header's."""
    p = runs.namespace(root, *PRESENTATION)
    out = []
    for shape in root.iter(f"{p}sp"):
        ph = shape.find(f"{p}nvSpPr/{p}nvPr/{p}ph")
        if ph is None or ph.get("type") not in NOT_NOTES:
            out += shape.iter(f"{a}p")
    return out


def _chart_paragraphs(root, a: str) -> list:
    """A chart's title and its axes' titles, where they are text of their own."""
    c = runs.namespace(root, *CHART)
    return [
        p for title in root.iter(f"{c}title") for rich in title.iterfind(f"{c}tx/{c}rich") for p in rich.iter(f"{a}p")
    ]


def translate_pptx(data: bytes, job: FileJob) -> bytes:
    """PowerPoint (.pptx): slides, speaker notes and chart titles translated; the language set to job.target."""
    etree = library("pptx")
    with open_zip(data, job.unzipped, WHAT) as archive:
        package = runs.Package(archive, WHAT, etree)
        if not package.parts(PRESENTATIONS):
            raise UnsupportedFile(f"not a valid {WHAT} file (no presentation in {runs.CONTENT_TYPES})")
        slides = package.parts({SLIDE})
        charts = list(dict.fromkeys(chart for slide in slides for chart in package.related(slide, "chart")))
        paragraphs = []  # (paragraph, its DrawingML namespace)
        for names, find in (
            (slides, _slide_paragraphs),
            (package.parts({NOTES}), _notes_paragraphs),
            (charts, _chart_paragraphs),
        ):
            for name in names:
                root = package.xml(name)
                a = runs.namespace(root, *DRAWING)
                paragraphs += [(p, a) for p in find(root, a)]
        read = [_paragraph_items(p, a) for p, a in paragraphs]
        done = markup.translate_segments([items for items, _ in read], job.translate, job.split)
        for (p, a), (_, source), items in zip(paragraphs, read, done):
            if items is None:
                continue
            runs.write(p, items, source, _run_text(a))
            if job.target:
                _set_language(p, a, job.target)
        changed = package.changed()
        return rewrite_zip(archive, changed) if changed else data
