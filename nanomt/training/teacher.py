"""A teacher's translations of source text, the targets a student learns from (sequence-level knowledge distillation,
Kim & Rush 2016), cached beside the student's run and resumable.

Each source file's translations go to their own file, a line each, appended a chunk at a time and flushed to disk, so
a killed process restarts after the last complete line and never translates a line twice. manifest.json records what
made them (each teacher's weights hash, the decoding settings, each source's hash): a cache made otherwise is refused,
never mixed with new lines.
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

from nanomt.core.checkpoint import checkpoint_weights, file_sha256, find_run_files
from nanomt.core.config import load_config
from nanomt.core.decoding import Decoding
from nanomt.core.settings import default_of
from nanomt.decoding.translate import Translator
from nanomt.training.data import file_lines
from nanomt.training.errors import TrainingError

log = logging.getLogger("nanomt")

MANIFEST = "manifest.json"


def manifest(teachers: list[str | Path], sources: list[Path], decoding: Decoding, int8: bool) -> dict:
    """What the translations depend on: the teachers' weights, the decoding, int8, and the sources' bytes."""
    return {
        "teachers": [file_sha256(checkpoint_weights(t, quiet=True)) for t in teachers],
        "decoding": repr(decoding),
        "int8": int8,
        "sources": [file_sha256(s) for s in sources],
    }


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
    ):
        if found.get(key) != wanted[key]:
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


def chunks(source: Path, start: int, size: int) -> Iterator[list[str]]:
    """The source's lines from line `start` (0-based), `size` at a time."""
    lines = itertools.islice(file_lines(source), start, None)
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


def translate_file(
    translator: Translator, decoding: Decoding, source: Path, out: Path, pending: Iterator[list[str]], done: int
) -> int:
    """Translate the `pending` chunks of `source` into `out`, a line each, after the `done` lines an earlier process
    wrote there; returns the lines it translated now."""
    total = done
    start = time.perf_counter()
    with open(out, "a", encoding="utf-8") as f:
        for chunk in pending:
            hyps = translator.translate(chunk, decoding=decoding)
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
) -> list[Path]:
    """The teachers' (one model, or an ensemble) translations of each source file, in out_dir, made or completed
    `chunk_lines` lines at a time (what a kill can lose, and what batching by length sees); decoding: the first
    teacher's decode section where None."""
    for source in sources:
        if not source.is_file():
            raise FileNotFoundError(f"--src {source}: file not found")
        if source.stat().st_size == 0:
            raise TrainingError(f"--src {source}: the file is empty, there is nothing to translate")
    if decoding is None:  # an ensemble decodes with its first member's settings, as Translator does
        decoding = Decoding.from_config(load_config(find_run_files(teachers[0])[0]).decode)
    translator: Translator | None = None
    check_manifest(out_dir, manifest(teachers, sources, decoding, int8))
    outs = [translations_path(out_dir, i, s) for i, s in enumerate(sources)]
    for source, out in zip(sources, outs):
        done = complete_lines(out)
        pending = chunks(source, done, chunk_lines)
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
