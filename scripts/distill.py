"""The Multi30k distillation recipe: teachers (the Multi30k recipe's model), a fast student distilled from one, a
student distilled from their ensemble; every row measured in the same run on this machine.

    python -m scripts.distill --data ../shared/data/multi30k                      # 3 teachers, 60 minutes a stage
    python -m scripts.distill --data ../shared/data/multi30k --members 1 --minutes 25 \\
        --out scripts/results/distill_25min.json                                  # one teacher, shorter stages

1. Teachers: `nanomt train configs/multi30k_de_en.yaml` with train.seed 1..--members and --minutes of training,
   each with its checkpoint, beam and length penalty chosen on val (as scripts/multi30k.py chooses them).
2. The fast student: `nanomt distill TEACHER --src train.de --student fast --int8` (the teacher's chosen decoding;
   a 6-layer encoder, a 1-layer decoder), trained --minutes on the translations; its checkpoint and decoding
   chosen on val. With --members > 1, the ensemble's student too: the members translate train.de together, and a
   student of the teacher's own shape (`--student same`, started from the first member) learns their translations
   mixed with the original pairs (`--pairs train.de train.en`, one weight each; docs/experiments.md has the student
   of the translations alone): the ensemble's student is there for quality (one model above each of its members),
   the fast one for speed.
3. Each model's test2016 BLEU and chrF (float32 and int8, `nanomt evaluate`), and its decoding speed as whole
   processes: `nanomt translate --int8` on test2016 at the teacher's beam, and CTranslate2 running the same
   export (int8), the commands alternated round-robin, the median of --reps rounds.
Runs live in runs/<--out's name>/ (re-running resumes each stage or skips it, its choices on val too). Writes --out
with the commit it ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.common import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    NANOMT,
    RECIPE_RESULTS,
    ROOT,
    choose_checkpoint,
    choose_decoding,
    data_overrides,
    git,
    machine,
    nanomt_evaluate,
    run_training,
    shown,
    training_summary,
    with_decoding,
)

CT2 = [sys.executable, "-m", "benchmarks.translate_ct2"]  # its plain CTranslate2 translator, a process of its own


def finalize(run_dir: Path, data: Path) -> dict:
    """The run's checkpoint, beam and length penalty chosen on val, as a checkpoint of its own (final/); a re-run
    takes the choices recorded in selection/choice.json while the run's newest checkpoint is the one they saw."""
    from nanomt.core.checkpoint import step_dirs

    record, newest = run_dir / "selection" / "choice.json", step_dirs(run_dir)[-1][0]
    if record.is_file() and (run_dir / "final").is_dir():
        choice = json.loads(record.read_text(encoding="utf-8"))
        if choice.pop("newest_step") == newest:
            return {"final": run_dir / "final", **choice}
    chosen, checkpoints = choose_checkpoint(run_dir, data, run_dir / "selection")
    beam, lp, decodings = choose_decoding(chosen, data)
    picked = max(checkpoints, key=lambda r: r["val_bleu_beam5"])["checkpoint"]
    choice = {"beam": beam, "length_penalty": lp, "checkpoint": picked, "val": decodings}
    final = with_decoding(chosen, run_dir / "final", beam, lp)
    record.write_text(json.dumps({"newest_step": newest, **choice}, indent=2) + "\n", encoding="utf-8")
    return {"final": final, **choice}


def teacher(seed: int, root: Path, args: argparse.Namespace) -> dict:
    """The recipe model of one seed, trained --minutes, with its choices on val."""
    run_dir = root / f"teacher_seed{seed}"
    fresh, start = not run_dir.exists(), time.time()
    overrides = [*data_overrides(args.data), f"train.seed={seed}", f"train.max_minutes={args.minutes}"]
    run_training(args.config, run_dir, overrides)
    return {"run_dir": run_dir, "stage_seconds": stage_seconds(fresh, start), **finalize(run_dir, args.data)}


def stage_seconds(fresh: bool, start: float) -> float | None:
    """A stage's wall time, known only when it ran whole here: a resumed stage's earlier part is not timed."""
    return round(time.time() - start, 1) if fresh else None


def student(
    name: str, shape: str, teachers: list[dict], root: Path, args: argparse.Namespace, pairs: bool = False
) -> dict:
    """A student of the teachers (an ensemble where several) of the preset `shape`, trained --minutes on their
    translations of train.de (and the train pairs where `pairs`); the translating and the training timed apart
    (distill.log has both)."""
    run_dir = root / name
    train_pairs = ["--pairs", str(args.data / "train.de"), str(args.data / "train.en")] if pairs else []
    cmd = [*NANOMT, "distill", *(str(t["final"]) for t in teachers), "--src", str(args.data / "train.de"),
           "--run-dir", str(run_dir), "--student", shape, "--int8", *train_pairs,
           "--set", f"train.max_minutes={args.minutes}",
           *(x for o in args.student_set for x in ("--set", o))]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    fresh, start = not run_dir.exists(), time.time()
    subprocess.run(cmd, check=True)
    seconds = stage_seconds(fresh, start)
    train_seconds = training_summary(run_dir)["train_wall_seconds"]
    return {
        "run_dir": run_dir,
        "stage_seconds": seconds,
        "teacher_translating_seconds": None if seconds is None else round(seconds - train_seconds, 1),
        **finalize(run_dir, args.data),
    }


