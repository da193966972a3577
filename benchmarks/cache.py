"""The sentence cache on a page-like workload: each edit of a document sends the whole document again, so most of its
sentences repeat; against the same requests with the cache off, and against a workload with no repeats (the cache's
cost when it never hits).

    python -m benchmarks.cache                              # a tiny toy model trained here in a few seconds
    python -m benchmarks.cache --checkpoint RUN --src FILE --edits 40

In-process (the app through Starlette's TestClient, the default memory:// store): LibreTranslate requests
({"q": document, "source", "target"}) timed to their parsed answer, cache off and on in turns, each side's fastest
of --rounds kept; the answers must be identical. Writes benchmarks/results/cache.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import tiny_run
from scripts.common import RESULTS, git, machine, shown


def page_workload(sentences: list[str], edits: int, per_doc: int) -> list[str]:
    """A document typed and edited: each request is the document so far, one sentence added or changed each time."""
    docs, doc = [], []
    for i in range(edits):
        sentence = sentences[i % len(sentences)]
        if len(doc) < per_doc:
            doc.append(sentence)
        else:
            doc[i % per_doc] = sentence  # an edit of one sentence: the others repeat
        docs.append(" ".join(doc))
    return docs


def fresh_workload(sentences: list[str], edits: int, per_doc: int) -> list[str]:
    """As many requests of as many sentences, none repeated (the cache never hits)."""
    sentences = list(dict.fromkeys(sentences))
    if edits * per_doc > len(sentences):
        raise SystemExit(f"{edits} x {per_doc} sentences without repeats: give a source of that many, or fewer edits")
    return [" ".join(sentences[(i * per_doc + j) % len(sentences)] for j in range(per_doc)) for i in range(edits)]


def timed(app, docs: list[str], pair: tuple[str, str]) -> dict:
    from fastapi.testclient import TestClient

    times, answers = [], []
    with TestClient(app) as c:
        for doc in docs:
            start = time.perf_counter()
            res = c.post("/translate", json={"q": doc, "source": pair[0], "target": pair[1]})
            res.raise_for_status()
            answers.append(res.json()["translatedText"])
            times.append(time.perf_counter() - start)
        metrics = c.get("/metrics").text
    counts = {
        name: float(line.split()[1])
        for line in metrics.splitlines()
        for name in ("nanomt_cache_hits_total", "nanomt_cache_misses_total", "nanomt_sentences_total")
        if line.startswith(name + " ")
    }
    ms = sorted(1000 * t for t in times)
    return {
        "requests": len(times),
        "total_s": round(sum(times), 3),
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2),
        "cache_hits": counts.get("nanomt_cache_hits_total"),
        "cache_misses": counts.get("nanomt_cache_misses_total"),
        "sentences_decoded": counts.get("nanomt_sentences_total"),
        "answers": answers,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None, help="a run to serve (default: a toy model trained here)")
    p.add_argument("--src", default=None, help="source sentences, one a line (default: the toy pair's test set)")
    p.add_argument("--edits", type=int, default=40, help="requests a workload (default %(default)s)")
    p.add_argument("--per-doc", type=int, default=8, help="sentences a document (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each workload; the fastest is kept (default 3)")
    p.add_argument("--out", default=str(RESULTS / "cache.json"))
    args = p.parse_args()

    from nanomt.decoding.translate import Translator
    from nanomt.serve import create_app

    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            run, src = tiny_run(Path(tmp), test=400)
        else:
            run, src = Path(args.checkpoint), Path(args.src)
        translator = Translator.from_checkpoint(run)
        sentences = [s for s in Path(src).read_text(encoding="utf-8").splitlines() if s.strip()]
        app = lambda size: create_app(translator, cache_size=size, access_log=False, languages=("src", "tgt"))  # noqa: E731
        results, pair = {}, ("src", "tgt")
        for name, docs in (
            ("page", page_workload(sentences, args.edits, args.per_doc)),
            ("no_repeats", fresh_workload(sentences, args.edits, args.per_doc)),
        ):
            rounds = [(timed(app(0), docs, pair), timed(app(100_000), docs, pair)) for _ in range(args.rounds)]
            for off, on in rounds:  # in turns, each round a fresh app (an empty cache)
                assert on.pop("answers") == off.pop("answers"), f"{name}: answers differ with the cache"
            off = min((r[0] for r in rounds), key=lambda r: r["total_s"])  # each side's fastest round
            on = min((r[1] for r in rounds), key=lambda r: r["total_s"])
            results[name] = {"cache_off": off, "cache_on": on, "speedup": round(off["total_s"] / on["total_s"], 2)}
    out = {
        "what": "in-process LibreTranslate requests of documents; page: each edit resends the document",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "machine": machine(),
        "checkpoint": shown(run) if args.checkpoint else "a toy-pair model trained here (tiny_run)",
        "edits": args.edits,
        "per_doc": args.per_doc,
        "rounds": args.rounds,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
