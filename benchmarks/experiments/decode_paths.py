"""One decoding code path against the one it replaced, alternated in one process: seconds and translations.

    python -m benchmarks.experiments.decode_paths cache_reorder RUN --src ../shared/data/multi30k/test2016.de
    python -m benchmarks.experiments.decode_paths attention_paths RUN --src ../shared/data/multi30k/test2016.de

cache_reorder: every step of a beam search picks each beam's parent and reorders the decoder's self-attention keys
and values to match. The buffers grow by doubling, so copying them whole (`buffer.index_select(0, index)`, the path
before) copies up to twice the filled positions, and the copy has no room for the next one (write_kv grows it
again); model.select_filled copies the filled positions into a buffer one position longer.

attention_paths: a decoding step's attention has one query a row (self-attention over the cache) or a sentence's
beams on the query axis (cross-attention over the source), a handful against tens of keys; there PyTorch's fused
CPU kernel, built for long sequences, loses to QK^T, softmax, V. model.attention takes the explicit path on the CPU
without gradients up to model.FEW_QUERIES queries; FEW_QUERIES = 0 is the fused kernel everywhere (the path before).

Both paths run on the same Translator, alternated for --reps rounds (the order reversed every other round), float32
and int8, the checkpoint's decoding (beam 5), 2 threads; reported: each round's seconds, the medians' ratio and how
many translations differ. Writes benchmarks/results/CHANGE.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from nanomt.core import model as model_module
from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines
from scripts.common import RESULTS, machine, shown


def alternate_paths(translator, lines: list[str], reps: int, paths: dict) -> tuple[dict, dict]:
    """Translate `lines` with each code path in turn for `reps` rounds (the order reversed every other round, so that
    neither always runs first), after a warm-up; `paths` maps a name to the function that switches to it. Returns
    each path's seconds a round and its last translations."""
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    outputs: dict[str, list[str]] = {}
    translator.translate(lines[:100])  # warm-up: oneDNN's kernels, the allocator
    for r in range(reps):
        for name in list(paths) if r % 2 == 0 else list(paths)[::-1]:
            paths[name]()
            start = time.perf_counter()
            outputs[name] = translator.translate(lines)
            seconds[name].append(round(time.perf_counter() - start, 3))
    return seconds, outputs


def whole_buffer(buffer: torch.Tensor, index: torch.Tensor, filled: int) -> torch.Tensor:
    """The cache reordering before select_filled: every row's whole capacity copied."""
    return buffer.index_select(0, index)


# A change: the model module's attribute it sets, then the path before and the path now.
CHANGES = {
    "cache_reorder": ("select_filled", {"whole_buffer": whole_buffer, "select_filled": model_module.select_filled}),
    "attention_paths": ("FEW_QUERIES", {"fused": 0, "explicit": model_module.FEW_QUERIES}),
}


def compare(translator: Translator, lines: list[str], reps: int, change: str) -> dict:
    """Alternated rounds of both paths over `lines`: the medians' ratio and the translations that differ."""
    attribute, values = CHANGES[change]
    paths = {name: functools.partial(setattr, model_module, attribute, value) for name, value in values.items()}
    try:
        seconds, outputs = alternate_paths(translator, lines, reps, paths)
    finally:
        setattr(model_module, attribute, list(values.values())[-1])
    before, now = values
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "seconds": seconds,
        "median_s": medians,
        "speedup": round(medians[before] / medians[now], 3),
        "differing_translations": sum(a != b for a, b in zip(outputs[before], outputs[now], strict=True)),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("change", choices=sorted(CHANGES))
    p.add_argument("run", type=Path)
    p.add_argument("--src", type=Path, required=True)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/CHANGE.json")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    lines = read_lines(args.src)
    results = {}
    for precision in ("float32", "int8"):
        translator = Translator.from_checkpoint(args.run, int8=precision == "int8")
        results[precision] = compare(translator, lines, args.reps, args.change)
        print(precision, json.dumps(results[precision]), flush=True)
    report = {
        "measures": f"seconds of Translator.translate over --src at the checkpoint's decoding, {args.change}: the "
        "path before against the path now, alternated in one process (benchmarks/experiments/decode_paths.py)",
        "run": shown(args.run),
        "src": shown(args.src),
        "sentences": len(lines),
        "results": results,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    (args.out or RESULTS / f"{args.change}.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
