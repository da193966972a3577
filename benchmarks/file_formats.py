"""The time per page of every file format nanomt translates: the format's own work (reading, placing the formatting,
writing; a translate function that returns each sentence as it is) and a whole translation by a checkpoint.

    python -m benchmarks.file_formats --checkpoint RUN [--src FILE] [--pages 10]

The documents are made as an office suite makes them: a Word file of `--pages` pages of source sentences (four to a
paragraph, one word of each paragraph bold, a link in each page's first paragraph) written with python-docx, then
converted by LibreOffice (headless) into OpenDocument text, PDF and EPUB; a deck of one slide a page (six sentences
in a text box, a bold word) written with python-pptx, converted into .odp; a sheet of forty text cells a page with
a number beside each written with openpyxl, converted into .ods. The other text formats (plain text, HTML,
Markdown, SRT) hold the same paragraphs. A page is a Word page of 20 sentences, a slide of 6, or 40 cells; each row
says its unit and its sentences. Writes benchmarks/results/file_formats.json (--out).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import limit_threads
from scripts.common import DEFAULT_SRC, RESULTS, machine, relative_paths, shown, training_summary, write_results

SENTENCES_PER_PAGE = {"page": 20, "slide": 6, "sheet page": 40}
UNIT = {"pptx": "slide", "odp": "slide", "xlsx": "sheet page", "ods": "sheet page"}
LINK = "https://example.com/"


def paragraphs(lines: list[str], pages: int) -> list[list[str]]:
    """Four sentences a paragraph, five paragraphs a page."""
    n = SENTENCES_PER_PAGE["page"] * pages
    chosen = [lines[i % len(lines)] for i in range(n)]
    return [chosen[i : i + 4] for i in range(0, n, 4)]


def word_file(paras: list[list[str]]) -> bytes:
    import docx
    from docx.enum.text import WD_BREAK

    doc = docx.Document()
    for i, sentences in enumerate(paras):
        words = " ".join(sentences).split(" ")
        p = doc.add_paragraph(" ".join(words[:3]) + " ")
        p.add_run(words[3]).bold = True
        p.add_run(" " + " ".join(words[4:]))
        if i % 5 == 4:
            p.add_run().add_break(WD_BREAK.PAGE)
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def deck(lines: list[str], slides: int) -> bytes:
    from pptx import Presentation
    from pptx.util import Inches, Pt

    prs = Presentation()
    for k in range(slides):
        slide = prs.slides.add_slide(prs.slide_layouts[6])
        frame = slide.shapes.add_textbox(Inches(0.5), Inches(0.5), Inches(9), Inches(6)).text_frame
        frame.word_wrap = True
        for j in range(SENTENCES_PER_PAGE["slide"]):
            words = lines[(k * 6 + j) % len(lines)].split(" ")
            p = frame.paragraphs[0] if j == 0 else frame.add_paragraph()
            p.add_run().text = " ".join(words[:2]) + " "
            bold = p.add_run()
            bold.text, bold.font.bold = words[2] if len(words) > 2 else "", True
            p.add_run().text = " " + " ".join(words[3:])
            for run in p.runs:
                run.font.size = Pt(16)
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def sheet(lines: list[str], pages: int) -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    for r in range(SENTENCES_PER_PAGE["sheet page"] * pages):
        ws.cell(r + 1, 1, lines[r % len(lines)])
        ws.cell(r + 1, 2, r * 1.5)
    out = io.BytesIO()
    wb.save(out)
    return out.getvalue()


def converted(data: bytes, suffix: str, to: str, work: Path) -> bytes:
    """A file converted by LibreOffice, headless (`to`: its --convert-to filter, e.g. 'odt', 'pdf')."""
    source = work / f"doc{suffix}"
    source.write_bytes(data)
    profile = (work / "profile").as_uri()
    cmd = ["soffice", f"-env:UserInstallation={profile}", "--headless", "--convert-to", to, "--outdir", str(work)]
    subprocess.run([*cmd, str(source)], check=True, capture_output=True, timeout=600)
    return (work / f"doc.{to.split(':')[0]}").read_bytes()


def text_files(paras: list[list[str]]) -> dict[str, bytes]:
    """Plain text, HTML, Markdown and SRT holding the same paragraphs (a bold word and a link in each)."""
    plain = "\n\n".join(" ".join(p) for p in paras) + "\n"
    bolded = [" ".join(p).split(" ", 4) for p in paras]
    html = "".join(
        f"<p>{' '.join(w[:3])} <b>{w[3]}</b> <a href='{LINK}'>{w[4]}</a></p>\n" for w in bolded if len(w) > 4
    )
    md = "".join(f"{' '.join(w[:3])} **{w[3]}** [{w[4]}]({LINK})\n\n" for w in bolded if len(w) > 4)
    cues = [" ".join(p) for p in paras]
    srt = "".join(f"{i + 1}\n00:00:{i % 60:02d},000 --> 00:00:{i % 60:02d},900\n{c}\n\n" for i, c in enumerate(cues))
    return {
        "text": plain.encode(),
        "html": f"<html><body>{html}</body></html>".encode(),
        "markdown": md.encode(),
        "srt": srt.encode(),
    }


def documents(lines: list[str], pages: int, work: Path) -> dict[str, tuple[bytes, int]]:
    """Each format's document and its pages (slides, sheet pages)."""
    paras = paragraphs(lines, pages)
    word = word_file(paras)
    slides, cells = deck(lines, pages), sheet(lines, pages)
    docs = {fmt: (data, pages) for fmt, data in text_files(paras).items()}
    docs["docx"] = (word, pages)
    for fmt, (data, suffix, to) in {
        "odt": (word, ".docx", "odt"),
        "pdf": (word, ".docx", "pdf"),
        "epub": (word, ".docx", "epub"),
        "odp": (slides, ".pptx", "odp"),
        "ods": (cells, ".xlsx", "ods"),
    }.items():
        docs[fmt] = (converted(data, suffix, to, work / fmt), pages)
    docs["pptx"], docs["xlsx"] = (slides, pages), (cells, pages)
    import pypdf  # the PDF's own pages, as LibreOffice laid the Word file out

    docs["pdf"] = (docs["pdf"][0], len(pypdf.PdfReader(io.BytesIO(docs["pdf"][0])).pages))
    return docs


