"""The Multi30k training step with oneDNN's default kernel cache (1,024) against nanomt's (65,536).

    python -m benchmarks.experiments.step_cache --data ../shared/data/multi30k  # -> benchmarks/results/step_cache.json

Each capacity runs the recipe (`configs/multi30k_de_en.yaml`) through `nanomt train` for two epochs with
evaluation and checkpoints pushed past the end, one after the other on an otherwise idle machine. The batches are
the same in both runs (same seed), so time per epoch compares like with like. Epoch 0 meets every batch shape
for the first time; from epoch 1 on the shapes repeat, which is when a cache large enough to hold them pays.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from nanomt.training.metrics_log import read_metrics
from scripts.common import DEFAULT_CONFIG, DEFAULT_DATA, RESULTS, data_overrides, machine, run_training, shown


def epoch_times(metrics: Path) -> list[dict]:
    """Steps and training seconds of each epoch, from a metrics.jsonl logged at every step."""
    rows = [r for r in read_metrics(metrics) if "loss" in r]
    out, last_elapsed = [], 0.0
    for epoch in sorted({r["epoch"] for r in rows}):
        mine = [r for r in rows if r["epoch"] == epoch]
        seconds = mine[-1]["elapsed_s"] - last_elapsed
        out.append(
            {
                "epoch": epoch,
                "steps": len(mine),
                "seconds": round(seconds, 2),
                "ms_per_step": round(1000 * seconds / len(mine), 1),
            }
        )
        last_elapsed = mine[-1]["elapsed_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--steps", type=int, default=412, help="two epochs of the recipe's batches")
    p.add_argument("--capacities", default="1024,65536")
    p.add_argument("--out", type=Path, default=RESULTS / "step_cache.json")
    args = p.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for capacity in args.capacities.split(","):
            # nanomt only sets a default, so the child's environment decides the capacity.
            os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
            run_dir = Path(tmp) / f"cache_{capacity}"
            overrides = [
                *data_overrides(args.data.resolve()),
                f"train.max_steps={args.steps}",
                "train.max_minutes=null",
                "train.log_every=1",
                "train.eval_every=1000000",
                "train.save_every=1000000",
            ]
            run_training(args.config, run_dir, overrides, log=Path(tmp) / f"cache_{capacity}.log")
            runs[capacity] = epoch_times(run_dir / "metrics.jsonl")
            print(capacity, runs[capacity], flush=True)
    base, *others = args.capacities.split(",")
    speedup = {
        c: [round(b["seconds"] / o["seconds"], 3) for b, o in zip(runs[base], runs[c], strict=True)] for c in others
    }
    result = {
        "config": shown(args.config),
        "steps": args.steps,
        "epochs": runs,
        f"speedup_per_epoch_vs_{base}": speedup,
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(speedup), f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
