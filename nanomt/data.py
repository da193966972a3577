"""Read parallel corpora, binarize them to memory-mapped arrays, and batch them by token budget."""

from __future__ import annotations

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

from .config import DataConfig, HFDataConfig, SplitConfig
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, set_sampling_seed

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


def _lines(path: Path) -> Iterator[str]:
    """Stream the lines of a UTF-8 file without their line endings; bad bytes raise naming the line."""
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
    return list(_lines(Path(path)))


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
        for n, line in enumerate(_lines(files["tsv"]), 1):
            _tsv_fields(line, files["tsv"], n)
        return
    for path in files.values():  # name a missing file before reading either
        if not path.is_file():
            raise CorpusError(f"{path}: file not found")
    n_src = sum(1 for _ in _lines(files["src"]))
    n_tgt = sum(1 for _ in _lines(files["tgt"]))
    if n_src != n_tgt:
        raise _mismatch(files["src"], n_src, files["tgt"], n_tgt)


def read_pairs(split: SplitConfig, name: str) -> Iterator[tuple[str, str]]:
    """Stream (src, tgt) pairs of a split, stripped of surrounding whitespace; errors as in check_split."""
    files = _split_files(split, name)
    if "tsv" in files:
        for n, line in enumerate(_lines(files["tsv"]), 1):
            src, tgt = _tsv_fields(line, files["tsv"], n)
            yield src.strip(), tgt.strip()
        return
    src_lines, tgt_lines = _lines(files["src"]), _lines(files["tgt"])
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
    return read_pairs(getattr(cfg, name), name)


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


def output_ids(corpus: Corpus) -> np.ndarray:
    """The target ids a model trained on `corpus` has to produce: those of its targets, EOS and UNK (sorted)."""
    return np.union1d(np.unique(corpus.tgt_tokens), [UNK_ID, EOS_ID]).astype(np.int64)


def both_directions(corpus: Corpus) -> Corpus:
    """Its pairs src->tgt, then the same pairs tgt->src (for one shared vocabulary): 2n pairs."""
    n_src = len(corpus.src_tokens)  # pair n + i is pair i reversed: its source is tgt(i), its target src(i)
    src_tokens = np.concatenate([corpus.src_tokens, corpus.tgt_tokens])
    tgt_tokens = np.concatenate([corpus.tgt_tokens, corpus.src_tokens])
    src_offsets = np.concatenate([corpus.src_offsets, corpus.tgt_offsets[1:] + n_src])
    tgt_offsets = np.concatenate([corpus.tgt_offsets, corpus.src_offsets[1:] + len(corpus.tgt_tokens)])
    return Corpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, corpus.stats)


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


def _write_arrays(pairs: Iterable[tuple[str, str]], tokenizer: Tokenizer, out: Path, max_len: int | None) -> dict:
    """Encode pairs chunk by chunk into out/{src,tgt}.{bin,idx}; return the filter statistics."""
    stats = {"pairs": 0, "empty": 0, "too_long": 0}
    src_w = _SequenceWriter(out / "src", _token_dtype(tokenizer.src_vocab_size))
    tgt_w = _SequenceWriter(out / "tgt", _token_dtype(tokenizer.tgt_vocab_size))
    try:
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
    finally:
        src_w.close()
        tgt_w.close()
    return stats


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
    return {role: _sha256_file(path) for role, path in _split_files(getattr(cfg, name), name).items()}


def _open_corpus(directory: Path) -> Corpus:
    meta = json.loads((directory / META_FILE).read_text())

    def arrays(side: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.memmap(directory / f"{side}.bin", dtype=meta[f"{side}_dtype"], mode="r")
        offsets = np.memmap(directory / f"{side}.idx", dtype=np.int64, mode="r")
        return tokens, offsets

    return Corpus(*arrays("src"), *arrays("tgt"), stats=meta["stats"])


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
        check_split(getattr(cfg, name), name)  # every file problem surfaces before any encoding
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed, so a crash never leaves a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache_dir))
    try:
        stats = _write_arrays(split_pairs(cfg, name), tokenizer, tmp, max_len)
        if stats["pairs"] == 0:
            raise CorpusError(
                f"data.{name}: no sentence pairs left ({stats['empty']} empty, {stats['too_long']} too long)"
            )
        meta = {
            "key": key,
            "stats": stats,
            "src_dtype": _token_dtype(tokenizer.src_vocab_size).name,
            "tgt_dtype": _token_dtype(tokenizer.tgt_vocab_size).name,
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2))  # last: its presence marks completion
        if final.exists() and not (final / META_FILE).is_file():
            shutil.rmtree(final)  # an incomplete leftover
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / META_FILE).is_file():  # not just another process finishing first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log_stats(name, stats, max_len, cached=False)
    return _open_corpus(final)


