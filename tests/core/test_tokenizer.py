"""SentencePiece training and loading: fixed special ids, round trips, shared vs separate vocabularies."""

import hashlib
import random

import pytest

from nanomt.core.config import DataConfig
from nanomt.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizer


def words(syllables: str, n: int, seed: int) -> list[str]:
    """A made-up lexicon: up to n words of 1-3 syllables."""
    rng = random.Random(seed)
    parts = syllables.split()
    return sorted({"".join(rng.choice(parts) for _ in range(rng.randint(1, 3))) for _ in range(n)})


SRC_WORDS = words("ka to mi ren sal bo lu ne fa gi do pe", 120, seed=1)
TGT_WORDS = words("sch ung ei ach ber ost lin quo zwe wu xa yil", 120, seed=2)


def sentences(words: list[str], n: int = 400, seed: int = 0) -> list[str]:
    """Random sentences of 3-10 words over a small word list."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 10))) for _ in range(n)]


SRC = sentences(SRC_WORDS, seed=1)
TGT = sentences(TGT_WORDS, seed=2)


def cfg(**kw) -> DataConfig:
    return DataConfig(**{"vocab_size": 40, **kw})


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
@pytest.mark.parametrize("shared", [True, False])
def test_special_ids_and_vocab_size(tmp_path, kind, shared):
    tok = train_tokenizer(SRC, TGT, tmp_path, cfg(tokenizer=kind, shared_vocab=shared))
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tok.src_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.tgt_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.src_vocab_size == tok.tgt_vocab_size == 40
    files = {p.name for p in tmp_path.iterdir()}
    expected = {"spm.model", "spm.vocab"} if shared else {"src.model", "src.vocab", "tgt.model", "tgt.vocab"}
    assert files == expected  # and no temporary directory left behind


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
@pytest.mark.parametrize("shared", [True, False])
def test_round_trip_and_load(tmp_path, kind, shared):
    tok = train_tokenizer(SRC, TGT, tmp_path, cfg(tokenizer=kind, shared_vocab=shared))
    src_ids, tgt_ids = tok.encode_src(SRC[:50]), tok.encode_tgt(TGT[:50])
    assert tok.decode_tgt(tgt_ids) == TGT[:50]
    assert all(BOS_ID not in s and EOS_ID not in s and UNK_ID not in s for s in src_ids + tgt_ids)
    # The pieces spell out the sentence (for attention plot labels).
    assert "".join(tok.src_pieces(src_ids[0])).replace("\u2581", " ").strip() == SRC[0]

    loaded = Tokenizer.load(tmp_path)
    assert loaded.shared == shared
    assert loaded.fingerprint() == tok.fingerprint()
    assert loaded.encode_src(SRC[:50]) == src_ids
    assert loaded.encode_tgt(TGT[:50]) == tgt_ids


def test_decode_skips_special_ids(tmp_path):
    tok = train_tokenizer(SRC, TGT, tmp_path, cfg())
    ids = tok.encode_tgt([TGT[0]])[0]
    assert tok.decode_tgt([[BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]]) == [TGT[0]]


def test_shared_vs_separate(tmp_path):
    shared = train_tokenizer(SRC, TGT, tmp_path / "shared", cfg(shared_vocab=True))
    separate = train_tokenizer(SRC, TGT, tmp_path / "separate", cfg(shared_vocab=False))
    text = [TGT[0]]
    # One model: both sides encode the same text identically.
    assert shared.encode_src(text) == shared.encode_tgt(text)
    # Per language: the source model never saw the target words, so it splits them differently.
    assert separate.encode_src(text) != separate.encode_tgt(text)
    assert len(separate.encode_src(text)[0]) > len(separate.encode_tgt(text)[0])
    assert shared.fingerprint() != separate.fingerprint()


def test_fingerprint_is_sha256_of_model_file(tmp_path):
    tok = train_tokenizer(SRC, TGT, tmp_path, cfg())
    assert tok.fingerprint() != train_tokenizer(SRC, TGT, tmp_path / "other", cfg(vocab_size=35)).fingerprint()
    data = (tmp_path / "spm.model").read_bytes()
    assert Tokenizer(data).fingerprint() == tok.fingerprint()
    assert len(tok.fingerprint()) == 64
    assert tok.fingerprint() != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_training_is_deterministic(tmp_path, kind):
    a = train_tokenizer(SRC, TGT, tmp_path / "a", cfg(tokenizer=kind))
    b = train_tokenizer(iter(SRC), iter(TGT), tmp_path / "b", cfg(tokenizer=kind))
    assert (tmp_path / "a" / "spm.model").read_bytes() == (tmp_path / "b" / "spm.model").read_bytes()
    assert a.fingerprint() == b.fingerprint()


def test_vocab_too_large_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size 5000 is too large for this corpus; .* at most \d+"):
        train_tokenizer(SRC[:20], TGT[:20], tmp_path, cfg(vocab_size=5000))
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_no_sentences_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no sentences"):
        train_tokenizer(["", "  "], [], tmp_path, cfg())


def test_load_without_model_names_the_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"spm\.model.*src\.model.*tgt\.model"):
        Tokenizer.load(tmp_path)


def test_retraining_with_other_layout_replaces_files(tmp_path):
    train_tokenizer(SRC, TGT, tmp_path, cfg(shared_vocab=True))
    tok = train_tokenizer(SRC, TGT, tmp_path, cfg(shared_vocab=False))
    assert not (tmp_path / "spm.model").exists()
    assert not Tokenizer.load(tmp_path).shared
    assert Tokenizer.load(tmp_path).fingerprint() == tok.fingerprint()


def test_save_round_trip(tmp_path):
    tok = train_tokenizer(SRC, TGT, tmp_path / "a", cfg(shared_vocab=False))
    tok.save(tmp_path / "b")
    assert Tokenizer.load(tmp_path / "b").fingerprint() == tok.fingerprint()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "src.model",
        "src.vocab",
        "tgt.model",
        "tgt.vocab",
    ]
