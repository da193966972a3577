"""Read parallel corpora, binarize them to memory-mapped arrays, and batch them by token budget."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from nanomt.core.config import DataConfig, HFDataConfig, SpecialIds, SplitConfig
from nanomt.core.model import Packing
from nanomt.core.tokenizer import Tokenizer, set_sampling_seed

log = logging.getLogger("nanomt")

SPLITS = ("train", "valid", "test")
# Bump when the binarized layout changes, so old caches are never read with new code.
FORMAT_VERSION = 1
# Pairs encoded at a time while binarizing: memory is bounded by this, not by the corpus size.
CHUNK_PAIRS = 10_000
META_FILE = "meta.json"


class CorpusError(ValueError):
    """A problem with the input corpus, with a one-line message naming the file."""


# ---------------------------------------------------------------------------------------------------------
# Reading text files


def _split_files(split: SplitConfig, name: str) -> dict[str, Path]:
    """The files of a split by role ("src"/"tgt" or "tsv"), or CorpusError if the split is ill-formed."""
    if split.tsv and (split.src or split.tgt):
        raise CorpusError(f"data.{name}: give src and tgt files, or a tsv file, not both")
    if split.tsv:
        return {"tsv": Path(split.tsv)}
    if split.src and split.tgt:
        return {"src": Path(split.src), "tgt": Path(split.tgt)}
    raise CorpusError(f"data.{name}: give src and tgt files, or a tsv file")


def file_lines(path: str | Path) -> Iterator[str]:
    """Stream the lines of a UTF-8 file without their line endings; bad bytes raise naming the line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    with open(path, "rb") as f:
        yield from stream_lines(f, str(path))


