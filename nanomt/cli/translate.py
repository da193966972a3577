"""`nanomt translate`: lines streamed through the model in bounded chunks, paragraphs (--split), files (--format).

A chunk of --buffer-size lines is read, sorted by length into batches, translated and written in input order before
the next is read, so memory holds one chunk whatever the input's size (fairseq's --buffer-size, CTranslate2's
read_batch_size).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from nanomt.cli import models


def translate(args: argparse.Namespace) -> None:
    """`nanomt translate`: options checked, the model loaded, the input translated with the flags' Decoding."""
    check_modes(args)  # refused before the model is loaded
    translator, decoding = models.translator_and_decoding(args)
    if args.confidence and translator.calibration is None:
        print(
            f"nanomt translate: warning: {' '.join(args.checkpoints)} has no calibration: the second column is the raw "
            "score (the mean log-probability of the tokens); nanomt calibrate fits one",
            file=sys.stderr,
        )
    if args.format:
        translate_file(args, translator, decoding)
    else:
        translate_lines(args, translator, decoding)


def check_modes(args: argparse.Namespace) -> None:
    """Refuse, in one line, options that do not combine (before the model is loaded)."""
    if args.buffer_size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {args.buffer_size}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    whole = "--format" if args.format else "--split" if args.split else None
    n_best = args.n_best or 1
    if whole and n_best > 1:
        raise ValueError(f"--n-best lists one sentence's hypotheses; it does not combine with {whole}")
    if whole and args.prefix_file:
        raise ValueError(f"--prefix-file forces one sentence's start; it does not combine with {whole}")
    if args.confidence and (n_best > 1 or args.format):
        raise ValueError(f"--confidence gives one line a translation; it does not combine with "
                         f"{'--format' if args.format else '--n-best'}")  # fmt: skip
    if args.format and args.split:
        raise ValueError("--format translates a whole file, sentence by sentence already: leave out --split")
    if args.format == "docx" and not args.output and sys.stdout.isatty():
        raise ValueError("--format docx writes a binary file: give --output FILE (or redirect stdout)")
    for path, flag in ((args.input, "--input"), (args.prefix_file, "--prefix-file")):
        if path and Path(path).is_dir():
            raise ValueError(f"{flag} {path} is a directory; give a file")
        if path and not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: file not found")
    if args.output:  # refused before hours of translating, not at the end
        final = Path(os.path.realpath(args.output))
        if final.is_dir():
            raise ValueError(f"--output {args.output} is a directory; give a file")
        if not final.parent.is_dir():
            raise FileNotFoundError(f"--output {args.output}: its folder {final.parent} does not exist")