# ---------------------------------------------------------------------------------------------------------
# BPE-dropout: a new segmentation of the same pairs every epoch


def corpus_texts(corpus: Corpus, tokenizer: Tokenizer) -> tuple[list[str], list[str]]:
    """The (normalized) source and target text of every pair of a binarized corpus, in order."""
    n = len(corpus)
    return (
        tokenizer.decode_src([corpus.src(i) for i in range(n)]),
        tokenizer.decode_tgt([corpus.tgt(i) for i in range(n)]),
    )


def _pack(seqs: list, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Sequences to (flat tokens, offsets starting at 0), the Corpus layout."""
    flat, lens = _flatten(seqs, dtype)
    return flat, np.concatenate([[0], np.cumsum(lens)])


def resegment(
    corpus: Corpus, texts: tuple[list[str], list[str]], tokenizer: Tokenizer, dropout: float, seed: int, max_len: int
) -> Corpus:
    """The corpus' pairs (same ones, same order) with a BPE-dropout segmentation drawn from `seed`."""
    set_sampling_seed(seed)
    src = tokenizer.encode_src(texts[0], dropout)
    tgt = tokenizer.encode_tgt(texts[1], dropout)
    for i in range(len(corpus)):  # a sampled segmentation is longer: past max_len, keep the plain one
        if not src[i] or len(src[i]) > max_len:
            src[i] = corpus.src(i)
        if not tgt[i] or len(tgt[i]) > max_len:
            tgt[i] = corpus.tgt(i)
    src_tokens, src_offsets = _pack(src, corpus.src_tokens.dtype)
    tgt_tokens, tgt_offsets = _pack(tgt, corpus.tgt_tokens.dtype)
    return Corpus(src_tokens, src_offsets, tgt_tokens, tgt_offsets, corpus.stats)


# ---------------------------------------------------------------------------------------------------------
# Batching


def make_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Length-bucketed batches of sentence indices, each padded to at most max_tokens (seq + EOS/BOS)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    src_lens = np.asarray(src_lens, dtype=np.int64)
    tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
    n = len(tgt_lens)
    rng = np.random.default_rng((seed, epoch))
    # Sort by tgt length, then src length; a random last key shuffles sentences of equal lengths.
    tie_break = rng.random(n) if shuffle else np.arange(n)
    order = np.lexsort((tie_break, src_lens, tgt_lens))
    # +1: every row carries one extra token (EOS on src and tgt_out, BOS on tgt_in).
    width = (np.maximum(src_lens, tgt_lens) + 1)[order]
    min_width = tgt_lens[order] + 1
    batches = []
    start = 0
    while start < n:
        # Widths from `start` on are >= min_width[start] (tgt is sorted), which bounds how many rows fit.
        window = width[start : start + max_tokens // min_width[start] + 1]
        padded = np.arange(1, len(window) + 1) * np.maximum.accumulate(window)  # nondecreasing
        count = max(1, int(np.searchsorted(padded, max_tokens, side="right")))  # >= 1: oversize alone
        batches.append(order[start : start + count])
        start += count
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


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
    """Padded tensors for one step; tgt_in is tgt_out shifted right by BOS (teacher forcing)."""

    src: torch.Tensor  # (B, S) long: tokens + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) long: BOS + tokens, right-padded
    tgt_out: torch.Tensor  # (B, T) long: tokens + EOS, right-padded
    n_src_tokens: int  # non-pad positions in src
    n_tgt_tokens: int  # non-pad positions in tgt_out: the number of predictions the loss averages over

    def to(self, device: torch.device | str) -> Batch:
        return dataclasses.replace(
            self, src=self.src.to(device), tgt_in=self.tgt_in.to(device), tgt_out=self.tgt_out.to(device)
        )


def collate(corpus: Corpus, indices: np.ndarray) -> Batch:
    """Gather sentences `indices` of the corpus into padded src / tgt_in / tgt_out tensors."""
    if len(indices) == 0:
        raise ValueError("collate needs at least one sentence")
    srcs = [corpus.src(i) for i in indices]
    tgts = [corpus.tgt(i) for i in indices]
    n_rows = len(indices)
    src = np.full((n_rows, max(map(len, srcs)) + 1), PAD_ID, dtype=np.int64)  # (B, S)
    tgt_in = np.full((n_rows, max(map(len, tgts)) + 1), PAD_ID, dtype=np.int64)  # (B, T)
    tgt_out = np.full_like(tgt_in, PAD_ID)  # (B, T)
    for row, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        src[row, : len(s)] = s
        src[row, len(s)] = EOS_ID
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS_ID
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        n_src_tokens=sum(len(s) + 1 for s in srcs),
        n_tgt_tokens=sum(len(t) + 1 for t in tgts),
    )
