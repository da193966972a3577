"""Shared fixtures: a small toy corpus and a tiny training config, made once per test session."""

import os
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from nanomt.core.config import ModelConfig
from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.model import Transformer
from nanomt.core.tokenizer import EOS_ID, PAD_ID, UNK_ID
from nanomt.training.synthetic import write_corpus

# Subprocesses and the tests themselves use 1 thread each, so results do not depend on the machine's core count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
NANOMT = [sys.executable, "-m", "nanomt.cli"]


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped, with the reason, where PyTorch sees no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs these where one is lent)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def random_transformer(seed: int, vocab: int, d_model: int = 32, layers: int = 2, max_positions: int = 64):
    """A tiny random model in eval mode, for decoding tests."""
    cfg = ModelConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=d_model,
        n_heads=2,
        n_encoder_layers=layers,
        n_decoder_layers=layers,
        d_ff=2 * d_model,
        dropout=0.0,
        max_positions=max_positions,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        m = Transformer(cfg).eval()
    with torch.no_grad():
        # Peakier distributions and a likelier EOS: varied outputs, some ending early, few near-ties.
        m.output.weight.mul_(4.0)
        m.output.weight[EOS_ID].mul_(2.0)
    return m


@dataclass(frozen=True)
class MaxLenFn:
    """fairseq's --max-len-a/--max-len-b: a budget of int(a * src_len + b) tokens (Decoding's max_len_a/b)."""

    a: float
    b: int

    def __call__(self, src_len: int) -> int:
        return int(self.a * src_len + self.b)


def max_len_fn(a: float, b: int) -> MaxLenFn:
    return MaxLenFn(a, b)


SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")


def decoding(max_len: int | MaxLenFn, beam_size: int = 1, **settings) -> Decoding:
    """The Decoding of a search test: a budget of `max_len` tokens (or max_len_fn's), any Sampling field samples."""
    a, b = (max_len.a, max_len.b) if isinstance(max_len, MaxLenFn) else (0.0, max_len)
    sampling = {k: settings.pop(k) for k in SAMPLING_FIELDS if k in settings}
    drawn = Sampling(**sampling) if sampling else None
    return Decoding(beam_size=beam_size, max_len_a=a, max_len_b=b, sampling=drawn, **settings)


def tokens(hyps: list[list]) -> list[list[int]]:
    """Each sentence's best hypothesis' tokens (greedy's and sample's one)."""
    return [h[0].tokens for h in hyps]


def random_src(lengths: list[int], seed: int = 0, extra_pad: int = 0, *, vocab: int) -> torch.Tensor:
    """Random sentences of the given lengths (before EOS), right-padded to a common width."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1 + extra_pad), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)  # ids 0-3 are PAD, UNK, BOS, EOS
        src[i, n] = EOS_ID
    return src


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: intra-op threads cost more than they save, and thrash on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory) -> dict[str, Path]:
    """The toy language pair: 3000 training pairs, 100 valid, 100 test."""
    return write_corpus(tmp_path_factory.mktemp("toy"), pairs=3000, seed=0, valid=100, test=100)


def tiny_config(corpus: dict[str, Path], **train) -> dict:
    """A config dict for a model small enough to train in seconds on the toy corpus."""
    cfg = {
        "data": {
            "train": {"src": str(corpus["train.src"]), "tgt": str(corpus["train.tgt"])},
            "valid": {"src": str(corpus["valid.src"]), "tgt": str(corpus["valid.tgt"])},
            "vocab_size": 120,
            "shared_vocab": False,
            "max_len": 48,
        },
        "model": {
            "d_model": 32,
            "n_heads": 2,
            "n_encoder_layers": 1,
            "n_decoder_layers": 1,
            "d_ff": 64,
            "max_positions": 64,
        },
        "train": {
            "max_steps": 30,
            "max_tokens": 600,
            "lr": 3e-3,
            "warmup_steps": 10,
            "log_every": 5,
            "eval_every": 15,
            "save_every": 10,
            "keep_last": 2,
            "valid_bleu_sentences": 20,
            "num_threads": 1,
            "progress": False,
            "calibrate": False,  # a test of the confidence turns it on: others need not pay its decoding
        },
        "decode": {"beam_size": 2, "max_len_a": 1.5, "max_len_b": 5},
    }
    cfg["train"].update(train)
    return cfg


@pytest.fixture(scope="session")
def calibrated_run(toy_corpus, tmp_path_factory) -> Path:
    """A tiny run calibrated when its training ended (its validation set has the 100 sentences needed): read only."""
    from nanomt.core.config import config_from_dict
    from nanomt.training.train import train

    torch.set_num_threads(1)
    cfg = tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60, calibrate=True)
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("calibrated") / "run")


TIED_VOCAB = 50


def tied_pair(seed: int = 0) -> tuple[Transformer, Transformer]:
    """The same random shared-vocabulary model twice: with restrict_output (all ids kept so far) and without."""
    kw = dict(d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0)
    kw.update(share_embeddings=True, tie_output=True, max_positions=64)
    torch.manual_seed(seed)
    full = Transformer(ModelConfig(TIED_VOCAB, TIED_VOCAB, **kw)).eval()
    with torch.no_grad():
        full.output.weight.mul_(8.0)  # peaky distributions: decoding choices are not near-ties
    restricted = Transformer(ModelConfig(TIED_VOCAB, TIED_VOCAB, restrict_output=True, **kw)).eval()
    missing, unexpected = restricted.load_state_dict(full.state_dict(), strict=False)
    assert missing == ["output_mask"] and not unexpected
    return restricted, full


# The ids a restricted test model keeps (restrict_output); PAD is always kept besides.
KEPT = torch.tensor([EOS_ID, UNK_ID, 7, 9, 11, 20, 21, 22, 30, 41, 49])


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """Point the datasets cache into tmp_path and stay offline."""
    datasets = pytest.importorskip("datasets")
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(datasets.config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return home


@pytest.fixture(scope="session")
def lines(toy_corpus) -> list[str]:
    """The toy pair's test sentences (a module may give its own `lines`)."""
    return toy_corpus["test.src"].read_text().splitlines()


@pytest.fixture(scope="session")
def served_run(toy_corpus, tmp_path_factory) -> Path:
    """A tiny run for the server's tests that need a model, not a good one (60 steps): read only."""
    from nanomt.core.config import config_from_dict
    from nanomt.training.train import train

    torch.set_num_threads(1)
    cfg = tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60)
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("served") / "run")


def best_seconds(f, *args, runs: int = 3) -> float:
    """The fastest of `runs` runs of f(*args): the least disturbed by whatever else the machine runs."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.fixture(scope="session")
def redis_server():
    """One real redis-server for the session's tests (each flushes it before it uses it)."""
    from servers import start_redis

    server = start_redis()
    yield server
    server.stop()


def peak_python_memory(fn) -> int:
    """The peak of Python-level allocations (tracemalloc) while fn runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
