"""`nanomt translate`'s decoding by two checkouts of nanomt, side by side: did a change make translation slower?

    git worktree add ../nanomt-old COMMIT
    python -m benchmarks.experiments.revisions --old ../nanomt-old --checkpoint runs/multi30k_de_en \\
        --src ../shared/data/multi30k/test2016.de                  # -> benchmarks/results/revisions.json

--old-checkpoint is the same checkpoint as the old code reads it, where its config has keys the old code does not
know (a copy of the run directory with those keys taken out of config.yaml). Each checkout runs in child processes
of its own (its directory first on PYTHONPATH, checked by the path of the nanomt it imports), alternating, --pairs
times: load the checkpoint, translate the first 100 lines to warm up, then the whole file --reps times at --beam.
Per run: median seconds and sentences/s; and the lines whose translations differ between the two (a redesign that
keeps behaviour differs nowhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(checkpoint: Path, src: Path, beam: int, reps: int) -> dict:
    import nanomt
    from nanomt.decoding.translate import Translator

    translator = Translator.from_checkpoint(checkpoint)
    lines = src.read_text(encoding="utf-8").splitlines()
    translator.translate(lines[:100], beam_size=beam)
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = translator.translate(lines, beam_size=beam)
        seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)
    return {
        "nanomt": str(Path(nanomt.__file__).resolve().parent.parent),
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(median, 3),
        "sentences_per_s": round(len(lines) / median, 1),
        "translations": out,
    }


def child_main(argv: list[str]) -> None:
    """A child's command line: one checkout's run, printed as JSON."""
    p = argparse.ArgumentParser()
    for flag, kind in (("--checkpoint", Path), ("--src", Path), ("--beam", int), ("--reps", int)):
        p.add_argument(flag, type=kind, required=True)
    args = p.parse_args(argv)
    print(json.dumps(child(args.checkpoint, args.src, args.beam, args.reps)))


def one_run(checkout: Path, checkpoint: Path, args: argparse.Namespace) -> dict:
    # This file, run as a script in the checkout's directory, imports nothing but the checkout's nanomt.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [sys.executable, __file__, "--child", "--checkpoint", str(checkpoint.resolve())]
    cmd += ["--src", str(args.src.resolve()), "--beam", str(args.beam), "--reps", str(args.reps)]
    proc = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if Path(result.pop("nanomt")) != checkout:
        raise RuntimeError(f"the child imported another nanomt than {checkout}")
    return result


def main() -> None:
    if "--child" in sys.argv:  # in the other checkout: nothing of this one is imported, only that one's nanomt
        child_main([a for a in sys.argv[1:] if a != "--child"])
        return
    from scripts.common import DEFAULT_RUN, DEFAULT_SRC, RESULTS, ROOT, machine, shown

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", type=Path, help="the other checkout (a git worktree)")
    p.add_argument("--new", type=Path, default=ROOT, help="the checkout compared with it (default: this one)")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN)
    p.add_argument("--old-checkpoint", type=Path, help="the checkpoint as the old code reads it (default: the same)")
    p.add_argument("--src", type=Path, default=DEFAULT_SRC)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "revisions.json")
    args = p.parse_args()
    if args.old is None:
        p.error("--old is required")
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    git = ["git", "rev-parse", "--short", "HEAD"]
    commits = {
        name: subprocess.run(git, cwd=d, capture_output=True, text=True).stdout.strip() for name, d in checkouts.items()
    }
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    outputs = {}
    for pair in range(args.pairs):
        for name in ("old", "new") if pair % 2 == 0 else ("new", "old"):
            checkpoint = args.old_checkpoint if name == "old" and args.old_checkpoint else args.checkpoint
            r = one_run(checkouts[name], checkpoint, args)
            outputs[name] = r.pop("translations")
            runs[name].append(r)
            print(name, pair, r, flush=True)
    speedup = [round(a["median_s"] / b["median_s"], 3) for a, b in zip(runs["old"], runs["new"], strict=True)]
    differ = [i for i, (a, b) in enumerate(zip(outputs["old"], outputs["new"], strict=True)) if a != b]
    result = {
        "what": "Translator.translate of --src at --beam by two checkouts, each in its own processes, alternating; "
        "speedup = old / new median seconds, pair by pair",
        "commits": commits,
        "checkpoint": shown(args.checkpoint),
        "src": shown(args.src),
        "beam": args.beam,
        "reps": args.reps,
        "runs": runs,
        "speedup_per_pair": speedup,
        "lines_differing": len(differ),
        "first_differing": differ[:10],
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"speedup_per_pair": speedup, "lines_differing": len(differ)}))


if __name__ == "__main__":
    main()