@contextlib.contextmanager
def output(path: str | None, binary: bool = False) -> Iterator[TextIO | BinaryIO]:
    """stdout, or a file replaced only once every line is written: a failure or Ctrl-C leaves its old contents."""
    mode, encoding = ("wb", None) if binary else ("w", "utf-8")
    if not path:
        yield sys.stdout.buffer if binary else sys.stdout
        return
    final = Path(os.path.realpath(path))  # through a symlink to the file it names
    if final.exists() and not final.is_file():  # /dev/stdout, a named pipe: nothing to replace
        with open(final, mode, encoding=encoding) as f:
            yield f
        return
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")  # same directory, so the rename is atomic
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
        if final.exists():
            shutil.copymode(final, tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of `size` lines (the last one shorter)."""
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


def translate_lines(args: argparse.Namespace, translator, decoding) -> None:
    """One sentence (or paragraph, with --split) a line of the input, translated in chunks of --buffer-size lines."""
    from nanomt.training.data import file_lines, stream_lines

    interactive = not args.input and sys.stdin.isatty()
    if interactive and args.prefix_file:
        raise ValueError("--prefix-file needs --input (a prefix a line of the input)")
    lines = file_lines(args.input) if args.input else stream_lines(sys.stdin.buffer)
    prefixes = file_lines(args.prefix_file) if args.prefix_file else None
    # A person typing: each line is translated as soon as it is entered, not at the end of the input.
    size = 1 if interactive else args.buffer_size
    progress = _progress(not interactive and sys.stderr.isatty())
    with output(args.output) as out:
        first = 0
        for chunk in chunks(lines, size):
            if len(chunk) < size:  # the input's last chunk: now the total is known
                progress.total = first + len(chunk)
            chunk_prefixes = _take(prefixes, chunk, first, lines, interactive)
            write_chunk(out, translator, args, decoding, chunk, first, chunk_prefixes)
            first += len(chunk)
            progress.update(len(chunk))
            if interactive:
                out.flush()
        if prefixes is not None and next(prefixes, None) is not None:
            given = first + 1 + sum(1 for _ in prefixes)
            raise ValueError(f"--prefix-file has {given} lines, the input {first}: one prefix a line")
    progress.close()


def _progress(shown: bool):
    from tqdm import tqdm

    return tqdm(disable=not shown, unit="sent", dynamic_ncols=True)


def _take(
    prefixes: Iterator[str] | None, chunk: list[str], first: int, rest: Iterator[str], interactive: bool
) -> list[str] | None:
    """The chunk's prefixes, or an error giving both line counts (the input's rest counted, never kept)."""
    if prefixes is None:
        return None
    taken = list(itertools.islice(prefixes, len(chunk)))
    if len(taken) < len(chunk):
        # A person typing has not ended the input: counting its rest would wait for them.
        total = f"at least {first + len(chunk)}" if interactive else first + len(chunk) + sum(1 for _ in rest)
        raise ValueError(f"--prefix-file has {first + len(taken)} lines, the input {total}: one prefix a line")
    return taken


def write_chunk(
    out: TextIO, translator, args, decoding, lines: list[str], first: int, prefixes: list[str] | None
) -> None:
    """One chunk's translations: a line each (an n-best list each with --n-best), in input order."""
    max_tokens = args.max_tokens
    if args.confidence:
        write_confident(out, translator, args, decoding, lines, prefixes)
    elif args.split:
        from nanomt.documents import translation as dt

        _, n_best, source = dt.for_translator(translator, decoding, max_tokens)
        for t in dt.paragraphs(lines, n_best, source, split=True):
            out.write(t.text + "\n")
    elif decoding.n_best > 1:
        # K lines per input sentence: index, score, translation (tab-separated), best first.
        hyps = translator.translate_n_best(lines, decoding=decoding, max_tokens=max_tokens, prefixes=prefixes)
        for i, sentence in enumerate(hyps, first):
            for text, score in sentence:
                out.write(f"{i}\t{score:.4f}\t{text}\n")
    else:
        for text in translator.translate(lines, decoding=decoding, max_tokens=max_tokens, prefixes=prefixes):
            out.write(text + "\n")


def write_confident(out: TextIO, translator, args, decoding, lines: list[str], prefixes: list[str] | None) -> None:
    """`translation<TAB>confidence` a line (the raw score where the model has no calibration); with --split, each
    paragraph's confidence is its sentences', weighted by their characters."""
    if args.split:
        from nanomt.documents import translation as dt

        recorder = dt.Confidences(
            lambda texts: translator.translate_confident(texts, decoding, args.max_tokens, replace_unknowns=True)
        )
        for t in dt.paragraphs(lines, recorder, dt.Source.of(translator.cfg, translator.tokenizer), split=True):
            confidence, raw = dt.text_confidence(recorder.sentences(t))
            out.write(f"{t.text}\t{raw if confidence is None else confidence:.4f}\n")
        return
    for c in translator.translate_confident(lines, decoding, args.max_tokens, prefixes):
        out.write(f"{c.translation}\t{c.raw if c.confidence is None else c.confidence:.4f}\n")


def translate_file(args: argparse.Namespace, translator, decoding) -> None:
    """--format: the whole input read as one document, written in the same format (formatting kept), its language
    tags set to the target language (--target-lang's, else the run's where its config names a pair); the sentences
    done shown on stderr when it is a terminal."""
    from nanomt.core.languages import language_pair, served_code
    from nanomt.core.tokenizer import language_of
    from nanomt.documents import translation as dt

    data = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    align, n_best, source = dt.for_translator(translator, decoding, args.max_tokens)
    pair = language_pair(translator.cfg.data)
    asked = language_of("", decoding.target_lang)  # a multilingual model's code, as fra or >>fra<<
    target = served_code(asked) if asked else pair[1] if pair else None
    shown = sys.stderr.isatty()
    progress = _progress(shown)

    def heard(done: int, total: int) -> None:
        progress.total = total
        progress.update(done - progress.n)

    try:
        heard_by = heard if shown else None  # piped: the document in one call, as it always was
        translated = dt.document_file(data, args.format, align, n_best, source, target=target, progress=heard_by)
    finally:
        progress.close()
    with output(args.output, binary=True) as out:
        out.write(translated)
