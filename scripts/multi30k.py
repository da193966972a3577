"""The Multi30k German->English recipe, end to end: tokenizer, binarize, train, average, tune on val, evaluate.

    python -m scripts.multi30k --data ../shared/data/multi30k            # the 60-minute recipe
    python -m scripts.multi30k --data ../shared/data/multi30k --set train.seed=2 \\
        --out scripts/results/multi30k_de_en_seed2.json                  # another seed, in runs/multi30k_de_en_seed2
    python -m scripts.multi30k --data ../shared/data/multi30k --ablation-steps 700   # + the ablation
    python -m scripts.multi30k --data ../shared/data/multi30k --ablation-only --ablation-steps 700   # ablation only

Training is `nanomt train configs/multi30k_de_en.yaml` (re-running resumes, or does nothing if it finished), with
the --set overrides given here; the run directory is runs/ and the results file's name unless --run-dir says.
Checkpoint choice (best-BLEU, last, averages of the last N), beam size and length penalty are chosen on val;
test2016 is decoded by `nanomt evaluate` for the final number (float32 and int8) and the 30-minute checkpoint.
Writes scripts/results/multi30k_de_en.json (--out) and the training-curve plot beside it, with the baselines'
test2016 figures as scripts/results/baselines.json records them. Paths in it are relative to the repository, and it
names the commit it ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

from nanomt.core import checkpoint as ckpt
from nanomt.core.config import load_config
from nanomt.plots import plot_curves
from nanomt.training.metrics_log import read_metrics
from scripts.common import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    RECIPE_RESULTS,
    ROOT,
    choose_checkpoint,
    choose_decoding,
    data_overrides,
    machine,
    nanomt_evaluate,
    relative_paths,
    run_training,
    shown,
    training_summary,
    val_bleu,
    with_decoding,
)

DATA_FILES = ("train.de", "train.en", "val.de", "val.en", "test2016.de", "test2016.en")
# The baselines measured outside nanomt on the recipe's machine, with where each comes from.
BASELINES = RECIPE_RESULTS / "baselines.json"


def baselines(path: Path = BASELINES) -> dict:
    """Each baseline's test2016 BLEU and chrF, as the file that records them gives them (a one-line error if it
    cannot be read)."""
    if not path.is_file():
        sys.exit(f"multi30k.py: error: {shown(path)} not found (the file that records the baselines' figures)")
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        found = {name: entry["test2016"] for name, entry in recorded.items() if isinstance(entry, dict)}
        if not found:
            raise ValueError("no baseline with test2016 figures in it")
        return {name: {"bleu": scores["bleu"], "chrf": scores["chrf"]} for name, scores in found.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = f"no {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        sys.exit(f"multi30k.py: error: cannot read the baselines' test2016 figures from {shown(path)}: {reason}")


def checkpoint_at_minutes(run_dir: Path, minutes: float) -> tuple[int, Path] | None:
    """The last checkpoint written within the first `minutes` of training."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    elapsed = {r["step"]: r["elapsed_s"] for r in rows if "loss" in r}
    inside = [(s, p) for s, p in ckpt.step_dirs(run_dir) if s in elapsed and elapsed[s] <= minutes * 60]
    return inside[-1] if inside else None


def ablation(config: Path, data: Path, root: Path, steps: int, overrides: list[str]) -> list[dict]:
    """Short runs differing in one choice each, compared on val (greedy during training, beam 5 at the end)."""
    base = data_overrides(data) + [
        *overrides,
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
                "val_bleu_beam5": round(val_bleu(ckpt.step_dirs(run_dir)[-1][1], data, 5), 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a config override for the recipe's training (and the ablation's), as `nanomt train --set`",
    )
    p.add_argument("--out", type=Path, default=RECIPE_RESULTS / "multi30k_de_en.json")
    p.add_argument("--run-dir", type=Path, help="the recipe's run directory (default: runs/ and the --out name)")
    p.add_argument("--ablation-steps", type=int, default=0, help="also run the ablation, this many steps each")
    p.add_argument("--ablation-only", action="store_true", help="add the ablation to an existing results file")
    args = p.parse_args()
    if args.ablation_only and args.ablation_steps <= 0:
        p.error("--ablation-only needs --ablation-steps N (N > 0)")
    args.run_dir = args.run_dir or ROOT / "runs" / args.out.stem
    return args


def main() -> None:
    args = parse_args()
    data, run_dir = args.data.resolve(), args.run_dir
    for f in DATA_FILES:
        if not (data / f).is_file():
            sys.exit(f"multi30k.py: error: {data / f} not found (give the data directory with --data)")
    torch.set_num_threads(os.cpu_count() or 1)
    ablation_dir = run_dir.with_name(run_dir.name + "_ablation")
    if args.ablation_only:
        result = json.loads(args.out.read_text())
        result["ablation_on_val"] = ablation(args.config, data, ablation_dir, args.ablation_steps, args.overrides)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
        return

    anchors = baselines()  # read before the hour of training: a missing file stops nothing half-done
    start = time.time()
    run_training(args.config, run_dir, data_overrides(data) + args.overrides)
    chosen, checkpoints = choose_checkpoint(run_dir, data, run_dir / "selection")
    model, _, _ = ckpt.load_checkpoint(chosen)
    beam, lp, decoding = choose_decoding(chosen, data)
    final = with_decoding(chosen, run_dir / "final", beam, lp)
    test = nanomt_evaluate(final, data)
    print(f"test2016: BLEU {test['bleu']:.2f}, chrF {test['chrf']:.2f}", flush=True)
    test_int8 = nanomt_evaluate(final, data, int8=True)  # the same checkpoint and decoding, int8 linear layers
    print(f"test2016 int8: BLEU {test_int8['bleu']:.2f}, chrF {test_int8['chrf']:.2f}", flush=True)

    at30 = checkpoint_at_minutes(run_dir, 30)
    result_30 = None
    if at30 is not None:
        step30, path30 = at30
        r = nanomt_evaluate(with_decoding(path30, run_dir / "selection" / "at_30_minutes", beam, lp), data)
        result_30 = {"step": step30, "bleu": r["bleu"], "chrf": r["chrf"]}

    cfg = load_config(run_dir / ckpt.CONFIG)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    curves = plot_curves(run_dir / "metrics.jsonl", args.out.with_name(f"{args.out.stem}_curves.png"))
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
        "data": shown(data),
        "run_dir": shown(run_dir),
        "overrides": args.overrides,
        "parameters": model.num_parameters(),
        **training_summary(run_dir),
        "chosen_checkpoint": max(checkpoints, key=lambda r: r["val_bleu_beam5"])["checkpoint"],
        "checkpoint_selection_on_val": checkpoints,
        "decoding_selection_on_val": decoding,
        "beam_size": beam,
        "length_penalty": lp,
        "config": relative_paths(json.loads(json.dumps(dataclasses.asdict(cfg)))),
        "baselines_same_machine": anchors,
        "machine": machine(),
        "curves_png": shown(curves),
        "recipe_wall_seconds_incl_selection": round(time.time() - start, 1),
    }
    if args.ablation_steps > 0:
        result["ablation_on_val"] = ablation(args.config, data, ablation_dir, args.ablation_steps, args.overrides)
    elif args.out.is_file():  # keep an earlier ablation when only the main recipe is re-run
        result["ablation_on_val"] = json.loads(args.out.read_text()).get("ablation_on_val")
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
