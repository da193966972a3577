"""The Multi30k training step with glibc malloc's defaults against nanomt's setting (`keep_freed_memory`).

    .venv/bin/python benchmarks/malloc.py --data ../shared/data/multi30k     # -> results/malloc.json

By default glibc gives every block over its mmap threshold (at most 32 MB) pages of its own and returns them to
the kernel on free. A training step allocates and frees several such blocks (the (B*T, V) logits, their
gradient), so the next step faults every page in again. `nanomt train` on a CPU turns mmap off for large blocks
and heap trimming up (`nanomt/train.py`, `keep_freed_memory`). Here the recipe (`configs/multi30k_de_en.yaml`,
`precision: auto`) runs through `nanomt train` for --steps steps in each setting, alternating, --pairs times; the
batches are the same in every run (same seed). The baseline sets GLIBC_TUNABLES to glibc's own default for
`perturb` (a no-op), which is enough for nanomt to leave malloc alone. Per run: median ms per step after the
first --warmup steps, and the run's minor page faults and system CPU seconds (getrusage of the child).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import RESULTS, ROOT, data_overrides, machine, run_training  # noqa: E402

from nanomt.plots import read_metrics  # noqa: E402
from nanomt.train import user_allocator_settings  # noqa: E402

SETTINGS = {"glibc_default": "glibc.malloc.perturb=0", "nanomt": None}


def one_run(config: Path, data: Path, run_dir: Path, steps: int, warmup: int, tunables: str | None) -> dict:
    """Train `steps` steps in a fresh run directory; ms per step, page faults and system time of the child."""
    if tunables is not None:  # main() unset the user's allocator variables, so the other setting starts clean
        os.environ["GLIBC_TUNABLES"] = tunables
    overrides = [
        *data_overrides(data),
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        "train.log_every=1",
        "train.eval_every=1000000",
        "train.save_every=1000000",
        "train.progress=false",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run_training(config, run_dir, overrides, log=run_dir.with_suffix(".log"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.environ.pop("GLIBC_TUNABLES", None)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    elapsed = [r["elapsed_s"] for r in rows]
    step_s = [b - a for a, b in zip(elapsed, elapsed[1:])][warmup:]
    return {
        "ms_per_step_median": round(1000 * statistics.median(step_s), 1),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
        "system_cpu_s": round(after.ru_stime - before.ru_stime, 2),
        "user_cpu_s": round(after.ru_utime - before.ru_utime, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "malloc.json")
    args = p.parse_args()
    removed = user_allocator_settings()  # both settings start from glibc's defaults
    for k in removed:
        print(f"unsetting {k} for the runs", flush=True)
        os.environ.pop(k)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for name, tunables in SETTINGS.items():
                run_dir = Path(tmp) / f"{name}_{pair}"
                r = one_run(args.config, args.data.resolve(), run_dir, args.steps, args.warmup, tunables)
                runs[name].append(r)
                print(name, pair, r, flush=True)
    speedup = [
        round(a["ms_per_step_median"] / b["ms_per_step_median"], 3)
        for a, b in zip(runs["glibc_default"], runs["nanomt"], strict=True)
    ]
    faults = [
        (a["minor_page_faults"], b["minor_page_faults"])
        for a, b in zip(runs["glibc_default"], runs["nanomt"], strict=True)
    ]
    if any(b > a / 2 for a, b in faults):
        print(f"warning: nanomt's setting did not cut the page faults here {faults}", flush=True)
    result = {
        "config": str(args.config.relative_to(ROOT)),
        "environment_variables_unset": removed,
        "steps_per_run": args.steps,
        "warmup_steps_excluded": args.warmup,
        "runs": runs,
        "speedup_per_pair": speedup,
        "machine": machine(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(speedup), f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
