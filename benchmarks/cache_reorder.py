"""Beam search's cache reordering: the filled positions copied (model.select_filled) against the whole buffer.

    python -m benchmarks.cache_reorder RUN --src ../shared/data/multi30k/test2016.de

Every step of a beam search picks each beam's parent and reorders the decoder's self-attention keys and values to
match. The buffers grow by doubling, so copying them whole (`buffer.index_select(0, index)`, the path before
select_filled) copies up to twice the filled positions, and the copy has no room for the next one (write_kv grows it
again). select_filled copies the filled positions into a buffer one position longer. Both paths run in this process
on the same Translator, alternated for --reps rounds (order swapped every round), float32 and int8, the checkpoint's
decoding (beam 5), 2 threads; reported: each round's seconds, the medians' ratio and whether the translations are
the same. Writes benchmarks/results/cache_reorder.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, machine, shown
from nanomt.core import model as model_module
from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines

NEW = model_module.select_filled


def whole_buffer(buffer: torch.Tensor, index: torch.Tensor, filled: int) -> torch.Tensor:
    """The path before select_filled: every row's whole capacity copied."""
    return buffer.index_select(0, index)


def compare(translator: Translator, lines: list[str], reps: int) -> dict:
    """Alternated rounds of both paths over `lines`; the medians' ratio and whether the outputs agree."""
    seconds: dict[str, list[float]] = {"whole_buffer": [], "select_filled": []}
    outputs = {}
    translator.translate(lines[:100])  # warm-up: oneDNN's kernels, the allocator
    for r in range(reps):
        order = [("whole_buffer", whole_buffer), ("select_filled", NEW)]
        for name, select in order if r % 2 == 0 else order[::-1]:
            model_module.select_filled = select
            start = time.perf_counter()
            outputs[name] = translator.translate(lines)
            seconds[name].append(round(time.perf_counter() - start, 3))
    model_module.select_filled = NEW
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "seconds": seconds,
        "median_s": medians,
        "speedup": round(medians["whole_buffer"] / medians["select_filled"], 3),
        "same_translations": outputs["whole_buffer"] == outputs["select_filled"],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", type=Path, default=RESULTS / "cache_reorder.json")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    lines = read_lines(args.src)
    results = {}
    for precision in ("float32", "int8"):
        translator = Translator.from_checkpoint(args.run, int8=precision == "int8")
        results[precision] = compare(translator, lines, args.reps)
        print(precision, json.dumps(results[precision]), flush=True)
    report = {
        "measures": "seconds of Translator.translate over --src at the checkpoint's decoding, the cache reordered "
        "by select_filled or by copying whole buffers, alternated in one process",
        "run": shown(args.run),
        "src": shown(args.src),
        "sentences": len(lines),
        "results": results,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
