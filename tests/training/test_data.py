"""Corpus reading and validation, Hugging Face input, binarization cache, token-budget batching, collation."""

import json
import logging
import os
import random

import numpy as np
import pytest
import torch
from conftest import peak_python_memory

from nanomt.core.batches import make_batches
from nanomt.core.config import DataConfig, HFDataConfig, SpecialIds, SplitConfig
from nanomt.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from nanomt.training import data
from nanomt.training.data import (
    Corpus,
    CorpusError,
    _pack,
    binarize,
    both_directions,
    check_split,
    collate,
    corpus_texts,
    hf_pairs,
    padding_fraction,
    read_pairs,
    resegment,
    shard,
    split_pairs,
)

NANOMT_IDS = SpecialIds(PAD_ID, BOS_ID, EOS_ID)

# Never touch the network from tests (read when `datasets` is first imported; also patched per test below).
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SRC_SYLLABLES = "ka to mi ren sal bo lu ne fa gi do pe".split()
TGT_SYLLABLES = "sch ung ei ach ber ost lin quo zwe wu xa yil".split()


def sentence(rng: random.Random, syllables: list[str], n_words: int) -> str:
    return " ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(n_words))


def make_pairs(n: int, seed: int = 0, max_words: int = 12) -> list[tuple[str, str]]:
    """n random sentence pairs of a made-up language pair (lengths vary so batching has work to do)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        k = rng.randint(1, max_words)
        pairs.append((sentence(rng, SRC_SYLLABLES, k), sentence(rng, TGT_SYLLABLES, k + rng.randint(-1, 2) or 1)))
    return pairs


def write_lines(path, lines) -> str:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def write_split(tmp_path, pairs, prefix="train") -> SplitConfig:
    src = write_lines(tmp_path / f"{prefix}.src", [s for s, _ in pairs])
    tgt = write_lines(tmp_path / f"{prefix}.tgt", [t for _, t in pairs])
    return SplitConfig(src=src, tgt=tgt)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    pairs = make_pairs(2000, seed=123)
    out = tmp_path_factory.mktemp("tok")
    return train_tokenizer((s for s, _ in pairs), (t for _, t in pairs), out, DataConfig(vocab_size=200))


# ---------------------------------------------------------------------------------------------------------
# Validation of text corpora


def test_split_without_files_names_the_split():
    with pytest.raises(CorpusError, match=r"^data\.train: give src and tgt files, or a tsv file$"):
        check_split(SplitConfig(), "train")
    with pytest.raises(CorpusError, match=r"data\.valid: give src and tgt files"):
        list(read_pairs(SplitConfig(src="only.src"), "valid"))
    with pytest.raises(CorpusError, match="not both"):
        check_split(SplitConfig(src="a", tgt="b", tsv="c"), "test")


@pytest.mark.parametrize("missing", ["src", "tgt"])
def test_missing_file_is_named(tmp_path, missing):
    split = write_split(tmp_path, make_pairs(3))
    path = getattr(split, missing)
    os.remove(path)
    with pytest.raises(CorpusError, match=f"^{path}: file not found$"):
        check_split(split, "train")
    with pytest.raises(CorpusError, match=f"^{path}: file not found$"):
        list(read_pairs(split, "train"))


def test_missing_tsv_is_named(tmp_path):
    path = tmp_path / "nope.tsv"
    with pytest.raises(CorpusError, match=f"{path}: file not found"):
        check_split(SplitConfig(tsv=str(path)), "train")


@pytest.mark.parametrize("n_src,n_tgt", [(5, 3), (3, 5)])
def test_line_count_mismatch_names_both_files_and_counts(tmp_path, n_src, n_tgt):
    src = write_lines(tmp_path / "a.src", ["x"] * n_src)
    tgt = write_lines(tmp_path / "a.tgt", ["y"] * n_tgt)
    split = SplitConfig(src=src, tgt=tgt)
    expected = f"^{src} has {n_src} lines but {tgt} has {n_tgt}; the files must be line-aligned$"
    with pytest.raises(CorpusError, match=expected):
        check_split(split, "train")
    # Streaming finds the same problem, with the same counts, once one file runs out.
    with pytest.raises(CorpusError, match=expected):
        list(read_pairs(split, "train"))


@pytest.mark.parametrize("bad_side", ["src", "tgt"])
def test_invalid_utf8_names_file_and_line(tmp_path, bad_side):
    split = write_split(tmp_path, make_pairs(5))
    path = getattr(split, bad_side)
    lines = open(path, "rb").read().split(b"\n")
    lines[2] = b"caf\xe9 latin-1"  # line 3
    open(path, "wb").write(b"\n".join(lines))
    with pytest.raises(CorpusError, match=f"^{path}: line 3: invalid UTF-8$"):
        check_split(split, "train")
    with pytest.raises(CorpusError, match=f"^{path}: line 3: invalid UTF-8$"):
        list(read_pairs(split, "train"))


@pytest.mark.parametrize("bad_line,n_fields", [("one field only", 1), ("a\tb\tc", 3)])
def test_tsv_line_with_wrong_field_count(tmp_path, bad_line, n_fields):
    path = write_lines(tmp_path / "c.tsv", ["hello\thallo", bad_line, "x\ty"])
    expected = f"^{path}: line 2: expected 2 tab-separated fields, found {n_fields}$"
    with pytest.raises(CorpusError, match=expected):
        check_split(SplitConfig(tsv=path), "train")
    with pytest.raises(CorpusError, match=expected):
        list(read_pairs(SplitConfig(tsv=path), "train"))


def test_tsv_reading_strips_whitespace_crlf_and_bom(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_bytes("\ufeffhello world\thallo welt\r\n  spaced  \t gap \r\nempty\t\n".encode())
    check_split(SplitConfig(tsv=str(path)), "train")
    assert list(read_pairs(SplitConfig(tsv=str(path)), "train")) == [
        ("hello world", "hallo welt"),
        ("spaced", "gap"),
        ("empty", ""),
    ]


def test_read_pairs_streams_stripped_pairs(tmp_path):
    split = SplitConfig(
        src=write_lines(tmp_path / "a.src", ["  one ", "two\r", "", "four"]),
        tgt=write_lines(tmp_path / "a.tgt", ["eins", " zwei", "drei", "\t"]),
    )
    check_split(split, "train")
    assert list(read_pairs(split, "train")) == [("one", "eins"), ("two", "zwei"), ("", "drei"), ("four", "")]
    assert list(split_pairs(DataConfig(valid=split), "valid")) == list(read_pairs(split, "train"))


# ---------------------------------------------------------------------------------------------------------
# Hugging Face datasets, loaded from local files (the same load_dataset code path as hub datasets)


def write_jsonl(path, pairs, field="translation") -> str:
    rows = [{field: {"de": s, "en": t}} for s, t in pairs]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_hf_jsonl_translation_field(tmp_path, hf_cache):
    train, valid = make_pairs(30, seed=1), make_pairs(7, seed=2)
    hf = HFDataConfig(
        path="json",
        data_files={
            "train": write_jsonl(tmp_path / "train.jsonl", train),
            "validation": write_jsonl(tmp_path / "valid.jsonl", valid),
        },
        src_lang="de",
        tgt_lang="en",
    )
    assert list(hf_pairs(hf, "train")) == train
    cfg = DataConfig(hf=hf)
    assert list(split_pairs(cfg, "valid")) == valid
    with pytest.raises(CorpusError, match=r"data\.hf\.test_split is not set"):
        split_pairs(cfg, "test")
    assert (hf_cache / "datasets").is_dir()  # the cache went where the test pointed it


def test_hf_csv_columns(tmp_path, hf_cache):
    pairs = [("hallo welt", "hello world"), (" eins ", "one"), ("", "empty")]
    path = tmp_path / "train.csv"
    path.write_text("src,tgt\n" + "".join(f'"{s}","{t}"\n' for s, t in pairs), encoding="utf-8")
    hf = HFDataConfig(
        path="csv", data_files={"train": str(path)}, src_lang="src", tgt_lang="tgt", translation_field=None
    )
    assert list(hf_pairs(hf, "train")) == [("hallo welt", "hello world"), ("eins", "one"), ("", "empty")]


def test_hf_parquet_columns(tmp_path, hf_cache):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pairs = make_pairs(12, seed=3)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"fr": [s for s, _ in pairs], "it": [t for _, t in pairs]}), path)
    hf = HFDataConfig(
        path="parquet", data_files={"train": str(path)}, src_lang="fr", tgt_lang="it", translation_field=None
    )
    assert list(hf_pairs(hf, "train")) == pairs


@pytest.mark.parametrize(
    "change,split,pattern",
    [
        ({}, "validation", r"'json' \(split 'validation'\): ValueError: Unknown split"),
        ({"src_lang": "fr"}, "train", r"no language 'fr' in column 'translation' \(found: \['de', 'en'\]\)"),
        ({"translation_field": "pairs"}, "train", r"no column 'pairs' \(columns: \['translation'\]\)"),
        ({"data_files": {"train": "MISSING"}}, "train", r"FileNotFoundError: .*missing\.jsonl"),
        ({"path": "no-such/dataset", "data_files": None}, "train", r"'no-such/dataset' \(split 'train'\): "),
        ({"src_lang": ""}, "train", r"data\.hf: set src_lang and tgt_lang"),
    ],
)
def test_hf_errors_are_one_line_corpus_errors(tmp_path, hf_cache, change, split, pattern):
    path = write_jsonl(tmp_path / "train.jsonl", make_pairs(3))
    fields = {"path": "json", "data_files": {"train": path}, "src_lang": "de", "tgt_lang": "en", **change}
    if fields["data_files"] == {"train": "MISSING"}:
        fields["data_files"] = {"train": str(tmp_path / "missing.jsonl")}
    with pytest.raises(CorpusError, match=pattern) as err:
        list(hf_pairs(HFDataConfig(**fields), split))
    assert "\n" not in str(err.value)


def test_hf_binarize_cache_follows_the_file(tmp_path, hf_cache, tokenizer):
    path = tmp_path / "train.jsonl"
    write_jsonl(path, make_pairs(20, seed=4))
    hf = HFDataConfig(path="json", data_files={"train": str(path)}, src_lang="de", tgt_lang="en")
    cfg = DataConfig(hf=hf)
    first = binarize(cfg, "train", tokenizer, tmp_path / "cache", max_len=None)
    assert len(first) == 20
    assert len(binarize(cfg, "train", tokenizer, tmp_path / "cache", max_len=None)) == 20
    assert len(list((tmp_path / "cache").iterdir())) == 1
    write_jsonl(path, make_pairs(25, seed=5))
    os.utime(path, (1e9, 1e9))  # a different mtime for sure, however coarse the filesystem clock
    assert len(binarize(cfg, "train", tokenizer, tmp_path / "cache", max_len=None)) == 25
    assert len(list((tmp_path / "cache").iterdir())) == 2


# ---------------------------------------------------------------------------------------------------------
# Binarization


def test_binarize_equals_direct_encoding_and_filters(tmp_path, tokenizer, caplog):
    pairs = make_pairs(300, seed=7, max_words=30)
    pairs[5] = ("", "something")
    pairs[17] = ("something", "   ")
    pairs[40] = (" \t ", "")
    cfg = DataConfig(train=write_split(tmp_path, pairs))
    data.CHUNK_PAIRS, saved = 64, data.CHUNK_PAIRS  # several chunks, so chunk boundaries are exercised
    try:
        with caplog.at_level(logging.INFO, logger="nanomt"):
            corpus = binarize(cfg, "train", tokenizer, tmp_path / "cache", max_len=40)
    finally:
        data.CHUNK_PAIRS = saved

    src_ids = tokenizer.encode_src([s.strip() for s, _ in pairs])
    tgt_ids = tokenizer.encode_tgt([t.strip() for _, t in pairs])
    nonempty = [i for i in range(len(pairs)) if src_ids[i] and tgt_ids[i]]
    kept = [i for i in nonempty if len(src_ids[i]) <= 40 and len(tgt_ids[i]) <= 40]
    assert 0 < len(nonempty) - len(kept) < len(nonempty)  # the filter really drops some, not all
    assert corpus.stats == {"pairs": len(kept), "empty": 3, "too_long": len(nonempty) - len(kept)}
    assert len(corpus) == len(kept)
    for row, i in enumerate(kept):
        assert corpus.src(row).tolist() == src_ids[i]
        assert corpus.tgt(row).tolist() == tgt_ids[i]
    assert corpus.src_lens.tolist() == [len(src_ids[i]) for i in kept]
    assert corpus.tgt_lens.tolist() == [len(tgt_ids[i]) for i in kept]
    assert corpus.src_tokens.dtype == np.uint16 and corpus.src_offsets.dtype == np.int64
    assert isinstance(corpus.src_tokens, np.memmap)
    expected = f"train: {len(kept)} pairs kept, 3 empty dropped, {len(nonempty) - len(kept)} longer than 40"
    assert [r.getMessage() for r in caplog.records if r.name == "nanomt"] == [expected + " tokens dropped"]


def test_resegment_draws_a_seeded_segmentation_of_the_same_text(tmp_path, tokenizer):
    pairs = make_pairs(200, seed=11, max_words=20)
    corpus = binarize(DataConfig(train=write_split(tmp_path, pairs)), "train", tokenizer, tmp_path / "c", None)
    texts = corpus_texts(corpus, tokenizer)
    assert texts == ([s for s, _ in pairs], [t for _, t in pairs])
    max_len = int(np.percentile(corpus.src_lens, 80))  # the plain segmentation of the longest 20% is kept
    a = resegment(corpus, texts, tokenizer, 0.2, seed=1, max_len=max_len)
    again = resegment(corpus, texts, tokenizer, 0.2, seed=1, max_len=max_len)
    other = resegment(corpus, texts, tokenizer, 0.2, seed=2, max_len=max_len)
    assert len(a) == len(corpus) and a.stats == corpus.stats
    assert np.array_equal(a.src_tokens, again.src_tokens) and np.array_equal(a.tgt_offsets, again.tgt_offsets)
    assert not np.array_equal(a.src_offsets, other.src_offsets)
    assert a.src_lens.sum() > corpus.src_lens.sum() and a.tgt_lens.sum() > corpus.tgt_lens.sum()  # finer pieces
    for i in range(len(corpus)):
        assert tokenizer.decode_src([a.src(i)]) == [pairs[i][0]]  # the same text, cut differently
        assert tokenizer.decode_tgt([a.tgt(i)]) == [pairs[i][1]]
        if corpus.src_lens[i] <= max_len:
            assert a.src_lens[i] <= max_len
        else:
            assert a.src(i).tolist() == corpus.src(i).tolist()
    plain = resegment(corpus, texts, tokenizer, 0.0, seed=1, max_len=10**6)  # dropout 0: the plain segmentation
    assert np.array_equal(plain.src_tokens, corpus.src_tokens) and np.array_equal(plain.tgt_tokens, corpus.tgt_tokens)


def test_binarize_without_max_len_keeps_long_pairs(tmp_path, tokenizer):
    pairs = make_pairs(50, seed=8, max_words=40)
    corpus = binarize(DataConfig(train=write_split(tmp_path, pairs)), "train", tokenizer, tmp_path / "c", None)
    assert corpus.stats == {"pairs": 50, "empty": 0, "too_long": 0}
    assert corpus.src_lens.max() > 40


def test_binarize_tsv(tmp_path, tokenizer):
    pairs = make_pairs(20, seed=9)
    path = write_lines(tmp_path / "t.tsv", [f"{s}\t{t}" for s, t in pairs])
    corpus = binarize(DataConfig(valid=SplitConfig(tsv=path)), "valid", tokenizer, tmp_path / "c", None)
    assert [corpus.tgt(i).tolist() for i in range(len(corpus))] == tokenizer.encode_tgt([t for _, t in pairs])


def test_binarize_validates_before_encoding(tmp_path, tokenizer, monkeypatch):
    split = write_split(tmp_path, make_pairs(30))
    with open(split.tgt, "a", encoding="utf-8") as f:
        f.write("one line too many\n")
    monkeypatch.setattr(Tokenizer, "encode_src", lambda *a: pytest.fail("encoded an invalid corpus"))
    with pytest.raises(CorpusError, match="has 30 lines but .* has 31"):
        binarize(DataConfig(train=split), "train", tokenizer, tmp_path / "c", None)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # not even half-written


def test_binarize_all_pairs_dropped_is_an_error(tmp_path, tokenizer):
    split = write_split(tmp_path, [("", "x"), ("y", " ")])
    with pytest.raises(CorpusError, match=r"data\.train: no sentence pairs left \(2 empty"):
        binarize(DataConfig(train=split), "train", tokenizer, tmp_path / "c", None)


def test_binarize_cache_reused_then_invalidated(tmp_path, tokenizer, monkeypatch):
    pairs = make_pairs(100, seed=10)
    cfg = DataConfig(train=write_split(tmp_path, pairs))
    cache = tmp_path / "cache"
    first = binarize(cfg, "train", tokenizer, cache, max_len=50)
    (entry,) = cache.iterdir()
    mtimes = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}

    calls = []
    real_encode = Tokenizer.encode_src
    monkeypatch.setattr(Tokenizer, "encode_src", lambda self, t: calls.append(len(t)) or real_encode(self, t))
    second = binarize(cfg, "train", tokenizer, cache, max_len=50)
    assert calls == []  # nothing re-encoded
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == mtimes
    assert np.array_equal(second.src_tokens, first.src_tokens)
    assert second.stats == first.stats

    # Same size, same line count, one changed word: a content hash notices, a size/mtime check might not.
    changed = list(pairs)
    changed[50] = (changed[50][0], "wu " + changed[50][1][3:])
    write_split(tmp_path, changed)
    third = binarize(cfg, "train", tokenizer, cache, max_len=50)
    assert calls  # re-encoded
    assert len(list(cache.iterdir())) == 2
    assert third.tgt(50).tolist() == tokenizer.encode_tgt([changed[50][1]])[0]
    assert third.tgt(50).tolist() != first.tgt(50).tolist()

    # Another max_len is another cache entry too.
    binarize(cfg, "train", tokenizer, cache, max_len=10)
    assert len(list(cache.iterdir())) == 3


@pytest.mark.slow  # a corpus scanned twice
def test_binarize_memory_does_not_grow_with_corpus(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(data, "CHUNK_PAIRS", 100)
    small = DataConfig(train=write_split(tmp_path, make_pairs(5_000, seed=11), prefix="small"))
    big = DataConfig(train=write_split(tmp_path, make_pairs(40_000, seed=12), prefix="big"))
    big_bytes = os.path.getsize(big.train.src) + os.path.getsize(big.train.tgt)

    peak_small = peak_python_memory(lambda: binarize(small, "train", tokenizer, tmp_path / "c", None))
    peak_big = peak_python_memory(lambda: binarize(big, "train", tokenizer, tmp_path / "c", None))
    # Holding the big corpus's text (or its token lists) would cost several times big_bytes.
    assert peak_big < big_bytes / 10, (peak_big, big_bytes)
    # 8x the corpus, about the same peak: the working set is one chunk.
    assert peak_big < 1.5 * peak_small + 100_000, (peak_small, peak_big)


# ---------------------------------------------------------------------------------------------------------
# Batching


def random_lengths(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 80, n)
    tgt = np.clip(src + rng.integers(-5, 6, n), 1, None)
    return src, tgt


def padded_size(batch, src_lens, tgt_lens) -> int:
    return len(batch) * int(max(src_lens[batch].max(), tgt_lens[batch].max()) + 1)


def test_make_batches_covers_every_index_within_budget():
    src, tgt = random_lengths()
    src[7], tgt[7] = 600, 10  # longer than the whole budget on its own
    batches = make_batches(src, tgt, max_tokens=500, seed=1, epoch=0)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(src)))
    for b in batches:
        assert padded_size(b, src, tgt) <= 500 or len(b) == 1
    assert [b.tolist() for b in batches if padded_size(b, src, tgt) > 500] == [[7]]
    # Greedy filling: batches are not needlessly small (most are at least half full).
    fill = [padded_size(b, src, tgt) / 500 for b in batches]
    assert np.median(fill) > 0.8


def test_make_batches_deterministic_per_seed_and_epoch():
    src, tgt = random_lengths()

    def run(seed, epoch, shuffle=True):
        return [b.tolist() for b in make_batches(src, tgt, 1000, seed=seed, epoch=epoch, shuffle=shuffle)]

    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(1, 1)
    assert run(1, 0) != run(2, 0)
    # Equal lengths are shuffled too, so even the set of batches differs between epochs.
    assert sorted(map(sorted, run(1, 0))) != sorted(map(sorted, run(1, 1)))
    # Without shuffling: sorted by length, independent of seed and epoch.
    ordered = run(1, 0, shuffle=False)
    assert ordered == run(5, 3, shuffle=False)
    flat = np.concatenate(ordered)
    keys = list(zip(tgt[flat], src[flat], strict=True))
    assert keys == sorted(keys)


def test_length_bucketing_pads_less_than_random_batches():
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=2000, seed=1, epoch=0)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(src))
    sizes = np.cumsum([len(b) for b in batches])[:-1]
    random_batches = np.split(perm, sizes)  # same batch sizes, random members
    bucketed, unbucketed = padding_fraction(batches, src, tgt), padding_fraction(random_batches, src, tgt)
    assert bucketed < 0.1 < 0.3 < unbucketed, (bucketed, unbucketed)


def test_padding_fraction_by_hand():
    src, tgt = np.array([1, 3]), np.array([2, 2])
    # src rows padded to 4: real 2 + 4; tgt rows padded to 3: real 3 + 3. Pads: 2 of 14.
    assert padding_fraction([np.array([0, 1])], src, tgt) == pytest.approx(2 / 14)


@pytest.mark.parametrize("n_batches,world", [(10, 3), (9, 3), (2, 4), (7, 1)])
def test_shard_disjoint_equal_length(n_batches, world):
    batches = [np.array([i]) for i in range(n_batches)]
    shards = [shard(batches, r, world) for r in range(world)]
    assert {len(s) for s in shards} == {n_batches // world}
    ids = [int(b[0]) for s in shards for b in s]
    assert len(ids) == len(set(ids)) == world * (n_batches // world)
    with pytest.raises(ValueError):
        shard(batches, world, world)


# ---------------------------------------------------------------------------------------------------------
# Collation


def test_collate_shapes_and_special_tokens():
    src_seqs = [[10, 11, 12], [20], [30, 31]]
    tgt_seqs = [[40], [50, 51, 52, 53], [60, 61]]

    def flat(seqs):
        return np.array(sum(seqs, []), np.uint16), np.cumsum([0] + [len(s) for s in seqs])

    corpus = Corpus(*flat(src_seqs), *flat(tgt_seqs), stats={})
    batch = collate(corpus, np.array([2, 0, 1]), NANOMT_IDS)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.src.tolist() == [
        [30, 31, EOS_ID, PAD_ID],
        [10, 11, 12, EOS_ID],
        [20, EOS_ID, PAD_ID, PAD_ID],
    ]
    assert batch.tgt_in.tolist() == [
        [BOS_ID, 60, 61, PAD_ID, PAD_ID],
        [BOS_ID, 40, PAD_ID, PAD_ID, PAD_ID],
        [BOS_ID, 50, 51, 52, 53],
    ]
    assert batch.tgt_out.tolist() == [
        [60, 61, EOS_ID, PAD_ID, PAD_ID],
        [40, EOS_ID, PAD_ID, PAD_ID, PAD_ID],
        [50, 51, 52, 53, EOS_ID],
    ]
    assert batch.n_src_tokens == int((batch.src != PAD_ID).sum()) == 9
    assert batch.n_tgt_tokens == int((batch.tgt_out != PAD_ID).sum()) == 10
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out) and moved.n_tgt_tokens == 10


def test_collate_from_binarized_corpus(tmp_path, tokenizer):
    pairs = make_pairs(40, seed=13)
    corpus = binarize(DataConfig(train=write_split(tmp_path, pairs)), "train", tokenizer, tmp_path / "c", None)
    batches = make_batches(corpus.src_lens, corpus.tgt_lens, max_tokens=200, seed=0, epoch=0)
    for idx in batches:
        batch = collate(corpus, idx, NANOMT_IDS)
        B = len(idx)
        assert batch.src.shape == (B, corpus.src_lens[idx].max() + 1)  # (B, S)
        assert batch.tgt_in.shape == batch.tgt_out.shape == (B, corpus.tgt_lens[idx].max() + 1)  # (B, T)
        assert batch.src.numel() <= 200 and batch.tgt_out.numel() <= 200
        for row, i in enumerate(idx):
            n = corpus.tgt_lens[i]
            assert batch.tgt_in[row, 1 : n + 1].tolist() == batch.tgt_out[row, :n].tolist() == corpus.tgt(i).tolist()
        assert (batch.tgt_in[:, 0] == BOS_ID).all()


def corpus_of(pairs: list[tuple[list[int], list[int]]]) -> Corpus:
    """A Corpus built by hand from (src ids, tgt ids) pairs."""
    return Corpus(*_pack([s for s, _ in pairs], np.uint16), *_pack([t for _, t in pairs], np.uint16), {})


def test_both_directions_appends_every_pair_reversed():
    pairs = [([5, 6, 7], [8]), ([9], [10, 11]), ([12, 13], [14, 15, 16, 17])]
    both = both_directions(corpus_of(pairs))
    assert len(both) == 6
    want = pairs + [(t, s) for s, t in pairs]
    assert [(both.src(i).tolist(), both.tgt(i).tolist()) for i in range(6)] == want
    assert both.src_lens.tolist() == [3, 1, 2, 1, 2, 4] and both.tgt_lens.tolist() == [1, 2, 4, 3, 1, 2]
