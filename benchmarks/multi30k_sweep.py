"""Choosing the Multi30k recipe: full-length variants at the step count each gets in the CPU hour, run side by side.

    python benchmarks/multi30k_sweep.py --data ../shared/data/multi30k --jobs 6 --threads 1 [--only base,l44]

The recipe's budget is 60 minutes of this 2-core CPU, so a variant's budget is a number of steps: the steps
its shape runs in the hour on that CPU (measured with 80-step bf16 runs; `CPU_SECONDS_PER_STEP` below, from
`--measure`). Steps, batches, schedule and seed are the same on any device, so these runs can go on a GPU
(many at once) and still compare what each variant would reach in the CPU hour; only float rounding differs.
Each run is scored on val only: the average of its last 4 checkpoints, beam 5, length penalty 1.0, 1.4 and 1.8.
Writes benchmarks/results/multi30k_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from multi30k import data_overrides, run_training  # noqa: E402

# The committed recipe ran 7,057 steps in its 3,601 s (evaluations included): 0.510 s a step end to end.
RECIPE_STEPS_PER_HOUR = 7057
# bf16 seconds per step of each shape on the 2-core CPU (`--measure`), relative to the recipe's shape.
CPU_SECONDS_PER_STEP: dict[str, float] = {
    "base": 0.427,
    "v6k": 0.41,  # estimated
    "v4k": 0.378,
    "d384": 0.585,
    "d512_drop04": 0.782,
    "l44": 0.465,
    "e6d3": 0.48,
    "l44_v6k": 0.4465,  # estimated: l44 x v6k / base
    "d384_l44": 0.638,  # estimated: d384 x l44 / base
    "l55": 0.503,  # estimated: base + 2 x (l44 - base)
}
# Not timed alone on the CPU (v6k's 80-step timing overlapped other work): interpolated from the timed shapes.
ESTIMATED = ["v6k", "l44_v6k", "d384_l44", "l55"]

# The sweep's base is the 3+3 recipe it was run against; pinned here, since the config has moved on to 4+4.
BASE = ["model.n_encoder_layers=3", "model.n_decoder_layers=3"]
L44 = ["model.n_encoder_layers=4", "model.n_decoder_layers=4"]
D384 = ["model.d_model=384", "model.n_heads=6", "model.d_ff=1536"]
VARIANTS: dict[str, list[str]] = {  # name: overrides of configs/multi30k_de_en.yaml, after BASE
    "base": [],
    "base_seed2": ["train.seed=2"],
    "base_seed3": ["train.seed=3"],
    "bpe_dropout01": ["data.bpe_dropout=0.1"],
    "bpe_dropout005": ["data.bpe_dropout=0.05"],
    "v6k": ["data.vocab_size=6000"],
    "v4k": ["data.vocab_size=4000"],
    "d384": D384,
    "d512_drop04": ["model.d_model=512", "model.n_heads=8", "model.d_ff=2048", "model.dropout=0.4"],
    "l44": L44,
    "l44_seed2": L44 + ["train.seed=2"],
    "l44_seed3": L44 + ["train.seed=3"],
    "l44_v6k": L44 + ["data.vocab_size=6000"],
    "l44_bpe_dropout01": L44 + ["data.bpe_dropout=0.1"],
    "l55": ["model.n_encoder_layers=5", "model.n_decoder_layers=5"],
    "e6d3": ["model.n_encoder_layers=6"],
    "d384_l44": D384 + L44,
    "d384_l44_seed2": D384 + L44 + ["train.seed=2"],
    "drop04": ["model.dropout=0.4"],
}
SHAPE = {  # variants that share another's step time
    **dict.fromkeys(["base_seed2", "base_seed3", "drop04", "bpe_dropout01", "bpe_dropout005"], "base"),
    **dict.fromkeys(["l44_seed2", "l44_seed3", "l44_bpe_dropout01"], "l44"),
    "d384_l44_seed2": "d384_l44",
}


def steps_in_hour(name: str, scale: float = 1.0) -> int:
    """Steps the variant's shape runs in the recipe's CPU hour (times `scale`, for a quick smoke run)."""
    shape = SHAPE.get(name, name)
    ratio = CPU_SECONDS_PER_STEP["base"] / CPU_SECONDS_PER_STEP.get(shape, CPU_SECONDS_PER_STEP["base"])
    return max(8, round(RECIPE_STEPS_PER_HOUR * ratio * scale))


def run_variant(name: str, data: Path, root: Path, config: Path, device: str, threads: int, scale: float) -> dict:
    """Train one variant for its step budget, then score the average of its last 4 checkpoints on val."""
    from nanomt import checkpoint as ckpt
    from nanomt.evaluate import evaluate
    from nanomt.translate import Translator

    steps = steps_in_hour(name, scale)
    run_dir = root / name
    sets = data_overrides(data) + BASE + VARIANTS[name]
    sets += [
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        f"train.eval_every={min(1000, steps)}",  # greedy val BLEU along the way
        f"train.save_every={min(250, steps // 4)}",
        "train.keep_last=4",
        "train.progress=false",
        f"train.device={device}",
        f"train.num_threads={threads}",
    ]
    t0 = time.time()
    run_training(config, run_dir, sets, log=root / f"{name}.log")
    train_s = time.time() - t0
    paths = [p for _, p in ckpt.step_dirs(run_dir)[-4:]]
    avg = ckpt.average_checkpoints(paths, root / f"{name}_avg4")
    translator = Translator.from_checkpoint(avg, device="cuda" if device.startswith("cuda") else "cpu")
    row = {"variant": name, "overrides": VARIANTS[name], "steps": steps, "train_seconds_here": round(train_s)}
    for lp in (1.0, 1.4, 1.8):
        r = evaluate(translator, data / "val.de", data / "val.en", beam_size=5, length_penalty=lp)
        row[f"val_bleu_beam5_lp{lp}"] = r["bleu"]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last_eval = [m for m in metrics if "valid_loss" in m][-1]
    row["final_valid_loss"] = round(last_eval["valid_loss"], 4)
    row["final_train_loss"] = round([m for m in metrics if "loss" in m][-1]["loss"], 4)
    row["epochs"] = max(m["epoch"] for m in metrics)
    print(json.dumps(row), flush=True)
    with open(root / "rows.jsonl", "a") as f:  # as each finishes: a run cut short keeps what it finished
        f.write(json.dumps(row) + "\n")
    return row


def measure(data: Path, root: Path, config: Path) -> dict[str, float]:
    """bf16 CPU seconds per step of each shape: steps 41-80 of an 80-step run (the 40 before warm up)."""
    out = {}
    for shape in sorted({SHAPE.get(n, n) for n in VARIANTS}):
        run_dir = root / f"measure_{shape}"
        sets = data_overrides(data) + BASE + VARIANTS[shape]
        sets += ["train.max_steps=80", "train.max_minutes=null", "train.log_every=40", "train.eval_every=1000"]
        sets += ["train.save_every=1000", "train.valid_bleu_sentences=1", "train.progress=false", "train.device=cpu"]
        run_training(config, run_dir, sets, log=root / f"measure_{shape}.log")
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        at = {r["step"]: r["elapsed_s"] for r in rows if "tokens_per_s" in r}
        out[shape] = round((at[80] - at[40]) / 40, 3)
        print(shape, out[shape], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "multi30k_sweep")
    p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="variants trained at once")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of each step budget (smoke runs)")
    p.add_argument("--collect", type=Path, nargs="*", help="only write the results of run roots made before")
    p.add_argument("--measure", action="store_true", help="time each shape on this CPU (run it alone)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "multi30k_sweep.json")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"multi30k_sweep.py: error: unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    args.root.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve()
    if args.measure:
        print(json.dumps(measure(data, args.root, args.config), indent=2))
        return
    if args.collect:
        for root in args.collect:
            write_results(args.out, collect(root), device)
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda n: run_variant(n, data, args.root, args.config, device, args.threads, args.scale), names))
    write_results(args.out, collect(args.root), device)


def collect(root: Path) -> list[dict]:
    """A row per run directory under `root`: scored rows (rows.jsonl) or, for a run cut short, its progress."""
    scored = {}
    if (root / "rows.jsonl").is_file():
        scored = {r["variant"]: r for r in map(json.loads, (root / "rows.jsonl").read_text().splitlines())}
    rows = []
    for metrics in sorted(root.glob("*/metrics.jsonl")):
        name = metrics.parent.name
        if name not in VARIANTS:
            continue
        m = [json.loads(x) for x in metrics.read_text().splitlines()]
        row = scored.get(name) or {
            "variant": name,
            "overrides": VARIANTS[name],
            "steps": steps_in_hour(name),
            "unfinished_at_step": max(r["step"] for r in m),  # the device call's time limit cut it off
        }
        row["valid_greedy_bleu_curve"] = [[r["step"], round(r["valid_bleu"], 2)] for r in m if "valid_bleu" in r]
        rows.append(row)
    return rows


def write_results(out: Path, rows: list[dict], device: str) -> None:
    """Merge rows into the results file (a variant's newer row replaces its older one)."""
    old = json.loads(out.read_text()) if out.is_file() else {}
    merged = {r["variant"]: r for r in old.get("runs", [])} | {r["variant"]: r for r in rows}
    result = {
        "what": "Multi30k de->en variants at their CPU-hour step budgets; val BLEU (avg of last 4, beam 5)",
        "cpu_seconds_per_step_bf16": CPU_SECONDS_PER_STEP,
        "cpu_seconds_per_step_estimated_for": ESTIMATED,
        "recipe_steps_per_hour": RECIPE_STEPS_PER_HOUR,
        "device": device,
        "runs": list(merged.values()),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