def median_seconds(commands: dict[str, list[str]], reps: int) -> dict[str, float]:
    """Each command's median wall time (start to exit), the commands alternated round-robin after a warm-up."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for rep in range(reps + 1):
        for name, cmd in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            if rep:  # the first round warms the page cache
                times[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(ts), 2) for name, ts in times.items()}


def speeds(models: dict[str, dict], beam: int, work: Path, args: argparse.Namespace) -> dict:
    """test2016 as whole processes: nanomt translate --int8 and CTranslate2 int8, each model at `beam`."""
    src = args.data / "test2016.de"
    work.mkdir(parents=True, exist_ok=True)
    commands = {}
    for name, m in models.items():
        ct2_dir = work / f"{name}_ct2"
        if not ct2_dir.is_dir():
            subprocess.run([*NANOMT, "export", "ct2", str(m["final"]), "--out", str(ct2_dir)], check=True)
        nanomt_out, ct2_out = work / f"{name}_nanomt.txt", work / f"{name}_ct2.txt"
        commands[f"{name} nanomt int8"] = [*NANOMT, "translate", str(m["final"]), "-i", str(src), "-o",
                                           str(nanomt_out), "--int8", "--beam", str(beam)]  # fmt: skip
        commands[f"{name} ct2 int8"] = [*CT2, "--ct2", str(ct2_dir), "-i", str(src), "-o", str(ct2_out),
                                        "--compute-type", "int8", "--beam", str(beam)]  # fmt: skip
    return median_seconds(commands, args.reps)


def scores(m: dict, data: Path) -> dict:
    """test2016 BLEU and chrF, float32 and int8, with the model's chosen decoding."""
    fp32, int8 = nanomt_evaluate(m["final"], data), nanomt_evaluate(m["final"], data, int8=True)
    return {"bleu": fp32["bleu"], "chrf": fp32["chrf"], "int8_bleu": int8["bleu"], "int8_chrf": int8["chrf"]}


def minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60, 1)


def row(m: dict, data: Path) -> dict:
    """A model's line of the results: its scores, choices, parameters and time."""
    summary = training_summary(m["run_dir"])
    return {
        **scores(m, data),
        "beam": m["beam"],
        "length_penalty": m["length_penalty"],
        "checkpoint": m["checkpoint"],
        "run_dir": shown(m["run_dir"]),
        "train_minutes": minutes(summary["train_wall_seconds"]),
        **{f"{k}_minutes": minutes(m[f"{k}_seconds"]) for k in ("stage", "teacher_translating") if f"{k}_seconds" in m},
        "steps": summary["steps"],
        "valid_greedy_bleu_curve": summary["valid_greedy_bleu_curve"],
        "selection_on_val": m["val"],
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the teachers' config")
    p.add_argument("--members", type=int, default=3, help="teachers (seeds 1..N); the ensemble's student where > 1")
    p.add_argument("--minutes", type=float, default=60, help="training minutes of each teacher and each student")
    p.add_argument("--student-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config override for the students (nanomt distill --set)")  # fmt: skip
    p.add_argument("--reps", type=int, default=3, help="timed rounds of the speed comparison")
    p.add_argument("--out", type=Path, default=RECIPE_RESULTS / "distill.json")
    args = p.parse_args()
    args.data = args.data.resolve()
    for split in ("train", "val", "test2016"):
        for lang in ("de", "en"):
            if not (args.data / f"{split}.{lang}").is_file():
                sys.exit(f"distill.py: error: {args.data / f'{split}.{lang}'} not found (give --data)")
    return args


def main() -> None:
    args = parse_args()
    root = ROOT / "runs" / args.out.stem
    start = time.time()
    teachers = [teacher(seed, root, args) for seed in range(1, args.members + 1)]
    models = {"teacher": teachers[0], "fast_student": student("fast_student", "fast", teachers[:1], root, args)}
    for k, t in enumerate(teachers[1:], start=2):
        models[f"teacher_seed{k}"] = t
    if args.members > 1:
        models["ensemble_student"] = student("ensemble_student", "same", teachers, root, args, pairs=True)
    rows = {name: row(m, args.data) for name, m in models.items()}
    beam = teachers[0]["beam"]
    timing = speeds({k: v for k, v in models.items() if "seed" not in k}, beam, root / "speed", args)
    teacher_s = timing["teacher nanomt int8"]
    for name in rows:
        if f"{name} nanomt int8" in timing:
            rows[name]["test2016_seconds_nanomt_int8"] = timing[f"{name} nanomt int8"]
            rows[name]["test2016_seconds_ct2_int8"] = timing[f"{name} ct2 int8"]
            rows[name]["speedup_vs_teacher_nanomt"] = round(teacher_s / timing[f"{name} nanomt int8"], 2)
            rows[name]["speedup_vs_teacher_ct2"] = round(timing["teacher ct2 int8"] / timing[f"{name} nanomt int8"], 2)
    whole = all(m["stage_seconds"] is not None for m in models.values())  # no stage resumed an earlier invocation's
    result = {
        "task": "Multi30k de->en, test2016, detokenized cased sacreBLEU (13a) and chrF: teachers (the recipe "
        "model), students distilled from them (nanomt distill: --student fast from the first, --student same from "
        "the ensemble, with the train pairs mixed in); decoding speed as whole processes "
        f"(nanomt translate --int8 and CTranslate2 int8 on the same export, beam {beam}, 2 threads, median of "
        f"{args.reps} alternated rounds); each stage's minutes",
        "minutes_a_stage": args.minutes,
        "members": args.members,
        "beam_for_speed": beam,
        "models": rows,
        "speed_seconds": timing,
        "recipe_minutes": minutes(time.time() - start) if whole else None,
        "data": shown(args.data),
        "commit": git("rev-parse", "HEAD"),
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: {c: v.get(c) for c in ("bleu", "int8_bleu", "speedup_vs_teacher_nanomt")}
                      for k, v in rows.items()}, indent=2))  # fmt: skip
    print(f"wrote {shown(args.out)}")


if __name__ == "__main__":
    main()
