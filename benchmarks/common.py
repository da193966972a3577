"""What benchmarks share: the repository's paths, a results file's machine and relative paths, and the Multi30k
recipe's training step timed through `nanomt train` for A/B results.

Benchmarks import this module and the package, never the recipes in scripts/ (which import only the package).
Importing it imports no torch: a benchmark timing another toolkit (CTranslate2) stays torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NANOMT = [sys.executable, "-m", "nanomt.cli"]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "multi30k"
DEFAULT_CONFIG = ROOT / "configs" / "multi30k_de_en.yaml"


def shown(path: str | Path) -> str:
    """A path as a results file names it: relative to the repository, never absolute."""
    return os.path.relpath(Path(path).resolve(), ROOT)


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


def timed_run(config: Path, data: Path, run_dir: Path, steps: int, warmup: int, overrides: list[str] = ()) -> dict:
    """Train `steps` steps in a fresh run dir: median and mean ms a step after `warmup`, the child's faults and CPU."""
    from nanomt.training.metrics_log import read_metrics

    overrides = [
        *data_overrides(data),
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        "train.log_every=1",
        "train.eval_every=1000000",
        "train.save_every=1000000",
        "train.progress=false",
        *overrides,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run_training(config, run_dir, overrides, log=run_dir.with_suffix(".log"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    elapsed = [r["elapsed_s"] for r in rows]
    step_s = [b - a for a, b in zip(elapsed, elapsed[1:])][warmup:]
    return {
        "ms_per_step_median": round(1000 * statistics.median(step_s), 1),
        "ms_per_step_mean": round(1000 * statistics.mean(step_s), 1),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
        "system_cpu_s": round(after.ru_stime - before.ru_stime, 2),
        "user_cpu_s": round(after.ru_utime - before.ru_utime, 2),
    }


def step_timing_args(doc: str, pairs: int, out: str) -> argparse.Namespace:
    """The command line of an A/B of `timed_run`s: data, config, steps a run, warmup, pairs, results file."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--pairs", type=int, default=pairs)
    p.add_argument("--out", type=Path, default=RESULTS / out)
    return p.parse_args()


def write_step_timings(out: Path, config: Path, steps: int, warmup: int, runs: dict, speedup: list, **extra) -> None:
    """Write an A/B of `timed_run`s (each setting's runs, the speedup per pair, the machine); print the speedups."""
    result = {
        "config": shown(config),
        **extra,
        "steps_per_run": steps,
        "warmup_steps_excluded": warmup,
        "runs": runs,
        "speedup_per_pair": speedup,
        "machine": machine(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(speedup), f"\nwrote {out}")


def alternate_paths(translator, lines: list[str], reps: int, paths: dict) -> tuple[dict, dict]:
    """Translate `lines` with each code path in turn for `reps` rounds (the order reversed every other round, so that
    neither always runs first), after a warm-up; `paths` maps a name to the function that switches to it. Returns
    each path's seconds a round and its last translations."""
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    outputs: dict[str, list[str]] = {}
    translator.translate(lines[:100])  # warm-up: oneDNN's kernels, the allocator
    for r in range(reps):
        for name in list(paths) if r % 2 == 0 else list(paths)[::-1]:
            paths[name]()
            start = time.perf_counter()
            outputs[name] = translator.translate(lines)
            seconds[name].append(round(time.perf_counter() - start, 3))
    return seconds, outputs
