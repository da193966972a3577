"""Documents through a trained model: paragraphs against their lines one by one, and `nanomt translate`'s memory.

    python -m benchmarks.experiments.documents --checkpoint runs/multi30k_de_en [--news DIR] [--src FILE]
                                                                      # benchmarks/results/documents.json

paragraphs: 2-6 consecutive lines of newstest2012.de (sentence_split's paragraphs, benchmarks.harness.paragraphs;
`punctuated`: those whose lines all end in sentence-final punctuation) joined by one space, translated as documents
(split: sentences, pass-through spans, pieces), against each line translated alone and the translations joined by
one space: the share of paragraphs whose two translations are the same text. A line that holds two sentences is
split in the paragraph and not alone, so it counts as a difference.

memory: the peak resident memory of `nanomt translate --beam 1` on files of `--src` lines (Multi30k test2016)
cycled and padded with spaces to 2,500 bytes a line (the tokenizer drops the spaces): 2,000 lines (5 MB) and 20,000
lines (50 MB) read in chunks of --buffer-size 1,000, and 20,000 in one chunk (all of it in memory at once).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import SENTENCE_END, paragraphs
from scripts.common import DEFAULT_NEWS, DEFAULT_SRC, RESULTS, ROOT, machine, shown

DEFAULT_OUT = RESULTS / "documents.json"
PAD_TO = 2500  # bytes a line of the memory test's files
PEAK_RSS = """
import resource, subprocess, sys
cmd, src, dst = sys.argv[1:-2], sys.argv[-2], sys.argv[-1]
with open(src, "rb") as i, open(dst, "wb") as o:
    subprocess.run(cmd, stdin=i, stdout=o, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def paragraph_figures(checkpoint: Path, news: Path, limit: int) -> dict:
    """Paragraphs as documents against their lines one by one."""
    from nanomt.decoding.translate import Translator
    from nanomt.documents import translation as dt

    translator = Translator.from_checkpoint(checkpoint)
    _, n_best, source = dt.for_translator(translator)
    runs = [p for p in paragraphs(news, "de") if all(SENTENCE_END.search(s) for s in p)][:limit]
    start = time.perf_counter()
    alone = [h[0][0] for h in n_best([s for p in runs for s in p])]
    alone_s = time.perf_counter() - start
    expected, i = [], 0
    for p in runs:
        expected.append(" ".join(alone[i : i + len(p)]))
        i += len(p)
    texts = [" ".join(p) for p in runs]
    start = time.perf_counter()
    got = dt.paragraphs(texts, n_best, source, split=True)
    split_s = time.perf_counter() - start
    same = [g.text == e for g, e in zip(got, expected)]
    return {
        "paragraphs": len(runs),
        "lines": sum(map(len, runs)),
        "same_as_lines_one_by_one": sum(same),
        "share": round(sum(same) / len(runs), 4),
        "cut": sum(g.cut for g in got),
        "seconds_lines_alone": round(alone_s, 1),
        "seconds_as_documents": round(split_s, 1),
        "examples_differing": [
            {"paragraph": t, "as_document": g.text, "lines_alone": e}
            for t, g, e, s in zip(texts, got, expected, same)
            if not s
        ][:5],
    }


def peak_mb(checkpoint: Path, src: Path, out: Path, buffer_size: int) -> float:
    """Peak resident memory (MB) of `nanomt translate` reading src from stdin."""
    cmd = [sys.executable, "-m", "nanomt.cli", "translate", str(checkpoint), "--beam", "1"]
    cmd += ["--buffer-size", str(buffer_size)]
    res = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *cmd, str(src), str(out)], capture_output=True, text=True, check=True
    )
    return round(int(res.stdout.strip()) / 1024, 1)


def memory_figures(checkpoint: Path, src_path: Path, work: Path) -> dict:
    """Peak memory on a 5 MB and a 50 MB input, streamed, and the 50 MB one in one chunk."""
    lines = [re.sub(r"\s+", " ", s).strip() for s in src_path.read_text(encoding="utf-8").splitlines()]
    padded = [(s + " " * PAD_TO)[: PAD_TO - 1] + "\n" for s in lines if s and len(s.encode()) < PAD_TO]
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, buffer_size in ((2000, 1000), (20000, 1000), (20000, 20000)):
        path = work / f"input_{n}.txt"
        if not path.is_file():
            path.write_text("".join(padded[i % len(padded)] for i in range(n)), encoding="utf-8")
        start = time.perf_counter()
        peak = peak_mb(checkpoint, path, work / f"out_{n}_{buffer_size}.txt", buffer_size)
        rows.append(
            {
                "lines": n,
                "input_mb": round(path.stat().st_size / 2**20, 1),
                "buffer_size": buffer_size,
                "peak_rss_mb": peak,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--news", type=Path, default=DEFAULT_NEWS)
    p.add_argument("--src", type=Path, default=DEFAULT_SRC)
    p.add_argument("--paragraphs", type=int, default=300, help="the first N punctuated paragraphs")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "documents_benchmark")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    out = {
        "measures": "paragraphs of news lines as documents against their lines one by one; nanomt translate's "
        "peak memory on a small and a large input (module docstring)",
        "checkpoint": shown(args.checkpoint),
        "news": shown(args.news),
        "paragraphs": paragraph_figures(args.checkpoint, args.news, args.paragraphs),
        "memory": memory_figures(args.checkpoint, args.src, args.work),
        "machine": machine(),
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: out[k] for k in ("paragraphs", "memory")}, indent=1, ensure_ascii=False)[:3000])


if __name__ == "__main__":
    main()
