"""The Multi30k training step with the output layer over the whole shared vocabulary and over the target ids only.

    python -m benchmarks.experiments.output_vocab --data ../shared/data/multi30k  # benchmarks/results/output_vocab.json

The recipe (`configs/multi30k_de_en.yaml`) shares one 8k BPE vocabulary between German and English, and English
targets use about half of its ids. `model.restrict_output: true` (the recipe's setting) scores only those in
training: a smaller output matmul and softmax. Here the recipe runs through `nanomt train` for --steps steps with
`model.restrict_output=false` and `=true`, in A B B A order, --pairs times, each in a fresh run directory that
starts with one tokenizer and binarized corpus made once (the same batches every time: same data, same seed); per
run the mean and median ms a step after --warmup steps. The host's speed drifts by 10-20% within minutes, so only
the short alternating runs, not one long run of each, compare the two.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchmarks.harness import step_timing_args, timed_run, write_step_timings

SETTINGS = {"all_ids": "model.restrict_output=false", "target_ids": "model.restrict_output=true"}


def main() -> None:
    args = step_timing_args(__doc__, pairs=4, out="output_vocab.json")
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    kept = None
    with tempfile.TemporaryDirectory() as tmp:
        prep = Path(tmp) / "prep"  # the tokenizer and binarized corpus, made once
        timed_run(args.config, args.data.resolve(), prep, 2, 0)
        for pair in range(args.pairs):
            # Alternate which setting goes first, so that a drift in the host's speed does not favour one.
            for name in SETTINGS if pair % 2 == 0 else reversed(SETTINGS):
                run_dir = Path(tmp) / f"{name}_{pair}"
                for part in ("tokenizer", "bin"):
                    shutil.copytree(prep / part, run_dir / part)
                r = timed_run(args.config, args.data.resolve(), run_dir, args.steps, args.warmup, [SETTINGS[name]])
                runs[name].append(r)
                print(name, pair, r, flush=True)
                log = run_dir.with_suffix(".log").read_text()
                kept = next((line for line in log.splitlines() if line.startswith("output layer:")), kept)
    speedup = [
        round(a["ms_per_step_mean"] / b["ms_per_step_mean"], 3)
        for a, b in zip(runs["all_ids"], runs["target_ids"], strict=True)
    ]
    write_step_timings(args.out, args.config, args.steps, args.warmup, runs, speedup, output_layer=kept)


if __name__ == "__main__":
    main()