def stream_lines(stream: BinaryIO, name: str = "<stdin>") -> Iterator[str]:
    """The lines of a binary UTF-8 stream as they arrive, without line endings; bad bytes raise naming the line."""
    # Binary mode splits on b"\n" only, so line numbers match `wc -l` and editors.
    for n, raw in enumerate(stream, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorpusError(f"{name}: line {n}: invalid UTF-8") from None
        yield (line.removeprefix("\ufeff") if n == 1 else line).rstrip("\r\n")


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file, without line endings (one-line errors for a missing file or bad bytes)."""
    return list(file_lines(Path(path)))


def _tsv_fields(line: str, path: Path, n: int) -> tuple[str, str]:
    fields = line.split("\t")
    if len(fields) != 2:
        raise CorpusError(f"{path}: line {n}: expected 2 tab-separated fields, found {len(fields)}")
    return fields[0], fields[1]


def _mismatch(src: Path, n_src: int, tgt: Path, n_tgt: int) -> CorpusError:
    return CorpusError(f"{src} has {n_src} lines but {tgt} has {n_tgt}; the files must be line-aligned")


def check_split(split: SplitConfig, name: str) -> None:
    """Validate a split fully (files exist, UTF-8, aligned line counts, TSV shape), streaming the files."""
    files = _split_files(split, name)
    if "tsv" in files:
        for n, line in enumerate(file_lines(files["tsv"]), 1):
            _tsv_fields(line, files["tsv"], n)
        return
    for path in files.values():  # name a missing file before reading either
        if not path.is_file():
            raise CorpusError(f"{path}: file not found")
    n_src = sum(1 for _ in file_lines(files["src"]))
    n_tgt = sum(1 for _ in file_lines(files["tgt"]))
    if n_src != n_tgt:
        raise _mismatch(files["src"], n_src, files["tgt"], n_tgt)


def corpora(cfg: DataConfig, name: str) -> list[tuple[str, SplitConfig]]:
    """The corpora of split `name`, each with the name errors give it: train[i] where data.train is a list."""
    split = getattr(cfg, name)
    if isinstance(split, tuple):
        return [(f"{name}[{i}]", s) for i, s in enumerate(split)]
    return [(name, split)]


def check_files(cfg: DataConfig, name: str) -> None:
    """check_split of every corpus of split `name`."""
    for where, split in corpora(cfg, name):
        check_split(split, where)


def read_pairs(split: SplitConfig, name: str) -> Iterator[tuple[str, str]]:
    """Stream (src, tgt) pairs of a split, stripped of surrounding whitespace, each source of a multilingual corpus
    after its target-language token (>>code<< ); errors as in check_split."""
    code = getattr(split, "tgt_lang", None)
    pairs = _read_pairs(split, name)
    return pairs if code is None else ((f">>{code}<< {src}" if src else src, tgt) for src, tgt in pairs)


def _read_pairs(split: SplitConfig, name: str) -> Iterator[tuple[str, str]]:
    files = _split_files(split, name)
    if "tsv" in files:
        for n, line in enumerate(file_lines(files["tsv"]), 1):
            src, tgt = _tsv_fields(line, files["tsv"], n)
            yield src.strip(), tgt.strip()
        return
    src_lines, tgt_lines = file_lines(files["src"]), file_lines(files["tgt"])
    n = 0
    for src, tgt in itertools.zip_longest(src_lines, tgt_lines):
        if src is None or tgt is None:
            # zip_longest has taken one line of the longer file; count the rest for the message.
            longer = src_lines if tgt is None else tgt_lines
            total = n + 1 + sum(1 for _ in longer)
            n_src, n_tgt = (total, n) if tgt is None else (n, total)
            raise _mismatch(files["src"], n_src, files["tgt"], n_tgt)
        n += 1
        yield src.strip(), tgt.strip()


# ---------------------------------------------------------------------------------------------------------
# Reading Hugging Face datasets


def _load_hf(hf: HFDataConfig, split: str):
    """`datasets.load_dataset` for one split, with its errors turned into CorpusError."""
    where = f"Hugging Face dataset {hf.path!r} (split {split!r})"
    if not hf.path:
        raise CorpusError("data.hf.path is empty: name a Hugging Face dataset or a loader such as 'json'")
    if not hf.src_lang or not hf.tgt_lang:
        raise CorpusError("data.hf: set src_lang and tgt_lang (the keys of the two languages in each row)")
    try:
        import datasets  # imported here: only Hugging Face corpora need it
    except ImportError:
        raise CorpusError(f"{where}: needs the `datasets` package (pip install 'nanomt[hf]')") from None
    try:
        ds = datasets.load_dataset(hf.path, hf.name, data_files=hf.data_files, split=split)
    except Exception as e:
        raise CorpusError(f"{where}: {type(e).__name__}: {_first_line(e)}") from e
    _check_hf_columns(ds, hf, where)
    return ds


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def _check_hf_columns(ds, hf: HFDataConfig, where: str) -> None:
    """Fail early, listing what is there, when the rows do not hold the configured languages."""
    if hf.translation_field is not None:
        if hf.translation_field not in ds.column_names:
            raise CorpusError(f"{where}: no column {hf.translation_field!r} (columns: {ds.column_names})")
        keys = list(ds[0][hf.translation_field]) if len(ds) else [hf.src_lang, hf.tgt_lang]
        what = f"column {hf.translation_field!r}"
    else:
        keys, what = ds.column_names, "columns"
    for lang in (hf.src_lang, hf.tgt_lang):
        if lang not in keys:
            raise CorpusError(f"{where}: no language {lang!r} in {what} (found: {keys})")


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def _hf_rows(ds, hf: HFDataConfig) -> Iterator[tuple[str, str]]:
    """Stream (src, tgt) pairs from a loaded dataset in Arrow batches."""
    src, tgt, field = hf.src_lang, hf.tgt_lang, hf.translation_field
    columns = [field] if field is not None else [src, tgt]
    for batch in ds.select_columns(columns).iter(batch_size=1000):
        if field is not None:
            rows = ((r[src], r[tgt]) for r in batch[field])
        else:
            rows = zip(batch[src], batch[tgt], strict=True)
        for s, t in rows:
            yield _text(s), _text(t)


def hf_pairs(hf: HFDataConfig, split: str) -> Iterator[tuple[str, str]]:
    """Stream (src, tgt) pairs of one split of a Hugging Face dataset (hub or local json/csv/parquet)."""
    yield from _hf_rows(_load_hf(hf, split), hf)


def _hf_split(hf: HFDataConfig, name: str) -> str:
    split = {"train": hf.train_split, "valid": hf.valid_split, "test": hf.test_split}[name]
    if split is None:
        key = "valid_split" if name == "valid" else f"{name}_split"
        raise CorpusError(f"data.hf.{key} is not set, so there is no {name} split")
    return split


def split_pairs(cfg: DataConfig, name: str) -> Iterator[tuple[str, str]]:
    """Stream the (src, tgt) pairs of split `name` (train|valid|test), from cfg.hf if set, else from files."""
    if name not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
    if cfg.hf is not None:
        return hf_pairs(cfg.hf, _hf_split(cfg.hf, name))
    return itertools.chain.from_iterable(read_pairs(split, where) for where, split in corpora(cfg, name))


# ---------------------------------------------------------------------------------------------------------
# Binarizing to memory-mapped arrays


@dataclass
class Corpus:
    """A binarized split, memory-mapped: sentence i's ids are tokens[offsets[i]:offsets[i + 1]].

    Tokens are uint16 when the vocabulary has at most 65536 ids (half the disk and page cache), else int32.
    """

    src_tokens: np.ndarray
    src_offsets: np.ndarray  # int64, len n + 1
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray  # int64, len n + 1
    stats: dict
    sizes: list[int] | None = None  # pairs of each corpus of data.train as a list, in order; None: one corpus

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)


class BothDirections:
    """The pairs of a corpus src->tgt, then the same pairs tgt->src, without a copy: pair n + i is pair i reversed."""

    def __init__(self, corpus: Corpus):
        self.forward = corpus
        self.stats = corpus.stats

    def __len__(self) -> int:
        return 2 * len(self.forward)

    def src(self, i: int) -> np.ndarray:
        n = len(self.forward)
        return self.forward.src(i) if i < n else self.forward.tgt(i - n)

    def tgt(self, i: int) -> np.ndarray:
        n = len(self.forward)
        return self.forward.tgt(i) if i < n else self.forward.src(i - n)

    @property
    def src_lens(self) -> np.ndarray:
        return np.concatenate([self.forward.src_lens, self.forward.tgt_lens])

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.concatenate([self.forward.tgt_lens, self.forward.src_lens])


def _present_ids(tokens: np.ndarray) -> np.ndarray:
    """The ids that occur in `tokens`, counted a block at a time (np.unique would sort a copy of them all)."""
    if len(tokens) == 0:
        return np.zeros(0, np.int64)
    seen = np.zeros(int(tokens.max()) + 1, bool)
    for start in range(0, len(tokens), 1 << 22):
        seen |= np.bincount(tokens[start : start + (1 << 22)], minlength=len(seen)).astype(bool)
    return np.flatnonzero(seen)


def output_ids(corpus: Corpus | BothDirections, unk_id: int, eos_id: int) -> np.ndarray:
    """The target ids a model trained on `corpus` has to produce: those of its targets, EOS and UNK (sorted)."""
    if isinstance(corpus, BothDirections):  # the targets are both sides' sentences
        ids = np.union1d(_present_ids(corpus.forward.src_tokens), _present_ids(corpus.forward.tgt_tokens))
    else:
        ids = _present_ids(corpus.tgt_tokens)
    return np.union1d(ids, [unk_id, eos_id]).astype(np.int64)


class Subset:
    """Pairs of a corpus picked by index, repeats allowed, without a copy: pair i is the corpus' pair indices[i]."""

    def __init__(self, corpus: Corpus, indices: np.ndarray):
        self.corpus, self.indices = corpus, indices
        self.stats = corpus.stats

    def __len__(self) -> int:
        return len(self.indices)

    def src(self, i: int) -> np.ndarray:
        return self.corpus.src(self.indices[i])

    def tgt(self, i: int) -> np.ndarray:
        return self.corpus.tgt(self.indices[i])

    @property
    def src_lens(self) -> np.ndarray:
        return self.corpus.src_lens[self.indices]

    @property
    def tgt_lens(self) -> np.ndarray:
        return self.corpus.tgt_lens[self.indices]


def mixture(sizes: list[int], weights: list[float], seed: int, epoch: int) -> np.ndarray:
    """One epoch's pairs of corpora laid end to end (sizes), corpus i's share of them weights[i] / sum(weights).

    The epoch holds sum(sizes) pairs; a corpus gives its share as whole passes over its pairs plus a part of one
    more pass drawn without repeats, from (seed, epoch) alone, so that a resumed run draws the same ones.
    """
    rng = np.random.default_rng((seed, epoch, 1))  # a stream of its own: make_batches draws from (seed, epoch)
    total, starts = sum(sizes), np.cumsum([0, *sizes])
    picked = []
    for start, n, w in zip(starts, sizes, weights):
        passes, rest = divmod(round(w / sum(weights) * total), n)
        part = np.concatenate([np.tile(np.arange(n), passes), np.sort(rng.choice(n, rest, replace=False))])
        picked.append(start + part)
    return np.concatenate(picked).astype(np.int64)


def both_directions(corpus: Corpus) -> BothDirections:
    """Its pairs src->tgt, then the same pairs tgt->src (for one shared vocabulary): 2n pairs, as a view."""
    return BothDirections(corpus)


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def _flatten(seqs: list, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sequences to (their ids end to end, their int64 lengths): the Corpus layout without the offsets."""
    lens = np.fromiter(map(len, seqs), np.int64, len(seqs))
    return np.fromiter(itertools.chain.from_iterable(seqs), dtype, int(lens.sum())), lens


class _SequenceWriter:
    """Appends id sequences to `<stem>.bin` and their end offsets to `<stem>.idx` (which starts with 0)."""

    def __init__(self, stem: Path, dtype: np.dtype):
        self.dtype = dtype
        self.tokens = open(stem.with_suffix(".bin"), "wb")
        self.offsets = open(stem.with_suffix(".idx"), "wb")
        self.end = 0
        np.zeros(1, np.int64).tofile(self.offsets)

    def append(self, seqs: list[list[int]]) -> None:
        flat, lens = _flatten(seqs, self.dtype)
        flat.tofile(self.tokens)
        (self.end + np.cumsum(lens)).tofile(self.offsets)
        self.end += int(lens.sum())

    def close(self) -> None:
        self.tokens.close()
        self.offsets.close()


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _write_arrays(
    parts: list[Iterable[tuple[str, str]]], tokenizer: Tokenizer, out: Path, max_len: int | None
) -> tuple[dict, list[int]]:
    """Encode the pairs of each corpus in turn, chunk by chunk, into out/{src,tgt}.{bin,idx}; return the filter
    statistics and the pairs kept of each corpus."""
    stats = {"pairs": 0, "empty": 0, "too_long": 0}
    sizes = []
    src_w = _SequenceWriter(out / "src", _token_dtype(tokenizer.src_vocab_size))
    tgt_w = _SequenceWriter(out / "tgt", _token_dtype(tokenizer.tgt_vocab_size))
    try:
        for pairs in parts:
            before = stats["pairs"]
            _write_part(pairs, tokenizer, src_w, tgt_w, max_len, stats)
            sizes.append(stats["pairs"] - before)
    finally:
        src_w.close()
        tgt_w.close()
    return stats, sizes


def _write_part(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, src_w, tgt_w, max_len, stats: dict) -> None:
    """Encode one corpus' pairs a chunk at a time; count what is kept and dropped into `stats`."""
    for chunk in _chunks(pairs, CHUNK_PAIRS):
        src_ids = tokenizer.encode_src([s for s, _ in chunk])
        tgt_ids = tokenizer.encode_tgt([t for _, t in chunk])
        keep = []
        # Classify by tokens, so text that normalizes to nothing counts as empty too.
        for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
            if not s or not t:
                stats["empty"] += 1
            elif max_len is not None and (len(s) > max_len or len(t) > max_len):
                stats["too_long"] += 1
            else:
                keep.append(i)
        src_w.append([src_ids[i] for i in keep])
        tgt_w.append([tgt_ids[i] for i in keep])
        stats["pairs"] += len(keep)


def _sha256_file(path: Path) -> str:
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 16):
            h.update(block)
    return h.hexdigest()


def _source_key(cfg: DataConfig, name: str) -> dict:
    """What identifies the input of a split: the files' bytes, or the HF dataset's fingerprint."""
    if cfg.hf is not None:
        split = _hf_split(cfg.hf, name)
        # datasets fingerprints a split by its source (hub revision, or local files' paths and mtimes).
        ds = _load_hf(cfg.hf, split)
        return {"hf": dataclasses.asdict(cfg.hf), "split": split, "fingerprint": ds._fingerprint}
    keys = [{role: _sha256_file(path) for role, path in _split_files(s, w).items()} for w, s in corpora(cfg, name)]
    for key, (_, split) in zip(keys, corpora(cfg, name)):
        if getattr(split, "tgt_lang", None) is not None:  # its sources start with the token
            key["tgt_lang"] = split.tgt_lang
    return keys if isinstance(getattr(cfg, name), tuple) else keys[0]


def _open_corpus(directory: Path) -> Corpus:
    meta = json.loads((directory / META_FILE).read_text())

    def arrays(side: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.memmap(directory / f"{side}.bin", dtype=meta[f"{side}_dtype"], mode="r")
        offsets = np.memmap(directory / f"{side}.idx", dtype=np.int64, mode="r")
        return tokens, offsets

    return Corpus(*arrays("src"), *arrays("tgt"), stats=meta["stats"], sizes=meta.get("sizes"))


def _log_stats(name: str, stats: dict, max_len: int | None, cached: bool) -> None:
    msg = f"{name}: {stats['pairs']} pairs kept, {stats['empty']} empty dropped"
    if max_len is not None:
        msg += f", {stats['too_long']} longer than {max_len} tokens dropped"
    log.info(msg + (" (cached)" if cached else ""))


def binarize(cfg: DataConfig, name: str, tokenizer: Tokenizer, cache_dir: str | Path, max_len: int | None) -> Corpus:
    """Tokenize split `name` once into memory-mapped arrays under cache_dir, reused while nothing changes."""
    if name not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
    key = {
        "format": FORMAT_VERSION,
        "source": _source_key(cfg, name),
        "tokenizer": tokenizer.fingerprint(),
        "max_len": max_len,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    cache_dir = Path(cache_dir)
    final = cache_dir / f"{name}-{digest}"
    if (final / META_FILE).is_file():
        corpus = _open_corpus(final)
        _log_stats(name, corpus.stats, max_len, cached=True)
        return corpus

    if cfg.hf is None:
        check_files(cfg, name)  # every file problem surfaces before any encoding
    cache_dir.mkdir(parents=True, exist_ok=True)
    parts = [split_pairs(cfg, name)] if cfg.hf is not None else [read_pairs(s, w) for w, s in corpora(cfg, name)]
    # Written under a temporary name and renamed, so a crash never leaves a half-written cache.
    with _writing(final) as tmp:
        stats, sizes = _write_arrays(parts, tokenizer, tmp, max_len)
        if stats["pairs"] == 0:
            raise CorpusError(
                f"data.{name}: no sentence pairs left ({stats['empty']} empty, {stats['too_long']} too long)"
            )
        if 0 in sizes:  # a weighted corpus would have no pairs to give its share of an epoch
            raise CorpusError(f"data.{name}[{sizes.index(0)}]: no sentence pairs left after filtering")
        meta = {
            "key": key,
            "stats": stats,
            "sizes": sizes,
            "src_dtype": _token_dtype(tokenizer.src_vocab_size).name,
            "tgt_dtype": _token_dtype(tokenizer.tgt_vocab_size).name,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))  # last: its presence marks completion
    _log_stats(name, stats, max_len, cached=False)
    return _open_corpus(final)


# ---------------------------------------------------------------------------------------------------------
# BPE-dropout: a new segmentation of the same pairs every epoch


class CorpusText(Sequence[str]):
    """One side's sentences as UTF-8 bytes end to end (memory-mapped) with int64 offsets: a list of str without them."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes().decode("utf-8")

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))


def _corpus_dir(corpus: Corpus) -> Path | None:
    """The cache directory a binarized corpus is mapped from, or None for one built in memory."""
    filename = getattr(corpus.src_tokens, "filename", None)
    return Path(filename).parent if filename else None


@contextlib.contextmanager
def _writing(final: Path | None) -> Iterator[Path]:
    """A directory to write into that becomes `final` when the block succeeds (a throwaway one if final is None).

    Arrays mapped from a throwaway directory stay readable after it is removed (the mapping holds the pages).
    """
    parent = final.parent if final is not None else None
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-" if final is not None else "nanomt-", dir=parent))
    try:
        yield tmp
        if final is not None:
            if final.exists() and not (final / META_FILE).is_file():
                shutil.rmtree(final)  # an incomplete leftover
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / META_FILE).is_file():  # not just another process finishing first
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _open_text(directory: Path, side: str) -> CorpusText:
    data = (
        np.memmap(directory / f"{side}.txt", dtype=np.uint8, mode="r")
        if (directory / f"{side}.txt").stat().st_size
        else np.zeros(0, np.uint8)
    )
    return CorpusText(data, np.memmap(directory / f"{side}.txt.idx", dtype=np.int64, mode="r"))


def corpus_texts(corpus: Corpus, tokenizer: Tokenizer) -> tuple[CorpusText, CorpusText]:
    """The (normalized) source and target text of every pair of a binarized corpus, in order, memory-mapped.

    Decoded once, a chunk at a time, and kept beside the corpus in its cache (a binarized corpus), so that memory
    is one chunk's and a restarted run maps the file instead of decoding again.
    """
    home = _corpus_dir(corpus)
    final = home / "text" if home is not None else None
    if final is None or not (final / META_FILE).is_file():
        with _writing(final) as tmp:
            for side, decode, seq in (
                ("src", tokenizer.decode_src, corpus.src),
                ("tgt", tokenizer.decode_tgt, corpus.tgt),
            ):
                with open(tmp / f"{side}.txt", "wb") as data, open(tmp / f"{side}.txt.idx", "wb") as offsets:
                    end = 0
                    np.zeros(1, np.int64).tofile(offsets)
                    for start in range(0, len(corpus), CHUNK_PAIRS):
                        stop = min(start + CHUNK_PAIRS, len(corpus))
                        encoded = [t.encode("utf-8") for t in decode([seq(i).tolist() for i in range(start, stop)])]
                        data.write(b"".join(encoded))
                        (end + np.cumsum([len(t) for t in encoded], dtype=np.int64)).tofile(offsets)
                        end += sum(len(t) for t in encoded)
            (tmp / META_FILE).write_text(json.dumps({"pairs": len(corpus)}))
            if final is None:
                return _open_text(tmp, "src"), _open_text(tmp, "tgt")
    return _open_text(final, "src"), _open_text(final, "tgt")


def _pack(seqs: list, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sequences to (flat tokens, offsets starting at 0), the Corpus layout."""
    flat, lens = _flatten(seqs, dtype)
    return flat, np.concatenate([[0], np.cumsum(lens)])


def resegment(
    corpus: Corpus,
    texts: tuple[Sequence[str], Sequence[str]],
    tokenizer: Tokenizer,
    dropout: float,
    seed: int,
    max_len: int,
) -> Corpus:
    """The corpus' pairs (same ones, same order) with a BPE-dropout segmentation drawn from `seed`.

    The ids are those of one `encode_src(all sources, dropout)` and one `encode_tgt(...)` call after
    set_sampling_seed(seed), but drawn a chunk at a time into memory-mapped arrays, so memory is one chunk's. In a
    corpus' cache directory the segmentation is kept (the last one only), so a resumed run maps it again.
    """
    home = _corpus_dir(corpus)
    final = home / f"segmentation-{dropout:g}-{seed}-{max_len}" if home is not None else None
    if final is not None and (final / META_FILE).is_file():
        return _open_corpus(final)
    with _writing(final) as tmp:
        set_sampling_seed(seed)
        # One sampler a side, each drawing its own stream from the seed, as two whole-corpus calls would.
        encode_src = tokenizer.dropout_encoder("src", dropout) if dropout else tokenizer.encode_src
        encode_tgt = tokenizer.dropout_encoder("tgt", dropout) if dropout else tokenizer.encode_tgt
        writers = {
            "src": _SequenceWriter(tmp / "src", corpus.src_tokens.dtype),
            "tgt": _SequenceWriter(tmp / "tgt", corpus.tgt_tokens.dtype),
        }
        try:
            for start in range(0, len(corpus), CHUNK_PAIRS):
                stop = min(start + CHUNK_PAIRS, len(corpus))
                for side, encode, text, plain in (
                    ("src", encode_src, texts[0], corpus.src),
                    ("tgt", encode_tgt, texts[1], corpus.tgt),
                ):
                    ids = encode(text[start:stop])
                    for j, seq in enumerate(ids):  # a sampled segmentation is longer: past max_len, keep the plain one
                        if not seq or len(seq) > max_len:
                            ids[j] = plain(start + j)
                    writers[side].append(ids)
        finally:
            for w in writers.values():
                w.close()
        meta = {
            "stats": corpus.stats,
            "sizes": corpus.sizes,
            "src_dtype": corpus.src_tokens.dtype.name,
            "tgt_dtype": corpus.tgt_tokens.dtype.name,
        }
        (tmp / META_FILE).write_text(json.dumps(meta))
        if final is None:
            return _open_corpus(tmp)
    for old in home.glob("segmentation-*"):  # earlier epochs' segmentations are not read again
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return _open_corpus(final)


# ---------------------------------------------------------------------------------------------------------
# Batching


def padding_fraction(batches: Sequence[np.ndarray], src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Fraction of pad positions in the padded src and tgt tensors of these batches."""
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    real = padded = 0
    for b in batches:
        s, t = src_lens[b] + 1, tgt_lens[b] + 1
        real += int(s.sum() + t.sum())
        padded += len(b) * int(s.max() + t.max())
    return 1.0 - real / padded if padded else 0.0


def shard(batches: list, rank: int, world_size: int) -> list:
    """This rank's share for DDP: every world_size-th batch, truncated so all ranks take equal steps."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    return batches[rank::world_size][: len(batches) // world_size]


@dataclass
class Batch:
    """Padded tensors for one step; tgt_in is tgt_out shifted right by BOS (teacher forcing).

    Packed (`pack`): each row holds several sentences one after another, `packing` says where each begins.
    """

    src: torch.Tensor  # (B, S) long: tokens + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) long: BOS + tokens, right-padded
    tgt_out: torch.Tensor  # (B, T) long: tokens + EOS, right-padded
    n_src_tokens: int  # non-pad positions in src
    n_tgt_tokens: int  # non-pad positions in tgt_out: the number of predictions the loss averages over
    packing: Packing | None = None  # packed rows: sentence ids and positions (None: one sentence a row)

    def map(self, fn) -> Batch:
        """The batch with `fn` applied to each of its tensors (a copy to a device, into pinned memory)."""
        packing = None if self.packing is None else self.packing.map(fn)
        return dataclasses.replace(
            self, src=fn(self.src), tgt_in=fn(self.tgt_in), tgt_out=fn(self.tgt_out), packing=packing
        )

    def to(self, device: torch.device | str) -> Batch:
        return self.map(lambda t: t.to(device))


def collate(corpus: Corpus, indices: np.ndarray, ids: SpecialIds) -> Batch:
    """Gather sentences `indices` of the corpus into padded src / tgt_in / tgt_out tensors, with the model's ids."""
    if len(indices) == 0:
        raise ValueError("collate needs at least one sentence")
    srcs = [corpus.src(i) for i in indices]
    tgts = [corpus.tgt(i) for i in indices]
    n_rows = len(indices)
    src = np.full((n_rows, max(map(len, srcs)) + 1), ids.pad, dtype=np.int64)  # (B, S)
    tgt_in = np.full((n_rows, max(map(len, tgts)) + 1), ids.pad, dtype=np.int64)  # (B, T)
    tgt_out = np.full_like(tgt_in, ids.pad)  # (B, T)
    for row, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        src[row, : len(s)] = s
        src[row, len(s)] = ids.eos
        tgt_in[row, 0] = ids.bos
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = ids.eos
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        n_src_tokens=sum(len(s) + 1 for s in srcs),
        n_tgt_tokens=sum(len(t) + 1 for t in tgts),
    )


def pack_rows(src_lens: Sequence[int], tgt_lens: Sequence[int], row_tokens: int) -> list[list[int]]:
    """Sentences (lengths with EOS/BOS) in order into rows of at most row_tokens - 1 on each side; a longer one alone.

    One position of every row is left to padding, so that each row ends in a padding segment on both sides (the
    varlen kernel then pairs a row's target padding with its source padding, never with nothing).
    """
    rows: list[list[int]] = [[]]
    used_src = used_tgt = 0
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens, strict=True)):
        if rows[-1] and (used_src + s > row_tokens - 1 or used_tgt + t > row_tokens - 1):
            rows.append([])
            used_src = used_tgt = 0
        rows[-1].append(i)
        used_src, used_tgt = used_src + s, used_tgt + t
    return rows


