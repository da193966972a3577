"""Why a one-layer decoder collapses on the Multi30k recipe: controlled runs, each one change from the recipe.

    python -m scripts.shallow_decoder --data ../shared/data/multi30k                    # every variant
    python -m scripts.shallow_decoder --data ../shared/data/multi30k --only pre_norm --steps 1600
    python -m scripts.shallow_decoder --data ../shared/data/multi30k --train-tgt runs/distill/teacher.en \\
        --out scripts/results/experiments/shallow_decoder_teacher.json              # on a teacher's translations

Every variant is configs/multi30k_de_en.yaml with model.n_decoder_layers=1 and the same step budget (the lr
decays to 0 at --steps, whatever the host's speed, so that a slow hour does not move a curve), plus its one
change. Each row is the run's validation curve (greedy BLEU every --eval-every steps) and, for its last weights,
how many of the first 500 validation sources got a translation of their own: a collapsed decoder writes one
sentence for every input. Runs live in runs/shallow_decoder/<variant> (re-running resumes or skips them).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from nanomt.decoding.translate import Translator
from scripts.common import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    RECIPE_RESULTS,
    ROOT,
    data_overrides,
    git,
    machine,
    run_training,
    shown,
    training_summary,
    write_results,
)

# One change each from the recipe's one-layer decoder (its post-norm, lr 1e-3 with 400 warmup steps, dropout 0.3,
# the first 4 epochs bidirectional).
VARIANTS = {
    "recipe": [],
    "pre_norm": ["model.norm_first=true"],
    "lr_5e-4_warmup_1000": ["train.lr=0.0005", "train.warmup_steps=1000"],
    "dropout_0.1": ["model.dropout=0.1"],
    "no_bidirectional": ["train.bidirectional_epochs=0"],
}
DISTINCT_SOURCES = 500


def distinct_outputs(run_dir: Path, src: Path) -> dict:
    """How many distinct translations the first DISTINCT_SOURCES validation sources get, and the most frequent."""
    lines = src.read_text(encoding="utf-8").splitlines()[:DISTINCT_SOURCES]
    counts = Counter(Translator.from_checkpoint(run_dir).translate(lines, beam_size=1))
    [(top, n)] = counts.most_common(1)
    return {"sources": len(lines), "distinct": len(counts), "most_frequent": top, "most_frequent_count": n}


def run_variant(name: str, args: argparse.Namespace) -> dict:
    run_dir = ROOT / "runs" / "shallow_decoder" / (name + args.suffix)
    overrides = [
        *data_overrides(args.data),
        "model.n_decoder_layers=1",
        f"train.max_steps={args.steps}",
        "train.max_minutes=null",
        f"train.eval_every={args.eval_every}",
        "train.keep_last=2",
        *VARIANTS[name],
    ]
    if args.train_tgt is not None:
        overrides.append(f"data.train.tgt={args.train_tgt.resolve()}")
    start = time.perf_counter()
    run_training(args.config, run_dir, overrides)
    summary = training_summary(run_dir)
    return {
        "variant": name,
        "overrides": VARIANTS[name],
        "run_dir": shown(run_dir),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "valid_greedy_bleu_curve": [(step, bleu) for step, _, bleu in summary["valid_greedy_bleu_curve"]],
        "tokens_per_s": summary["tokens_per_s"],
        "best_weights_distinct_outputs": distinct_outputs(run_dir, args.data / "val.de"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with the Multi30k files")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="these variants only")
    p.add_argument("--steps", type=int, default=1600, help="each run's step budget (the lr reaches 0 there)")
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--train-tgt", type=Path, help="train on these targets (a teacher's translations of train.de)")
    p.add_argument("--suffix", default="", help="appended to each run's directory name")
    p.add_argument("--out", type=Path, default=RECIPE_RESULTS / "experiments" / "shallow_decoder.json")
    args = p.parse_args()
    rows = [run_variant(name, args) for name in (args.only or VARIANTS)]
    write_results(
        args.out,
        {
            "task": "Multi30k de->en, configs/multi30k_de_en.yaml with a one-layer decoder: validation greedy BLEU "
            "per variant (one change each from the recipe), the same step budget, and how many validation "
            "sources the best weights translate differently",
            "train_targets": shown(args.train_tgt) if args.train_tgt else "train.en (the references)",
            "steps": args.steps,
            "variants": rows,
            "commit": git("rev-parse", "HEAD"),
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
