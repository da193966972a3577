"""The corpus-scale data pipeline: bounded memory for BPE-dropout and bidirectional epochs (its benchmark:
recipes/test_corpus_scale_benchmark.py)."""

import os
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import peak_python_memory

from nanomt.core.config import DataConfig, SplitConfig
from nanomt.core.tokenizer import Tokenizer, set_sampling_seed, train_tokenizer
from nanomt.training import data
from nanomt.training.data import Corpus, _pack, binarize, both_directions, corpus_texts, output_ids, resegment

WORDS = "ka to mi ren sal bo lu ne fa gi do pe sch ung ei ach ber ost lin quo zwe wu xa yil".split()


def make_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join("".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 15)))

    return [(sentence(), sentence()) for _ in range(n)]


def write_split(directory: Path, pairs, prefix: str) -> SplitConfig:
    for i, ext in enumerate(("src", "tgt")):
        (directory / f"{prefix}.{ext}").write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")
    return SplitConfig(src=str(directory / f"{prefix}.src"), tgt=str(directory / f"{prefix}.tgt"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    pairs = make_pairs(2000, seed=5)
    out = tmp_path_factory.mktemp("tok")
    return train_tokenizer((s for s, _ in pairs), (t for _, t in pairs), out, DataConfig(vocab_size=150))


def binarized(directory: Path, n: int, seed: int, tokenizer: Tokenizer) -> Corpus:
    cfg = DataConfig(train=write_split(directory, make_pairs(n, seed), f"c{n}"))
    return binarize(cfg, "train", tokenizer, directory / "cache", None)


def test_resegment_draws_the_ids_of_one_whole_corpus_encoding(tmp_path, tokenizer, monkeypatch):
    """Chunked and memory-mapped, the segmentation is the one the whole-corpus call draws from the same seed."""
    monkeypatch.setattr(data, "CHUNK_PAIRS", 37)  # many chunks, the last one short
    corpus = binarized(tmp_path, 1000, 1, tokenizer)
    texts = corpus_texts(corpus, tokenizer)
    max_len = int(np.percentile(corpus.src_lens, 90))
    seg = resegment(corpus, texts, tokenizer, 0.2, seed=7, max_len=max_len)
    # The reference: the tokenizer on the whole text at once, as training did before it was streamed.
    src_text = tokenizer.decode_src([corpus.src(i) for i in range(len(corpus))])
    tgt_text = tokenizer.decode_tgt([corpus.tgt(i) for i in range(len(corpus))])
    set_sampling_seed(7)
    want_src = tokenizer.encode_src(src_text, 0.2)
    want_tgt = tokenizer.encode_tgt(tgt_text, 0.2)
    for i in range(len(corpus)):
        want_s = want_src[i] if want_src[i] and len(want_src[i]) <= max_len else corpus.src(i).tolist()
        want_t = want_tgt[i] if want_tgt[i] and len(want_tgt[i]) <= max_len else corpus.tgt(i).tolist()
        assert seg.src(i).tolist() == want_s and seg.tgt(i).tolist() == want_t, i
    assert list(texts[0]) == src_text and list(texts[1]) == tgt_text
    # Kept beside the corpus: a resumed run maps the same epoch without drawing it again.
    again = resegment(corpus, corpus_texts(corpus, tokenizer), tokenizer, 0.2, seed=7, max_len=max_len)
    assert np.array_equal(again.src_tokens, seg.src_tokens) and np.array_equal(again.tgt_offsets, seg.tgt_offsets)
    assert isinstance(again.src_tokens, np.memmap)


@pytest.mark.slow  # a corpus scanned twice
def test_resegment_memory_does_not_grow_with_corpus(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(data, "CHUNK_PAIRS", 200)
    small = binarized(tmp_path, 2_000, 2, tokenizer)
    big = binarized(tmp_path, 16_000, 3, tokenizer)

    def epoch(corpus: Corpus) -> None:
        resegment(corpus, corpus_texts(corpus, tokenizer), tokenizer, 0.1, seed=1, max_len=10**6)

    peak_small = peak_python_memory(lambda: epoch(small))
    peak_big = peak_python_memory(lambda: epoch(big))
    text_bytes = sum(os.path.getsize(p) for p in (tmp_path / "c16000.src", tmp_path / "c16000.tgt"))
    # The big corpus' sentences as Python strings, or its ids as Python lists, would be several times text_bytes.
    assert peak_big < text_bytes / 4, (peak_big, text_bytes)
    # 8x the corpus, about the same peak: the working set is one chunk.
    assert peak_big < 1.5 * peak_small + 200_000, (peak_small, peak_big)


def test_both_directions_is_a_view_with_the_same_pairs():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, 300, rng.integers(1, 40)).tolist() for _ in range(40_000)]
    corpus = Corpus(*_pack(seqs[:20_000], np.uint16), *_pack(seqs[20_000:], np.uint16), {"pairs": 20_000})
    both = None

    def view() -> None:
        nonlocal both
        both = both_directions(corpus)

    peak = peak_python_memory(view)
    assert peak < 10_000, peak  # not a copy of the tokens (about 800 kB here)
    n = len(corpus)
    assert len(both) == 2 * n and both.stats == corpus.stats
    for i in rng.integers(0, n, 500):
        assert both.src(i).tolist() == seqs[i] and both.tgt(i).tolist() == seqs[n + i]
        assert both.src(n + i).tolist() == seqs[n + i] and both.tgt(n + i).tolist() == seqs[i]
    assert np.array_equal(both.src_lens, np.concatenate([corpus.src_lens, corpus.tgt_lens]))
    assert np.array_equal(both.tgt_lens, np.concatenate([corpus.tgt_lens, corpus.src_lens]))
    ids = np.union1d(np.unique(corpus.src_tokens), np.unique(corpus.tgt_tokens))
    assert np.array_equal(output_ids(both, 1, 3), np.union1d(ids, [1, 3]))
    assert np.array_equal(output_ids(corpus, 1, 3), np.union1d(np.unique(corpus.tgt_tokens), [1, 3]))
