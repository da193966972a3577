"""PDF: each text block translated in its place. pdfminer.six reads the text blocks (their boxes, lines, size, font,
colour and reading order, a column before the next; pdf_text), pypdf takes the text out of each page's content stream
(pdf_clean: paths, images, shadings, clipping stay) and reportlab draws the translations on an overlay page merged
over it (pdf_draw: each block's text fitted to its box, shrunk where it is longer). The pages keep their boxes,
rotation, annotations and links; the catalog's /Lang becomes the target language. Each paragraph of a block is a
segment, and the whole file is translated in one call.

What is lost: formatting inside a block (a bold word in a sentence: a block is drawn in one font, bold where its
first line mostly was), the original fonts (a standard font of the same kind stands in), the fine layout of what
pdfminer puts in one block (a formula's sub- and superscripts, a table's cells it joined: lines are rewrapped), the
tagged structure (/StructTreeRoot described the original text and is dropped: a reader reads the new text in its
drawn order), and encryption (a file that opens without a password is written unencrypted). Text at an angle other
than a multiple of 90 degrees (a diagonal watermark), vertical text, and the text of annotations and form fields stay
as they were, untranslated.

Refused, in one line: a file that is not a PDF, one encrypted with a password, one with pages that have no text
layer (scanned: no text, mostly images) or whose text has no Unicode values (fonts without a map): those need OCR."""

from __future__ import annotations

import io

from nanomt.documents import markup
from nanomt.documents.file_items import FileError, FileJob, UnsupportedFile, joined, library
from nanomt.documents.markup import Text
from nanomt.documents.pdf_clean import Cleaner, page_matrix
from nanomt.documents.pdf_draw import overlay
from nanomt.documents.pdf_text import Page, read_pages

SCANNED_COVER = 0.5  # a page without text whose images cover this share of it is a scanned page
UNREADABLE = 0.1  # a page whose characters are this share without Unicode values has no usable text layer
SHOWN_PAGES = 10  # the most page numbers an error names
ORPHAN_DEPTH = 6  # resources -> Type0 font -> descendants -> CID font -> descriptor -> font file


def translate_pdf(data: bytes, job: FileJob) -> bytes:
    """A PDF's text blocks translated, each drawn in its place (see the module's docstring)."""
    pypdf = library("pdf", "pypdf")
    writer = _open(data, pypdf)
    cleaner = Cleaner(writer, job.unzipped)
    for page in writer.pages:  # first: it bounds what the content streams unpack to before pdfminer reads them
        try:
            cleaner.page(page, page_matrix(tuple(float(v) for v in page.mediabox), page.rotation))
        except FileError:
            raise
        except Exception as e:  # pypdf raises many kinds on a broken content stream
            raise UnsupportedFile(f"not a valid PDF file (page {_number(writer, page)}: {_line(e)})") from None
    pages = _read(data, len(writer.pages))
    _check_text_layer(pages)
    segments = [[Text(p.text)] for page in pages for block in page.blocks for p in block.paragraphs]
    done = iter(markup.translate_segments(segments, job.translate, job.split))
    texts = []
    for page in pages:
        texts.append([])
        for block in page.blocks:
            paragraphs = [next(done) for _ in block.paragraphs]
            untranslated = all(p is None for p in paragraphs)
            texts[-1].append(
                None if untranslated else [_text(items, p.text) for items, p in zip(paragraphs, block.paragraphs)]
            )
    drawn = pypdf.PdfReader(io.BytesIO(overlay(pages, texts, job.target)))
    for page, layer, read in zip(writer.pages, drawn.pages, pages):
        if read.blocks:
            layer.mediabox = page.mediabox
            layer.cropbox = page.mediabox
            page.merge_page(layer)
        page.compress_content_streams()  # pypdf writes the cleaned content uncompressed
    root = writer.root_object
    for key in ("/StructTreeRoot", "/MarkInfo"):
        root.pop(key, None)
    if job.target:
        root[pypdf.generic.NameObject("/Lang")] = pypdf.generic.TextStringObject(job.target)
    for _ in range(ORPHAN_DEPTH):  # the fonts no page uses now go (each call drops one layer: font, descriptor, file)
        writer.compress_identical_objects()
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _text(items, source: str) -> str:
    return source if items is None else " ".join(joined(items).split())


def _line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _number(writer, page) -> int:
    return next((i + 1 for i, p in enumerate(writer.pages) if p is page), 0)


def _open(data: bytes, pypdf):
    """The file as a PdfWriter to change, or an UnsupportedFile: not a PDF, or encrypted with a password."""
    if b"%PDF-" not in data[:1024]:
        raise UnsupportedFile("not a valid PDF file (no %PDF- header)")
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnsupportedFile("the PDF file is encrypted with a password: decrypt it first (qpdf --decrypt)")
        writer = pypdf.PdfWriter(clone_from=reader)
        if not len(writer.pages):
            raise UnsupportedFile("not a valid PDF file (it has no pages)")
        return writer
    except FileError:
        raise
    except pypdf.errors.DependencyError as e:
        raise UnsupportedFile(f"the PDF file is encrypted in a way that needs another package ({_line(e)})") from None
    except Exception as e:  # pypdf raises many kinds on a broken file
        raise UnsupportedFile(f"not a valid PDF file ({_line(e)})") from None


def _read(data: bytes, count: int) -> list[Page]:
    """pdfminer's reading of every page (as many as pypdf found), or an UnsupportedFile saying why it cannot."""
    try:
        pages = read_pages(io.BytesIO(data))
    except FileError:
        raise
    except Exception as e:  # pdfminer raises many kinds on a broken file (PDFSyntaxError, PSEOF, KeyError, ...)
        raise UnsupportedFile(f"not a valid PDF file (pdfminer: {_line(e)})") from None
    if len(pages) != count:
        raise UnsupportedFile(f"not a valid PDF file (its page tree holds {count} pages, its objects {len(pages)})")
    return pages


def _check_text_layer(pages: list[Page]) -> None:
    """Refuse a file with scanned pages (no text, mostly images) or pages whose text has no Unicode values."""
    scanned = [i + 1 for i, p in enumerate(pages) if not p.chars and p.image_area >= SCANNED_COVER * _area(p)]
    unreadable = [i + 1 for i, p in enumerate(pages) if p.chars and p.undefined > UNREADABLE * p.chars]
    with_content = [p for p in pages if p.chars or p.image_area]
    if scanned and len(scanned) == len(with_content):
        raise UnsupportedFile("the PDF file has no text layer (scanned?): run OCR first, e.g. ocrmypdf")
    if scanned:
        raise UnsupportedFile(
            f"{_pages(scanned)} of the PDF file {'have' if len(scanned) > 1 else 'has'} no text "
            "layer (scanned?): run OCR first, e.g. ocrmypdf --skip-text"
        )
    if unreadable:
        raise UnsupportedFile(
            f"{_pages(unreadable)} of the PDF file {'have' if len(unreadable) > 1 else 'has'} text "
            "whose fonts give no Unicode values: run OCR first, e.g. ocrmypdf --force-ocr"
        )


def _area(page: Page) -> float:
    return max(1e-9, page.width * page.height)


def _pages(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:SHOWN_PAGES]))
    more = f" and {len(numbers) - SHOWN_PAGES} more" if len(numbers) > SHOWN_PAGES else ""
    return f"page{'s' if len(numbers) > 1 else ''} {shown}{more}"
