"""`nanomt translate`'s decoding with glibc malloc's defaults against nanomt's setting (`keep_freed_memory`).

    python -m benchmarks.experiments.decode_malloc --checkpoint runs/multi30k_de_en \\
        --src ../shared/data/multi30k/test2016.de

Beam search allocates and frees blocks of tens of MB at every step (the (rows, V) scores and their top-k, the
beams' reordered caches); by default glibc gives each block over its mmap threshold pages of its own and returns
them on free, so the next step faults them in again (benchmarks.experiments.malloc measured this for training).
Each setting runs in a child process of its own (the baseline sets GLIBC_TUNABLES to glibc's own default for
`perturb`, a no-op, which makes nanomt leave malloc alone), alternating, --pairs times: load the checkpoint,
translate the first 100 lines once to warm up, then the whole file --reps times at --beam. Per run: median seconds,
sentences/s, the minor page faults and system CPU seconds of the timed translations, and a digest of the output (the
same in both settings: malloc decides where numbers live, not what they are).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import timed_reps
from nanomt.core.runtime import user_allocator_settings
from scripts.common import DEFAULT_RUN, DEFAULT_SRC, RESULTS, ROOT, machine, shown

SETTINGS = {"glibc_default": "glibc.malloc.perturb=0", "nanomt": None}


def child(checkpoint: Path, src: Path, beam: int, reps: int) -> dict:
    """One process' run: what `nanomt translate` does (the malloc setting, then decoding), timed."""
    from nanomt.core import runtime
    from nanomt.decoding.translate import Translator

    applied = runtime.keep_freed_memory()
    translator = Translator.from_checkpoint(checkpoint)
    lines = src.read_text(encoding="utf-8").splitlines()
    translator.translate(lines[:100], beam_size=beam)
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds, outputs = timed_reps(lambda: translator.translate(lines, beam_size=beam), reps)
    after = resource.getrusage(resource.RUSAGE_SELF)
    digests = {hashlib.sha256("\n".join(out).encode()).hexdigest()[:16] for out in outputs}
    median = statistics.median(seconds)
    return {
        "setting_applied": applied,
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(median, 3),
        "sentences_per_s": round(len(lines) / median, 1),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
        "system_cpu_s": round(after.ru_stime - before.ru_stime, 2),
        "output": sorted(digests),
    }


def one_run(args: argparse.Namespace, tunables: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in user_allocator_settings()}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    cmd = [sys.executable, "-m", "benchmarks.experiments.decode_malloc", "--child"]
    cmd += ["--checkpoint", str(args.checkpoint), "--src", str(args.src)]
    cmd += ["--beam", str(args.beam), "--reps", str(args.reps)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN)
    p.add_argument("--src", type=Path, default=DEFAULT_SRC)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "decode_malloc.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.checkpoint, args.src, args.beam, args.reps)))
        return
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for pair in range(args.pairs):
        for name, tunables in SETTINGS.items() if pair % 2 == 0 else reversed(SETTINGS.items()):
            runs[name].append(one_run(args, tunables))
            print(name, pair, {k: v for k, v in runs[name][-1].items() if k != "seconds"}, flush=True)
    speedup = [
        round(a["median_s"] / b["median_s"], 3) for a, b in zip(runs["glibc_default"], runs["nanomt"], strict=True)
    ]
    outputs = {d for r in sum(runs.values(), []) for d in r["output"]}
    result = {
        "what": "Translator.translate of --src at --beam (what nanomt translate decodes), glibc malloc's defaults "
        "against nanomt's keep_freed_memory, each in its own process, alternating; speedup = default / nanomt "
        "median seconds, pair by pair",
        "checkpoint": shown(args.checkpoint),
        "src": shown(args.src),
        "beam": args.beam,
        "reps": args.reps,
        "runs": runs,
        "speedup_per_pair": speedup,
        "outputs_identical": len(outputs) == 1,
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"speedup_per_pair": speedup, "outputs_identical": result["outputs_identical"]}))


if __name__ == "__main__":
    main()
