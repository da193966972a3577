"""The Multi30k German->English recipe, end to end: tokenizer, binarize, train, average, tune on val, evaluate.

    python benchmarks/multi30k.py --data ../shared/data/multi30k            # the 60-minute recipe
    python benchmarks/multi30k.py --data ../shared/data/multi30k --ablation-steps 700   # + the ablation
    python benchmarks/multi30k.py --ablation-only --ablation-steps 700   # the ablation only, into the results

Training is `nanomt train configs/multi30k_de_en.yaml` (re-running resumes, or does nothing if it finished).
Checkpoint choice (best-BLEU, last, averages of the last N), beam size and length penalty are chosen on val;
test2016 is decoded by `nanomt evaluate` for the final number (float32 and int8) and the 30-minute checkpoint.
With --members N, N copies train at once (seeds 1..N, run_dir/member_K, the cores split between them): each
one's checkpoint is chosen on val on its own, and beam and length penalty for their ensemble.
Writes benchmarks/results/multi30k_de_en.json and the training-curve plot beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from nanomt import checkpoint as ckpt
from nanomt.config import load_config
from nanomt.evaluate import evaluate
from nanomt.plots import plot_curves, read_metrics
from nanomt.train import cpu_has_bf16_kernels
from nanomt.translate import Translator

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NANOMT = [sys.executable, "-m", "nanomt.cli"]


def data_overrides(data: Path) -> list[str]:
    """--set arguments pointing the config at the Multi30k files in `data`."""
    files = {"train": "train", "valid": "val", "test": "test2016"}
    return [
        f"data.{split}.{side}={data / f'{name}.{lang}'}"
        for split, name in files.items()
        for side, lang in (("src", "de"), ("tgt", "en"))
    ]


def train_command(config: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    """The `nanomt train` command line for a run directory and its --set overrides."""
    cmd = [*NANOMT, "train", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def run_training(config: Path, run_dir: Path, overrides: list[str], log: Path | None = None) -> None:
    """`nanomt train`, in a subprocess so its threads and memory are its own; its output to `log` if given."""
    cmd = train_command(config, run_dir, overrides)
    if log is None:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        return
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)


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
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--pairs", type=int, default=pairs)
    p.add_argument("--out", type=Path, default=RESULTS / out)
    return p.parse_args()


def write_step_timings(out: Path, config: Path, steps: int, warmup: int, runs: dict, speedup: list, **extra) -> None:
    """Write an A/B of `timed_run`s (each setting's runs, the speedup per pair, the machine); print the speedups."""
    result = {
        "config": str(config.relative_to(ROOT)),
        **extra,
        "steps_per_run": steps,
        "warmup_steps_excluded": warmup,
        "runs": runs,
        "speedup_per_pair": speedup,
        "machine": machine(),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(speedup), f"\nwrote {out}")


def shown(path: Path) -> str:
    """A path as the results file names it: relative to the repository where it lies inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def member_dirs(run_dir: Path, members: int) -> list[Path]:
    """The run directory of each model: the run dir itself for one, run_dir/member_K for an ensemble."""
    return [run_dir] if members == 1 else [run_dir / f"member_{k}" for k in range(1, members + 1)]


def train_members(config: Path, run_dir: Path, overrides: list[str], members: int) -> list[Path]:
    """Train the recipe once, or `members` times at once (seeds 1..N, the cores split between them)."""
    runs = member_dirs(run_dir, members)
    if members == 1:
        run_training(config, run_dir, overrides)
        return runs
    threads = max(1, (os.cpu_count() or 1) // members)
    jobs = [
        (member, [*overrides, f"train.num_threads={threads}", f"train.seed={k}"]) for k, member in enumerate(runs, 1)
    ]
    train_side_by_side(config, jobs)
    return runs


def train_side_by_side(config: Path, jobs: list[tuple[Path, list[str]]]) -> None:
    """Run `nanomt train` for every (run dir, overrides) at once, each one's output to RUN_DIR.log; wait for all."""
    procs = []
    for run_dir, overrides in jobs:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        cmd = train_command(config, run_dir, overrides)
        print("$", " ".join(cmd), f"> {run_dir}.log", flush=True)
        with open(run_dir.with_suffix(".log"), "a") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    if any(codes):
        logs = ", ".join(f"{run_dir}.log" for run_dir, _ in jobs)
        sys.exit(f"{Path(sys.argv[0]).name}: error: training exited with {codes} (logs: {logs})")


def machine() -> dict:
    """CPU model, threads, versions and the git commit, for the results file."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    import sacrebleu
    import sentencepiece

    return {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "bf16_kernels": cpu_has_bf16_kernels(),  # train.precision=auto: bf16 if true, else fp32
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sacrebleu": sacrebleu.__version__,
        "sentencepiece": sentencepiece.__version__,
        "git_commit": commit,
    }


def training_summary(run_dir: Path) -> dict:
    """Steps, wall seconds and mean tokens/s from metrics.jsonl."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "valid_bleu" in r]
    return {
        "steps": max(r["step"] for r in rows),  # the last step may come after the last log row
        "epochs": max(r["epoch"] for r in rows),
        "train_wall_seconds": max(r["elapsed_s"] for r in rows),
        # None for a run shorter than one log interval (a smoke test)
        "tokens_per_s": round(sum(r["tokens_per_s"] for r in train_rows) / len(train_rows), 1) if train_rows else None,
        "best_valid_greedy_bleu": max((r["valid_bleu"] for r in evals), default=None),
        "valid_greedy_bleu_curve": [(r["step"], r["elapsed_s"], r["valid_bleu"]) for r in evals],
    }


def with_decoding(src: Path, out: Path, state: dict | None, beam: int, length_penalty: float) -> Path:
    """A complete checkpoint dir at `out` whose config carries the chosen decoding settings."""
    config_path, tokenizer_dir = ckpt.find_run_files(src)
    cfg = load_config(config_path)
    cfg = dataclasses.replace(
        cfg, decode=dataclasses.replace(cfg.decode, beam_size=beam, length_penalty=length_penalty)
    )
    if state is None:
        state = ckpt.read_weights(src / ckpt.WEIGHTS)
    return ckpt.write_checkpoint_dir(out, cfg, tokenizer_dir, state)


def val_bleu(paths: list[Path], data: Path, beam: int, length_penalty: float | None = None) -> float:
    """BLEU of a checkpoint (or an ensemble of them) on val, the only split used for choices."""
    kwargs = {} if length_penalty is None else {"length_penalty": length_penalty}
    translator = Translator.from_checkpoints(paths)
    report = evaluate(translator, data / "val.de", data / "val.en", beam_size=beam, **kwargs)
    return report["bleu"]


def choose_checkpoint(run_dir: Path, data: Path, work: Path) -> tuple[Path, list[dict]]:
    """Best-BLEU weights, the last step, and averages of the last N checkpoints, compared on val with beam 5."""
    steps = ckpt.step_dirs(run_dir)
    candidates = {"best_valid_bleu": run_dir, "last": steps[-1][1]}
    for n in (4, 8, 12):
        if len(steps) >= n:
            candidates[f"average_last_{n}"] = ckpt.average_checkpoints([p for _, p in steps[-n:]], work / f"avg{n}")
    table = []
    for name, path in candidates.items():
        table.append({"checkpoint": name, "val_bleu_beam5": round(val_bleu([path], data, 5), 2)})
        print(table[-1], flush=True)
    best = max(table, key=lambda r: r["val_bleu_beam5"])
    return candidates[best["checkpoint"]], table


def choose_decoding(paths: list[Path], data: Path) -> tuple[int, float, list[dict]]:
    """Beam size and GNMT length penalty, chosen on val."""
    table = []
    for beam, lp in ((5, 0.6), (5, 1.0), (5, 1.4), (5, 1.8), (5, 2.2), (8, 1.4), (3, 1.4)):
        table.append({"beam": beam, "length_penalty": lp, "val_bleu": round(val_bleu(paths, data, beam, lp), 2)})
        print(table[-1], flush=True)
    best = max(table, key=lambda r: r["val_bleu"])
    return best["beam"], best["length_penalty"], table


def nanomt_evaluate(paths: list[Path], data: Path, split: str = "test2016", int8: bool = False) -> dict:
    """`nanomt evaluate --json` on a split (several checkpoints: their ensemble): the number in the results."""
    cmd = [
        *NANOMT,
        "evaluate",
        *map(str, paths),
        "--src",
        str(data / f"{split}.de"),
        "--ref",
        str(data / f"{split}.en"),
        "--json",
        *(["--int8"] if int8 else []),
    ]
    print("$", " ".join(cmd), flush=True)
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def checkpoint_at_minutes(run_dir: Path, minutes: float) -> tuple[int, Path] | None:
    """The last checkpoint written within the first `minutes` of training."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    elapsed = {r["step"]: r["elapsed_s"] for r in rows if "loss" in r}
    inside = [(s, p) for s, p in ckpt.step_dirs(run_dir) if s in elapsed and elapsed[s] <= minutes * 60]
    return inside[-1] if inside else None


def ablation(config: Path, data: Path, root: Path, steps: int) -> list[dict]:
    """Short runs differing in one choice each, compared on val (greedy during training, beam 5 at the end)."""
    base = data_overrides(data) + [
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        # The recipe's warmup, then inverse-sqrt decay: a short run keeps learning instead of ending at lr 0,
        # so the comparison shows how fast each variant learns, not how a shrunk schedule lands.
        "train.schedule=inverse_sqrt",
        # The recipe's reversed-pairs epochs fill its first ~1,700 steps: a short run would be all of them.
        "train.bidirectional_epochs=0",
        f"train.eval_every={steps}",
        f"train.save_every={steps}",
    ]
    variants = {  # label: (run directory name, overrides)
        "recipe (post-norm, sinusoidal, label smoothing 0.1, init N(0, 0.02))": ("recipe", []),
        "pre-norm": ("pre_norm", ["model.norm_first=true"]),
        "learned positions": ("learned_positions", ["model.positional=learned"]),
        "label smoothing 0": ("no_label_smoothing", ["train.label_smoothing=0.0"]),
        "Xavier init (N(0, d^-0.5) embeddings)": ("xavier_init", ["model.init_std=null"]),
    }
    rows = []
    for name, (dirname, extra) in variants.items():
        run_dir = root / dirname
        run_training(config, run_dir, base + extra)
        summary = training_summary(run_dir)
        rows.append(
            {
                "variant": name,
                "overrides": extra,
                "steps": summary["steps"],
                "train_wall_seconds": summary["train_wall_seconds"],
                "val_bleu_greedy": summary["best_valid_greedy_bleu"],
                "val_bleu_beam5": round(val_bleu([ckpt.step_dirs(run_dir)[-1][1]], data, 5), 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "multi30k_de_en")
    p.add_argument("--ablation-steps", type=int, default=0, help="also run the ablation, this many steps each")
    p.add_argument("--ablation-only", action="store_true", help="add the ablation to an existing results file")
    p.add_argument("--out", type=Path, default=RESULTS / "multi30k_de_en.json")
    p.add_argument(
        "--members",
        type=int,
        default=1,
        help="train N models at once (seeds 1..N, cores split) and decode their ensemble",
    )
    args = p.parse_args()
    if args.members < 1:
        p.error("--members must be >= 1")
    if args.ablation_only and args.ablation_steps <= 0:
        p.error("--ablation-only needs --ablation-steps N (N > 0)")
    data, run_dir = args.data.resolve(), args.run_dir
    for f in ("train.de", "train.en", "val.de", "val.en", "test2016.de", "test2016.en"):
        if not (data / f).is_file():
            sys.exit(f"multi30k.py: error: {data / f} not found (give the data directory with --data)")
    torch.set_num_threads(os.cpu_count() or 1)
    if args.ablation_only:
        result = json.loads(args.out.read_text())
        result["ablation_on_val"] = ablation(
            args.config, data, ROOT / "runs" / "multi30k_ablation", args.ablation_steps
        )
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
        return

    start = time.time()
    runs = train_members(args.config, run_dir, data_overrides(data), args.members)
    members = []
    for run in runs:
        chosen, checkpoints = choose_checkpoint(run, data, run / "selection")
        model, cfg, _ = ckpt.load_checkpoint(chosen)
        members.append(
            {
                "run_dir": shown(run.resolve()),
                "seed": cfg.train.seed,
                "parameters": model.num_parameters(),
                **training_summary(run),
                "chosen": chosen,
                "chosen_checkpoint": max(checkpoints, key=lambda r: r["val_bleu_beam5"])["checkpoint"],
                "checkpoint_selection_on_val": checkpoints,
            }
        )
    beam, lp, decoding = choose_decoding([m["chosen"] for m in members], data)
    # Every checkpoint gets the decoding settings (an ensemble decodes with its first one's).
    finals = [with_decoding(m.pop("chosen"), run / "final", None, beam, lp) for m, run in zip(members, runs)]
    test = nanomt_evaluate(finals, data)
    print(f"test2016: BLEU {test['bleu']:.2f}, chrF {test['chrf']:.2f}", flush=True)
    test_int8 = nanomt_evaluate(finals, data, int8=True)  # the same checkpoints and decoding, int8 linear layers
    print(f"test2016 int8: BLEU {test_int8['bleu']:.2f}, chrF {test_int8['chrf']:.2f}", flush=True)

    at30 = [checkpoint_at_minutes(run, 30) for run in runs]
    result_30 = None
    if all(at30):
        paths30 = [
            with_decoding(p30, run / "selection" / "at_30_minutes", None, beam, lp) for (_, p30), run in zip(at30, runs)
        ]
        r = nanomt_evaluate(paths30, data)
        steps30 = [step for step, _ in at30]
        result_30 = {"step": steps30[0] if len(runs) == 1 else steps30, "bleu": r["bleu"], "chrf": r["chrf"]}

    cfg = load_config(runs[0] / ckpt.CONFIG)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = args.out.stem + "_curves"
    names = [f"{stem}.png"] if len(runs) == 1 else [f"{stem}_member_{k}.png" for k in range(1, len(runs) + 1)]
    curves = [plot_curves(run / "metrics.jsonl", args.out.with_name(n)) for run, n in zip(runs, names)]
    if len(runs) == 1:
        training = {k: v for k, v in members[0].items() if k not in ("run_dir", "seed")}
    else:  # the ensemble: its size and the machine's throughput; each model's numbers under "members"
        training = {
            "ensemble_of": len(runs),
            "parameters": sum(m["parameters"] for m in members),
            "steps": [m["steps"] for m in members],
            "epochs": [m["epochs"] for m in members],
            "train_wall_seconds": max(m["train_wall_seconds"] for m in members),
            "tokens_per_s": round(sum(m["tokens_per_s"] for m in members), 1),
            "members": members,
        }
    result = {
        "task": "Multi30k de->en, test2016, detokenized cased sacreBLEU (13a)",
        "bleu": test["bleu"],
        "chrf": test["chrf"],
        "bleu_signature": test["bleu_signature"],
        "chrf_signature": test["chrf_signature"],
        "test_sentences": test["sentences"],
        "test_decoding_seconds": test["seconds"],
        "test_sentences_per_s": test["sentences_per_s"],
        "int8": {
            "bleu": test_int8["bleu"],
            "chrf": test_int8["chrf"],
            "bleu_cost": round(test["bleu"] - test_int8["bleu"], 2),
            "test_sentences_per_s": test_int8["sentences_per_s"],
            "speedup": round(test_int8["sentences_per_s"] / test["sentences_per_s"], 2),
        },
        "after_30_minutes": result_30,
        **training,
        "decoding_selection_on_val": decoding,
        "beam_size": beam,
        "length_penalty": lp,
        "config": json.loads(json.dumps(dataclasses.asdict(cfg))),
        "baselines_same_machine": {
            "hf_marian_from_scratch_54min": {"bleu": 40.82, "chrf": 60.49},
            "opus_mt_de_en_pretrained": {"bleu": 39.7, "chrf": 60.6},
        },
        "machine": machine(),
        "curves_png": [shown(c) for c in curves] if len(curves) > 1 else shown(curves[0]),
        "recipe_wall_seconds_incl_selection": round(time.time() - start, 1),
    }
    if args.ablation_steps > 0:
        result["ablation_on_val"] = ablation(
            args.config, data, ROOT / "runs" / "multi30k_ablation", args.ablation_steps
        )
    elif args.out.is_file():  # keep an earlier ablation when only the main recipe is re-run
        result["ablation_on_val"] = json.loads(args.out.read_text()).get("ablation_on_val")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
