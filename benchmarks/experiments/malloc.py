"""The Multi30k training step with glibc malloc's defaults against nanomt's setting (`keep_freed_memory`).

    python -m benchmarks.experiments.malloc --data ../shared/data/multi30k     # -> benchmarks/results/malloc.json

By default glibc gives every block over its mmap threshold (at most 32 MB) pages of its own and returns them to
the kernel on free. A training step allocates and frees several such blocks (the (B*T, V) logits, their
gradient), so the next step faults every page in again. `nanomt train` on a CPU turns mmap off for large blocks
and heap trimming up (`nanomt/core/runtime.py`, `keep_freed_memory`). Here the recipe (`configs/multi30k_de_en.yaml`,
`precision: auto`) runs through `nanomt train` for --steps steps in each setting, alternating, --pairs times; the
batches are the same in every run (same seed). The baseline sets GLIBC_TUNABLES to glibc's own default for
`perturb` (a no-op), which is enough for nanomt to leave malloc alone. Per run: median ms per step after the
first --warmup steps, and the run's minor page faults and system CPU seconds (getrusage of the child).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks.harness import step_timing_args, timed_run, write_step_timings
from nanomt.core.runtime import user_allocator_settings

SETTINGS = {"glibc_default": "glibc.malloc.perturb=0", "nanomt": None}


def one_run(config: Path, data: Path, run_dir: Path, steps: int, warmup: int, tunables: str | None) -> dict:
    """Train `steps` steps in a fresh run directory with these malloc tunables (None: nanomt's setting)."""
    if tunables is not None:  # main() unset the user's allocator variables, so the other setting starts clean
        os.environ["GLIBC_TUNABLES"] = tunables
    try:
        return timed_run(config, data, run_dir, steps, warmup)
    finally:
        os.environ.pop("GLIBC_TUNABLES", None)


def main() -> None:
    args = step_timing_args(__doc__, pairs=2, out="malloc.json")
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
    write_step_timings(
        args.out, args.config, args.steps, args.warmup, runs, speedup, environment_variables_unset=removed
    )


if __name__ == "__main__":
    main()
