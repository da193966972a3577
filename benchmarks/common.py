"""What the step benchmarks share: the Multi30k recipe's training step timed through `nanomt train`, A/B results.

The recipe's own helpers (its data layout, the training subprocess, the machine and paths of a results file) come
from `scripts.multi30k`, so a benchmark runs the recipe's step exactly as the recipe does.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
from pathlib import Path

from nanomt.plots import read_metrics
from scripts.multi30k import ROOT, data_overrides, machine, run_training, shown

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "multi30k"
DEFAULT_CONFIG = ROOT / "configs" / "multi30k_de_en.yaml"


def timed_run(config: Path, data: Path, run_dir: Path, steps: int, warmup: int, overrides: list[str] = ()) -> dict:
    """Train `steps` steps in a fresh run dir: median and mean ms a step after `warmup`, the child's faults and CPU."""
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
