"""A cheap A/B for the Multi30k recipe's optimization settings: variants trained side by side, one core each.

    python benchmarks/multi30k_pairs.py --data ../shared/data/multi30k \
        --variant lr1=train.lr=0.001 --variant lr2=train.lr=0.002      # -> results/multi30k_pairs.json

Each variant is the recipe (`configs/multi30k_de_en.yaml`) plus its --set overrides, trained for `--minutes` on the
recipe's clock schedule (linear decay to 0 when the minutes run out) with a warmup shortened in proportion, on one
thread, all variants at once: they share the machine's slowdowns, so their val BLEU compares like with like. Two at
a time on a 2-core CPU (each then runs ~0.6x of a 2-thread run's tokens/s). A short schedule measures how fast a
setting learns, so it answers questions of optimization (learning rate, norm placement), not of regularization
(more dropout always looks worse early). Scored by greedy val BLEU during training; test2016 is never read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from multi30k import (  # noqa: E402
    RESULTS,
    ROOT,
    data_overrides,
    machine,
    shown,
    train_side_by_side,
    training_summary,
)

from nanomt.plots import read_metrics  # noqa: E402


def pair_overrides(data: Path, minutes: float, warmup: int) -> list[str]:
    """What every variant shares: the data, the short clock, one thread, evaluations every 400 steps."""
    return [
        *data_overrides(data),
        f"train.max_minutes={minutes}",
        "train.num_threads=1",
        f"train.warmup_steps={warmup}",
        "train.eval_every=400",
        "train.save_every=100000",  # only the final checkpoint: the comparison reads metrics.jsonl
    ]


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME=SECTION.KEY=VALUE,SECTION.KEY=VALUE' (or just 'NAME=' for the recipe as it is)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant needs NAME=OVERRIDES, got {text!r}")
    return name, [o for o in rest.split(",") if o]


def summary(run_dir: Path) -> dict:
    """`multi30k.training_summary` of one variant's run, with its last losses and greedy val BLEU."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "loss" in r]
    last_eval = [r for r in rows if "valid_bleu" in r][-1]
    return {
        **training_summary(run_dir),
        "final_train_loss": round(train_rows[-1]["loss"], 4) if train_rows else None,
        "final_valid_loss": round(last_eval["valid_loss"], 4),
        "final_val_bleu_greedy": round(last_eval["valid_bleu"], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    p.add_argument("--variant", type=parse_variant, action="append", required=True, help="NAME=OVERRIDES")
    p.add_argument("--minutes", type=float, default=25.0)
    p.add_argument("--warmup", type=int, default=150, help="warmup steps (the recipe's 400 scaled to the clock)")
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "multi30k_pairs")
    p.add_argument("--collect", action="store_true", help="only summarize runs already in --root")
    p.add_argument("--out", type=Path, default=RESULTS / "multi30k_pairs.json")
    args = p.parse_args()
    shared = pair_overrides(args.data.resolve(), args.minutes, args.warmup)
    if not args.collect:
        train_side_by_side(args.config, [(args.root / name, [*shared, *overrides]) for name, overrides in args.variant])
    old = json.loads(args.out.read_text())["runs"] if args.out.exists() else []
    names = {name for name, _ in args.variant}
    runs = [r for r in old if r["variant"] not in names]  # a re-run replaces its old rows
    for name, overrides in args.variant:
        others = sorted(names - {name})  # compare a variant only with those that ran beside it
        runs.append({"variant": name, "overrides": overrides, "ran_with": others, **summary(args.root / name)})
    results = {
        "what": "Multi30k recipe variants side by side, one thread each, on a short clock schedule; greedy val BLEU",
        "minutes": args.minutes,
        "warmup_steps": args.warmup,
        "shared_overrides": [o for o in shared if not o.startswith("data.")],
        "machine": machine(),
        "runs": runs,
    }
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {shown(args.out)}")


if __name__ == "__main__":
    main()
