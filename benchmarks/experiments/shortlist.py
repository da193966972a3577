"""The vocabulary shortlist's BLEU cost and speed: test2016 and the WMT news sets, float32 and int8, beam 5.

    python -m benchmarks.experiments.shortlist RUN --data ../shared/data  # builds RUN/shortlist.json (Multi30k train)

The table is built as `nanomt shortlist RUN --src train.de --tgt train.en` builds it (20 target pieces a source
piece, the 100 most frequent always). Each set is translated with the checkpoint's decoding with and without
Decoding.shortlist, alternated (--reps rounds on test2016, one on the news sets), in this process, 2 threads;
reported: corpus BLEU and chrF (sacreBLEU) of each, the lines that differ, the median seconds and the speed-up, and
the mean number of target pieces a batch decodes over. Writes benchmarks/results/shortlist.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines
from nanomt.training.metrics import score
from scripts.common import NANOMT, RESULTS, ROOT, machine, shown

NEWS = ("news-test2008", "newssyscomb2009", "newstest2009", "newstest2010", "newstest2011", "newstest2012")


def timed(translator: Translator, lines: list[str], on: bool) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = translator.translate(lines, shortlist=on)
    return time.perf_counter() - start, out


def measure(translator: Translator, srcs: list[str], refs: list[str], reps: int) -> dict:
    """BLEU, chrF and median seconds with and without the shortlist, alternated."""
    seconds: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, list[str]] = {}
    for _ in range(reps):
        for on in (False, True):
            s, outputs[on] = timed(translator, srcs, on)
            seconds[on].append(s)
    row = {}
    for on, name in ((False, "off"), (True, "on")):
        scores = score(outputs[on], refs)
        row[name] = {"bleu": round(scores.bleu, 2), "chrf": round(scores.chrf, 2),
                     "seconds": round(statistics.median(seconds[on]), 3)}  # fmt: skip
    row["speedup"] = round(row["off"]["seconds"] / row["on"]["seconds"], 3)
    row["differing_lines"] = sum(a != b for a, b in zip(outputs[False], outputs[True]))
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path)
    p.add_argument("--data", type=Path, required=True, help="the folder holding multi30k/ and news/")
    p.add_argument("--news-lines", type=int, default=300)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS / "shortlist.json")
    args = p.parse_args()
    m30k, news = args.data / "multi30k", args.data / "news"
    built = subprocess.run(
        [*NANOMT, "shortlist", str(args.run), "--src", str(m30k / "train.de"), "--tgt", str(m30k / "train.en")],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    torch.set_num_threads(2)
    sets = {"test2016": (read_lines(m30k / "test2016.de"), read_lines(m30k / "test2016.en"), args.reps)}
    srcs = [x for n in NEWS for x in read_lines(news / f"{n}.de")[: args.news_lines]]
    refs = [x for n in NEWS for x in read_lines(news / f"{n}.en")[: args.news_lines]]
    sets["news"] = (srcs, refs, 1)
    results = {}
    for int8 in (False, True):
        translator = Translator.from_checkpoint(args.run, int8=int8)
        translator.translate(sets["test2016"][0][:50])  # warm-up
        for name, (s, r, reps) in sets.items():
            results[f"{name} {'int8' if int8 else 'float32'}"] = measure(translator, s, r, reps)
            print(name, "int8" if int8 else "float32", results[f"{name} {'int8' if int8 else 'float32'}"], flush=True)
    table = Translator.from_checkpoint(args.run).shortlist
    result = {
        "measures": "corpus BLEU/chrF and median decoding seconds of Translator.translate with and without the "
        "vocabulary shortlist, alternated in one process, checkpoint's decoding (beam 5)",
        "run": shown(args.run),
        "shortlist": built.stdout.strip().replace(str(args.run), shown(args.run)),
        "table": {"source_pieces": len(table.table), "frequent": len(table.frequent)},
        "sets": {"test2016": 1000, "news": f"first {args.news_lines} lines of each of {', '.join(NEWS)}"},
        "results": results,
        "machine": machine(),
        "code": "the commit that adds this file (run on its working tree: machine.git_commit)",
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
