"""A teacher's translations of source text, the targets a student learns from (sequence-level knowledge distillation,
Kim & Rush 2016), cached beside the student's run and resumable. Where the source has references (the training
corpus's target side), each line's target is instead the hypothesis of the teacher's n-best list closest to its
reference by sentence BLEU: Kim & Rush's sequence-level interpolation, the teacher's output nearest the truth.

Each source file's translations go to their own file, a line each, appended a chunk at a time and flushed to disk, so
a killed process restarts after the last complete line and never translates a line twice. manifest.json records what
made them (each teacher's weights hash, the decoding settings, each source's and reference's hash): a cache made
otherwise is refused, never mixed with new lines.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from sacrebleu.metrics import BLEU

from nanomt.core.checkpoint import checkpoint_weights, file_sha256, find_run_files
from nanomt.core.config import load_config
from nanomt.core.decoding import Decoding
from nanomt.core.settings import default_of
from nanomt.decoding.translate import Translator
from nanomt.training.data import file_lines
from nanomt.training.errors import TrainingError

log = logging.getLogger("nanomt")

MANIFEST = "manifest.json"


def manifest(
    teachers: list[str | Path], sources: list[Path], decoding: Decoding, int8: bool, references: list[Path] | None
) -> dict:
    """What the translations depend on: the teachers' weights, the decoding, int8, the sources' bytes, and the
    references' where the targets are chosen by them (absent otherwise)."""
    made = {
        "teachers": [file_sha256(checkpoint_weights(t, quiet=True)) for t in teachers],
        "decoding": repr(decoding),
        "int8": int8,
        "sources": [file_sha256(s) for s in sources],
    }
    return made | ({"references": [file_sha256(r) for r in references]} if references else {})


def translations_path(out_dir: Path, index: int, source: Path) -> Path:
    """Where the translations of the index-th source file go (its name kept, for whoever reads the folder)."""
    return out_dir / f"{index}.{source.name}.translated"


def check_manifest(out_dir: Path, wanted: dict) -> None:
    """Write the manifest of a new cache; refuse one that another teacher, decoding or source made."""
    path = out_dir / MANIFEST
    if not path.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")
        return
    found = json.loads(path.read_text(encoding="utf-8"))
    for key, what in (
        ("teachers", "another teacher's weights"),
        ("decoding", "other decoding settings"),
        ("int8", "another precision (--int8)"),
        ("sources", "other source files"),
        ("references", "other references (--ref)"),
    ):
        if found.get(key) != wanted.get(key):
            raise TrainingError(
                f"{out_dir} holds translations made with {what} ({key} differ); give the student another --run-dir "
                "or delete that folder"
            )


def complete_lines(path: Path, block: int = 1 << 20) -> int:
    """The complete lines of a translations file, cut back to the last newline (a kill mid-write leaves a part);
    read a block at a time, as the file may hold millions of lines."""
    if not path.is_file():
        return 0
    lines = end = offset = 0
    with open(path, "r+b") as f:
        while data := f.read(block):
            lines += data.count(b"\n")
            last = data.rfind(b"\n")
            if last >= 0:
                end = offset + last + 1
            offset += len(data)
        if end != offset:
            f.truncate(end)
    return lines


def chunks(source: Path, reference: Path | None, start: int, size: int) -> Iterator[tuple[list[str], list[str] | None]]:
    """The source's lines from line `start` (0-based), `size` at a time, each chunk with its reference lines (None
    without a reference)."""
    lines = itertools.islice(file_lines(source), start, None)
    refs = itertools.islice(file_lines(reference), start, None) if reference else None
    while chunk := list(itertools.islice(lines, size)):
        yield chunk, list(itertools.islice(refs, len(chunk))) if refs else None


def check_references(sources: list[Path], references: list[Path]) -> None:
    """A reference file for each source file, line for line."""
    if len(references) != len(sources):
        raise TrainingError(f"--ref: {len(references)} files for {len(sources)} --src files; give one for each")
    for source, reference in zip(sources, references):
        if not reference.is_file():
            raise FileNotFoundError(f"--ref {reference}: file not found")
        n_src, n_ref = (sum(1 for _ in file_lines(p)) for p in (source, reference))
        if n_src != n_ref:
            raise TrainingError(f"--ref {reference} has {n_ref} lines but --src {source} has {n_src}")


