"""Shared fixtures: a small toy corpus and a tiny training config, made once per test session.

torch is imported where it is used, not at the top: pytest-xdist's controller imports this file (and no test
module) before it starts the workers, which import torch anyway."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import random
import subprocess
import sys
import time
import traceback
import tracemalloc
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from nanomt.core.config import ModelConfig
from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.tokenizer import EOS_ID, PAD_ID, UNK_ID
from nanomt.training.synthetic import write_corpus

if TYPE_CHECKING:
    import torch

    from nanomt.core.model import Transformer

# Subprocesses and the tests themselves use 1 thread each, so results do not depend on the machine's core count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
NANOMT = [sys.executable, "-m", "nanomt.cli"]


def show_warning(message, category, filename, lineno, file=None, line=None):
    """A warning on sys.stderr, as Python shows one."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def tree(folder: Path) -> dict[str, int]:
    """Every file and folder under `folder`, with its last change: equal before and after, nothing was written."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def run_nanomt(*args, input: bytes | str | None = None, text: bool = False, check: bool = False):
    """`nanomt ARGS` run by nanomt.cli.main in this process, as subprocess.run([*NANOMT, *ARGS], input=input,
    capture_output=True, text=text, check=check) gives it, without a second Python and torch to start: stdin is
    `input` (no terminal), stdout and stderr are captured (stderr with the command's log lines and warnings, under
    Python's default warning filters, as a process writes them), the exit status is SystemExit's (an uncaught
    exception: its traceback and 1); it starts with OMP_NUM_THREADS threads, as a process does. The thread count,
    the logging set-up and the standard streams are this process's again afterwards. For a test of what a command
    does: one of the process itself (its imports, signals, terminal, memory, a kill) starts a process."""
    import torch

    from nanomt.cli import main

    argv = [str(a) for a in args]
    data = input.encode() if isinstance(input, str) else input or b""
    streams = sys.stdin, sys.stdout, sys.stderr
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", line_buffering=True)
    root, nanomt_log, threads = logging.getLogger(), logging.getLogger("nanomt"), torch.get_num_threads()
    handlers, levels = root.handlers[:], (root.level, nanomt_log.level)
    root.handlers = []  # main's logging.basicConfig then writes the log lines to the command's stderr
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # a process's start, as NANOMT's inherit it
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()  # Python's default filters, as a process without -W starts with them
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            warnings.showwarning = show_warning
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = sys.stdout.buffer.getvalue(), sys.stderr.buffer.getvalue()
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        root.handlers = handlers
        root.setLevel(levels[0])
        nanomt_log.setLevel(levels[1])
        torch.set_num_threads(threads)
    if text:
        out, err = out.decode(), err.decode()
    if check and code:
        raise subprocess.CalledProcessError(code, ["nanomt", *argv], out, err)
    return subprocess.CompletedProcess(["nanomt", *argv], code, out, err)


def xdist_workers(config) -> int:
    """How many pytest-xdist workers run this session's tests (0 in a session without them)."""
    return getattr(config, "workerinput", {}).get("workercount", 0)


class SerialLock:
    """A lock each test holds while it runs (set-up, call, tear-down) under two or more xdist workers: shared, or
    exclusive for a test marked serial, so that it runs while no other worker runs a test. An exclusive one waiting
    for its turn holds the gate, so that no worker starts another test meanwhile (a turnstile: the shared locks
    cannot keep it waiting for ever), and keeps both until the worker's next test is not serial: the serial tests,
    ordered first, wait once for the test the other worker is running."""

    def __init__(self, path: Path):
        self.gate, self.lock = (os.open(p, os.O_RDWR | os.O_CREAT) for p in (path.with_suffix(".gate"), path))
        self.exclusive = False

    def acquire(self, exclusive: bool) -> None:
        if exclusive and self.exclusive:
            return
        self.release()
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        if not exclusive:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        fcntl.flock(self.lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        self.exclusive = exclusive

    def release(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.exclusive = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under two or more pytest-xdist workers, a test marked serial (a time it measures bounds another) runs while
    no other worker runs a test (SerialLock)."""
    if xdist_workers(item.config) < 2:
        return (yield)
    if not hasattr(item.config, "serial_lock"):  # in the run's folder, above each worker's own
        item.config.serial_lock = SerialLock(Path(item.config.option.basetemp).parent / "serial.lock")
    lock, serial = item.config.serial_lock, item.get_closest_marker("serial") is not None
    lock.acquire(exclusive=serial)
    try:
        return (yield)
    finally:
        if not (serial and nextitem is not None and nextitem.get_closest_marker("serial") is not None):
            lock.release()


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped, with the reason, where PyTorch sees no CUDA GPU. Under two or more xdist
    workers, the tests marked serial come first: one worker runs them all at the start, while the other waits."""
    import torch

    if xdist_workers(config) >= 2:
        items.sort(key=lambda item: item.get_closest_marker("serial") is None)  # stable: the same order otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs these where one is lent)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def random_transformer(seed: int, vocab: int, d_model: int = 32, layers: int = 2, max_positions: int = 64):
    """A tiny random model in eval mode, for decoding tests."""
    import torch

    from nanomt.core.model import Transformer

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
    import torch

    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1 + extra_pad), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)  # ids 0-3 are PAD, UNK, BOS, EOS
        src[i, n] = EOS_ID
    return src


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: intra-op threads cost more than they save, and thrash on a busy machine."""
    import torch

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


def run_files(run: Path) -> dict[str, tuple[int, int]]:
    """Each file of a run directory with its size and modification time: what a test that wrote into it changed."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """train(cfg) for a config dict (tiny_config's, with any change), once per session for each distinct config:
    the modules that train the same config share one run. A shared run is read only (a test that writes into a run
    copies it first, e.g. with shutil.copytree into its tmp_path); one found changed fails the test that asks for
    it, and the session. Each call leaves the process as the training did, the thread count and the random
    generators' states, so that a module's tests start from the same state whichever module trained the run."""
    import torch

    from nanomt.core.config import config_from_dict
    from nanomt.training.train import train

    runs: dict[str, tuple[Path, tuple, dict]] = {}

    def run(cfg: dict) -> Path:
        key = json.dumps(cfg, sort_keys=True)
        if key not in runs:
            path = train(config_from_dict(cfg), tmp_path_factory.mktemp("trained") / "run")
            runs[key] = path, (random.getstate(), np.random.get_state(), torch.get_rng_state()), run_files(path)
        path, (py, np_state, torch_state), files = runs[key]
        if run_files(path) != files:
            pytest.fail(f"the shared run {path} was written into: a test that changes a run must copy it first")
        torch.set_num_threads(cfg["train"]["num_threads"])
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        return path

    yield run
    changed = [str(path) for path, _, files in runs.values() if run_files(path) != files]
    assert not changed, f"shared runs written into: {changed}"


@pytest.fixture(scope="session")
def calibrated_run(toy_corpus, trained) -> Path:
    """A tiny run calibrated when its training ended (its validation set has the 100 sentences needed): read only."""
    import torch

    torch.set_num_threads(1)
    return trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60, calibrate=True))


TIED_VOCAB = 50


def tied_pair(seed: int = 0) -> tuple[Transformer, Transformer]:
    """The same random shared-vocabulary model twice: with restrict_output (all ids kept so far) and without."""
    import torch

    from nanomt.core.model import Transformer

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
KEPT_IDS = [EOS_ID, UNK_ID, 7, 9, 11, 20, 21, 22, 30, 41, 49]


def __getattr__(name: str):
    """KEPT, a tensor of KEPT_IDS: made when a test module imports it."""
    if name != "KEPT":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch

    globals()["KEPT"] = torch.tensor(KEPT_IDS)
    return globals()["KEPT"]


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
def served_run(toy_corpus, trained) -> Path:
    """A tiny run for the tests that need a model, not a good one (60 steps): read only."""
    import torch

    torch.set_num_threads(1)
    return trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))


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
