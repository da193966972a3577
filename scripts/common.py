"""What the recipes (scripts/) and the benchmarks (benchmarks/) share: the repository's paths and the shared data's,
a results file's machine, commit and relative paths, and `nanomt train` in a process of its own on the Multi30k files.

One module for both, beside the recipes: a benchmark runs what a recipe runs (its config, its data, its training)
and writes a results file as a recipe does, so what they share is the recipes' ground and the benchmarks import it
from here. Recipes and benchmarks import the package and this module, never each other; what only benchmarks share
(timing, worker processes, servers) is benchmarks/harness.py. Importing this module imports neither torch nor
nanomt: a process that must stay without torch (a CTranslate2 worker) imports it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NANOMT = [sys.executable, "-m", "nanomt.cli"]
SHARED_DATA = ROOT.parent / "shared" / "data"  # multi30k/ and news/, beside the checkout
DEFAULT_DATA = SHARED_DATA / "multi30k"  # train, val, test2016 .de/.en
DEFAULT_NEWS = SHARED_DATA / "news"  # the WMT news test sets, .de/.en
DEFAULT_SRC = DEFAULT_DATA / "test2016.de"
DEFAULT_CONFIG = ROOT / "configs" / "multi30k_de_en.yaml"
DEFAULT_RUN = ROOT / "runs" / "multi30k_de_en"  # the recipe's run directory
RESULTS = ROOT / "benchmarks" / "results"
RECIPE_RESULTS = ROOT / "scripts" / "results"


def shown(path: str | Path) -> str:
    """A path as a results file names it: relative to the repository, never absolute."""
    return os.path.relpath(Path(path).resolve(), ROOT)


def relative_paths(obj):
    """`obj` (JSON-like) with every absolute path in it made relative to the repository."""
    if isinstance(obj, dict):
        return {k: relative_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relative_paths(v) for v in obj]
    if isinstance(obj, str) and os.path.isabs(obj):
        return shown(obj)
    return obj


def git(*args: str) -> str:
    """The output of a git command in the repository ('' where git is missing)."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> dict:
    """CPU model, threads, versions and the git commit (and whether the tree differed from it), for a results file."""
    import torch

    from nanomt.core.runtime import cpu_has_bf16_kernels

    return {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "bf16_kernels": cpu_has_bf16_kernels(),  # train.precision=auto: bf16 if true, else fp32
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sacrebleu": metadata.version("sacrebleu"),
        "sentencepiece": metadata.version("sentencepiece"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def write_results(path: Path, result: dict, indent: int = 2) -> None:
    """A results file: `result` as JSON (UTF-8, its folder made if need be); says where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {shown(path)}")


def data_overrides(data: Path) -> list[str]:
    """--set arguments pointing a config at the Multi30k files in `data` (train, val, test2016 .de/.en)."""
    files = {"train": "train", "valid": "val", "test": "test2016"}
    return [
        f"data.{split}.{side}={data / f'{name}.{lang}'}"
        for split, name in files.items()
        for side, lang in (("src", "de"), ("tgt", "en"))
    ]


def run_training(config: Path, run_dir: Path, overrides: list[str], log: Path | None = None) -> None:
    """`nanomt train`, in a subprocess so its threads and memory are its own; its output to `log` if given."""
    cmd = [*NANOMT, "train", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    if log is None:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        return
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)


def training_summary(run_dir: Path) -> dict:
    """Steps, epochs, wall seconds, mean tokens/s and the validation curve, from the run's metrics.jsonl."""
    from nanomt.training.metrics_log import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    logged, evals = [r for r in rows if "loss" in r], [r for r in rows if "valid_bleu" in r]
    return {
        "steps": max(r["step"] for r in rows),  # the last step may come after the last log row
        "epochs": max(r["epoch"] for r in rows),
        "train_wall_seconds": max(r["elapsed_s"] for r in rows),
        # None for a run shorter than one log interval (a smoke test)
        "tokens_per_s": round(sum(r["tokens_per_s"] for r in logged) / len(logged), 1) if logged else None,
        "best_valid_greedy_bleu": max((r["valid_bleu"] for r in evals), default=None),
        "valid_greedy_bleu_curve": [(r["step"], r["elapsed_s"], r["valid_bleu"]) for r in evals],
    }
