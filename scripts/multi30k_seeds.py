"""The Multi30k recipe over its seeds: mean, standard deviation and range of each score, from the runs' results files.

    python -m scripts.multi30k_seeds scripts/results/multi30k_de_en_seed[123].json \
        --out scripts/results/multi30k_de_en_seeds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scripts.common import git


def scores(run: dict) -> dict[str, float]:
    """The scores of one run: test2016 (float32 and int8) and val with the decoding chosen on val."""
    chosen = max(run["decoding_selection_on_val"], key=lambda r: r["val_bleu"])
    return {
        "test2016_bleu": run["bleu"],
        "test2016_chrf": run["chrf"],
        "test2016_int8_bleu": run["int8"]["bleu"],
        "test2016_int8_chrf": run["int8"]["chrf"],
        "val_bleu": chosen["val_bleu"],
        "steps": run["steps"],
        "tokens_per_s": run["tokens_per_s"],
        "int8_speedup": run["int8"]["speedup"],
    }


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.mean(values), 2),
        "sd": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="results files of scripts.multi30k, one per seed")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs = [json.loads(path.read_text(encoding="utf-8")) for path in args.runs]
    per_run = [scores(run) for run in runs]
    commit = git("rev-parse", "HEAD")
    result = {
        "task": "Multi30k de->en, the recipe (configs/multi30k_de_en.yaml) over seeds: mean, sample sd, min, max",
        "runs": [path.as_posix() for path in args.runs],
        "summary": {key: summarize([r[key] for r in per_run]) for key in per_run[0]},
        "per_run": per_run,
        "commit": commit,  # of the tree that summed the runs up; each run's machine and commit are its own
        "machines": [run.get("machine") for run in runs],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