def closest(n_best: list[list[tuple[str, float]]], references: list[str]) -> list[str]:
    """Each sentence's hypothesis with the highest sentence BLEU against its reference (the teacher's own best among
    equals), as Kim & Rush's sequence-level interpolation chooses its targets."""
    bleu = BLEU(effective_order=True)
    return [max(hyps, key=lambda h: bleu.sentence_score(h[0], [ref]).score)[0] for hyps, ref in zip(n_best, references)]


def translate_file(
    translator: Translator,
    decoding: Decoding,
    source: Path,
    out: Path,
    pending: Iterator[tuple[list[str], list[str] | None]],
    done: int,
) -> int:
    """Translate the `pending` chunks of `source` into `out`, a line each (the n-best hypothesis closest to the
    reference where a chunk has references), after the `done` lines an earlier process wrote there; returns the
    lines it translated now."""
    total = done
    start = time.perf_counter()
    with open(out, "a", encoding="utf-8") as f:
        for chunk, refs in pending:
            if refs is None:
                hyps = translator.translate(chunk, decoding=decoding)
            else:
                hyps = closest(translator.translate_n_best(chunk, decoding=decoding), refs)
            f.write("".join(" ".join(h.split()) + "\n" for h in hyps))  # one line each, whatever the model wrote
            f.flush()
            os.fsync(f.fileno())
            total += len(chunk)
            rate = (total - done) / max(time.perf_counter() - start, 1e-9)
            log.info("%s: %d lines translated (%.0f lines/s)", source.name, total, rate)
    if done:
        log.info("%s: %d lines were translated already, %d now", source.name, done, total - done)
    return total - done


def teacher_translations(
    teachers: list[str | Path],
    sources: list[Path],
    out_dir: Path,
    chunk_lines: int,
    decoding: Decoding | None = None,
    int8: bool = False,
    device: str = "cpu",
    references: list[Path] | None = None,
) -> list[Path]:
    """The teachers' (one model, or an ensemble) translations of each source file, in out_dir, made or completed
    `chunk_lines` lines at a time (what a kill can lose, and what batching by length sees); decoding: the first
    teacher's decode section where None. With `references` (a file for each source), each target is the hypothesis
    of the teachers' whole beam (n_best = beam_size) closest to its reference."""
    for source in sources:
        if not source.is_file():
            raise FileNotFoundError(f"--src {source}: file not found")
    if decoding is None:  # an ensemble decodes with its first member's settings, as Translator does
        decoding = Decoding.from_config(load_config(find_run_files(teachers[0])[0]).decode)
    if references:
        check_references(sources, references)
        if decoding.beam_size < 2:
            raise TrainingError("--ref chooses among the teacher's beam: give --beam 2 or more")
        decoding = decoding.replace(n_best=decoding.beam_size)
    translator: Translator | None = None
    check_manifest(out_dir, manifest(teachers, sources, decoding, int8, references))
    outs = [translations_path(out_dir, i, s) for i, s in enumerate(sources)]
    for k, (source, out) in enumerate(zip(sources, outs)):
        done = complete_lines(out)
        pending = chunks(source, references[k] if references else None, done, chunk_lines)
        first = next(pending, None)
        if first is None:  # every line translated already
            continue
        if translator is None:  # loaded only when something is left to translate
            translator = Translator.from_checkpoints(teachers, device=device, int8=int8)
        log.info("translating %s with %s (%s)", source, ", ".join(map(str, teachers)), describe(decoding))
        translate_file(translator, decoding, source, out, itertools.chain([first], pending), done)
    return outs


def describe(decoding: Decoding) -> str:
    """The decoding settings that differ from the defaults, for the log."""
    values = ((f.name, getattr(decoding, f.name), default_of(f)) for f in dataclasses.fields(decoding))
    return ", ".join(f"{name} {value}" for name, value, default in values if value != default) or "default decoding"