def _segments(lengths: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per row, sentence ids (from 1; 0 on padding) and positions restarting per sentence; the cumulative lengths
    over the flattened rows (each row's padding a sequence of its own) and the longest such sequence."""
    segments = np.zeros((len(lengths), width), dtype=np.int64)  # (B, L)
    positions = np.zeros((len(lengths), width), dtype=np.int64)  # (B, L)
    seqs = []
    for r, row in enumerate(lengths):
        at = 0
        for j, n in enumerate(row):
            segments[r, at : at + n] = j + 1
            positions[r, at : at + n] = np.arange(n)
            at += n
        seqs += [*row, width - at]  # the padding: >= 1 position (pack_rows leaves one)
    cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
    return segments, positions, cu, max(seqs)


def pack(corpus: Corpus, indices: np.ndarray, ids: SpecialIds, row_tokens: int, multiple: int = 1, width=None) -> Batch:
    """Sentences `indices` concatenated into rows of about row_tokens positions, without padding between them.

    Row r of src holds the sources (each + EOS) of the sentences whose targets (BOS + tokens / tokens + EOS) row r
    of tgt_in / tgt_out holds, in the same order; `packing` gives each token's sentence and its position in it, for
    the model's block-diagonal masks (or CUDA's varlen kernel, from the cumulative lengths) and restarting
    positions. Widths are rounded up to a multiple of `multiple` (tensor-core shapes), or by `width` (a function of
    the width needed: a compiled step's shape buckets).
    """
    if len(indices) == 0:
        raise ValueError("pack needs at least one sentence")
    srcs = [corpus.src(i) for i in indices]
    tgts = [corpus.tgt(i) for i in indices]
    rows = pack_rows([len(s) + 1 for s in srcs], [len(t) + 1 for t in tgts], row_tokens)
    src_lens = [[len(srcs[i]) + 1 for i in row] for row in rows]
    tgt_lens = [[len(tgts[i]) + 1 for i in row] for row in rows]
    width = width or (lambda n: -(-n // multiple) * multiple)
    s_width = width(max(map(sum, src_lens)) + 1)  # + 1: each row ends in padding
    t_width = width(max(map(sum, tgt_lens)) + 1)
    src = np.full((len(rows), s_width), ids.pad, dtype=np.int64)  # (B, S)
    tgt_in = np.full((len(rows), t_width), ids.pad, dtype=np.int64)  # (B, T)
    tgt_out = np.full_like(tgt_in, ids.pad)  # (B, T)
    for r, row in enumerate(rows):
        s_at = t_at = 0
        for i in row:
            s, t = srcs[i], tgts[i]
            src[r, s_at : s_at + len(s)], src[r, s_at + len(s)] = s, ids.eos
            tgt_in[r, t_at], tgt_in[r, t_at + 1 : t_at + len(t) + 1] = ids.bos, t
            tgt_out[r, t_at : t_at + len(t)], tgt_out[r, t_at + len(t)] = t, ids.eos
            s_at, t_at = s_at + len(s) + 1, t_at + len(t) + 1
    src_seg, src_pos, cu_src, max_src = _segments(src_lens, s_width)
    tgt_seg, tgt_pos, cu_tgt, max_tgt = _segments(tgt_lens, t_width)
    tensor = torch.from_numpy
    packing = Packing(
        tensor(src_seg),
        tensor(tgt_seg),
        tensor(src_pos),
        tensor(tgt_pos),
        tensor(cu_src),
        tensor(cu_tgt),
        max_src,
        max_tgt,
    )
    return Batch(
        src=tensor(src),
        tgt_in=tensor(tgt_in),
        tgt_out=tensor(tgt_out),
        n_src_tokens=sum(len(s) + 1 for s in srcs),
        n_tgt_tokens=sum(len(t) + 1 for t in tgts),
        packing=packing,
    )