def timed(fn, reps: int) -> float:
    """The best of `reps` wall-clock times of fn() (the first run warms caches and imports)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(docs: dict[str, tuple[bytes, int]], checkpoint: Path | None, reps: int) -> list[dict]:
    """Each format's row: its sentences, the format's own seconds a page and (with a checkpoint) a translation's."""
    model = None
    if checkpoint is not None:
        from nanomt.decoding.translate import Translator
        from nanomt.documents import translation as dt

        translator = Translator.from_checkpoint(checkpoint, int8=True)
        print(f"translating with {checkpoint}: int8, beam {translator.default_decoding.beam_size}", flush=True)
        align, n_best, source = dt.for_translator(translator)
        model = lambda data, fmt: dt.document_file(data, fmt, align, n_best, source, target="en")  # noqa: E731
    rows = []
    for fmt, (data, pages) in docs.items():
        rows.append(measure_one(fmt, data, pages, model, reps))
        print(rows[-1], flush=True)
    return rows


def measure_one(fmt: str, data: bytes, pages: int, model, reps: int) -> dict:
    """One document's row; the format's own work splits sentences as a translation does (German's rules)."""
    from nanomt.documents import files, markup
    from nanomt.documents.sentences import split_sentences

    identity, sentences = markup.plain(list), []
    split = lambda text: split_sentences(text, "de")  # noqa: E731
    files.translate_file(data, fmt, lambda s: sentences.extend(s) or identity(s), split)
    row = {
        "format": fmt,
        "unit": UNIT.get(fmt, "page"),
        "pages": pages,
        "bytes": len(data),
        "sentences": len(sentences),
    }
    own = timed(lambda: files.translate_file(data, fmt, identity, split), reps)
    row["format_seconds_per_page"] = round(own / pages, 4)
    if model is not None:
        row["translate_seconds_per_page"] = round(timed(lambda: model(data, fmt), 1) / pages, 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, help="a run to translate with (int8, its decode section); else none")
    p.add_argument("--src", type=Path, default=DEFAULT_SRC, help="source sentences, one a line")
    p.add_argument("--pages", type=int, default=10)
    p.add_argument("--reps", type=int, default=3, help="timed rounds of the format's own work")
    p.add_argument("--out", type=Path, default=RESULTS / "file_formats.json")
    args = p.parse_args()
    if shutil.which("soffice") is None:
        raise SystemExit("file_formats: LibreOffice (soffice) makes the documents; install libreoffice-writer-nogui")
    limit_threads()
    lines = [line.strip() for line in args.src.read_text(encoding="utf-8").splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for fmt in ("odt", "pdf", "epub", "odp", "ods"):
            (work / fmt).mkdir()
        docs = documents(lines, args.pages, work)
        rows = measure(docs, args.checkpoint, args.reps)
    result = {
        "measures": __doc__.split("\n\n")[1].replace("\n", " "),
        "command": "python -m benchmarks.file_formats "
        + " ".join(
            ([f"--checkpoint {shown(args.checkpoint)}"] if args.checkpoint else []) + [f"--src {shown(args.src)}"]
        ),
        "decoding": "the checkpoint's decode section (beam and length penalty), int8; sentences split for German",
        "checkpoint": None
        if args.checkpoint is None
        else {k: v for k, v in training_summary(args.checkpoint).items() if k != "valid_greedy_bleu_curve"},
        "machine": machine(),
        "rows": rows,
    }
    write_results(args.out, relative_paths(result))


if __name__ == "__main__":
    main()
