"""Latency of one sentence at beam 5: nanomt against CTranslate2, in process and through `nanomt serve --one-lock`.

    python -m benchmarks.latency --checkpoint runs/multi30k_de_en --src ../shared/data/multi30k/test2016.de
    python -m benchmarks.latency --checkpoint RUN --src FILE --requests 8 --rounds 2 --warmup 2 --out latency_quick.json

Each request is one line of --src translated alone at beam 5, timed where its caller sees it:
- nanomt_fp32, nanomt_int8: `Translator.translate([line], beam_size=5)` (what `nanomt translate` does with a
  single line, once loaded) in nanomt's worker process (the translate harness, benchmarks/harness.py);
- ct2_fp32, ct2_int8: `Ct2Translator.translate([line], beam_size=5)` on the same checkpoint's `export ct2`, in
  CTranslate2's worker process, which never imports torch;
- serve_fp32, serve_int8: a running `nanomt serve --one-lock --beam 5 [--int8]` on 127.0.0.1, a POST /translate of
  {"text": [line]} sent from this process over one kept-alive connection, until its JSON answer is read. Skipped,
  with the reason in the results, where fastapi, uvicorn or httpx is missing, or with --no-serve.
The requests are the first --requests non-empty lines, cut into --rounds chunks: each round, every contender sends
its chunk one request after another (starting one contender further along each round, 0.3 s idle between
contenders, so no one's OpenMP threads spin on another's time); before that, --warmup requests each, from the end of
the file. Reported per contender: p50, p95, mean, min and max in ms over all requests, each round's p50 (the
spread) and every sample; nanomt's (and the server's) p50 and p95 as CTranslate2's over its own at the same
precision (above 1: nanomt answers faster); the lines whose translations differ between engines. Every engine
runs --threads threads (default 2); this process imports no torch and only sends requests.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.harness import (
    GAP_S,
    NUM_THREADS,
    PRECISIONS,
    differing,
    engine_processes,
    launch,
    stop,
    translate_machine,
)
from scripts.common import RESULTS, shown

BEAM = 5
SERVE_PACKAGES = ("fastapi", "uvicorn", "httpx")


@dataclass
class Requester:
    """One contender: `send(indices)` translates those lines one request at a time -> (seconds each, texts)."""

    name: str
    send: Callable[[list[int]], tuple[list[float], list[str]]]


def engine_requesters(engines: dict) -> list[Requester]:
    """nanomt's and CTranslate2's workers answering `latency` requests (each line alone, timed in the worker)."""

    def send(proc, precision: str, indices: list[int]) -> tuple[list[float], list[str]]:
        reply = proc.timed("latency", engine=precision, beam=BEAM, indices=indices)
        return reply["seconds"], reply["translations"]

    return [
        Requester(f"{impl}_{precision}", lambda idx, proc=proc, p=precision: send(proc, p, idx))
        for impl, proc in engines.items()
        for precision in PRECISIONS
    ]


def start_server(checkpoint: Path, int8: bool, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    """`nanomt serve --one-lock` on `threads` threads, once /ready answers; the process and its URL."""
    serve_args = [str(checkpoint), "--one-lock", "--beam", str(BEAM), "--no-access-log", *(["--int8"] if int8 else [])]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return launch(serve_args, env, log)


def serve_requester(name: str, url: str, lines: list[str], stack: contextlib.ExitStack) -> Requester:
    """POST /translate of one sentence at a time to a running server, timed from this side of the connection."""
    import httpx

    client = stack.enter_context(httpx.Client(base_url=url, timeout=120))

    def send(indices: list[int]) -> tuple[list[float], list[str]]:
        time.sleep(GAP_S)
        seconds, texts = [], []
        for i in indices:
            start = time.perf_counter()
            res = client.post("/translate", json={"text": [lines[i]], "beam_size": BEAM})
            res.raise_for_status()
            texts += res.json()["translations"]
            seconds.append(time.perf_counter() - start)
        time.sleep(GAP_S)
        return seconds, texts

    return Requester(name, send)


def serve_requesters(args, lines: list[str], tmp: Path, stack: contextlib.ExitStack) -> tuple[list[Requester], str]:
    """The float32 and int8 servers, or none and why."""
    if args.no_serve:
        return [], "skipped: --no-serve"
    missing = [p for p in SERVE_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        return [], f"skipped: {', '.join(missing)} not installed (pip install 'nanomt[serve]')"
    requesters = []
    for precision in PRECISIONS:
        proc, url = start_server(args.checkpoint, precision == "int8", args.threads, tmp / f"serve_{precision}.log")
        stack.callback(stop, proc)
        requesters.append(serve_requester(f"serve_{precision}", url, lines, stack))
    return requesters, "measured: nanomt serve --one-lock, HTTP from this process"


def measure(requesters: list[Requester], chunks: list[list[int]], warmup: list[int]) -> tuple[dict, dict]:
    """Warm-up, then round-robin over the chunks: every contender's seconds per round and its translations."""
    for r in requesters:
        r.send(warmup)
    seconds: dict[str, list[list[float]]] = {r.name: [] for r in requesters}
    texts: dict[str, list[str]] = {r.name: [] for r in requesters}
    for k, chunk in enumerate(chunks):
        shift = k % len(requesters)
        for r in requesters[shift:] + requesters[:shift]:
            s, t = r.send(chunk)
            seconds[r.name].append(s)
            texts[r.name] += t
        line = ", ".join(f"{name} p50 {1000 * np.median(s[-1]):.1f} ms" for name, s in seconds.items())
        print(f"  round {k + 1}/{len(chunks)}: {line}", flush=True)
    return seconds, texts


def latency_row(rounds: list[list[float]]) -> dict:
    """Percentiles over every request, each round's p50, and every sample, in ms."""
    ms = 1000 * np.array([s for chunk in rounds for s in chunk])
    return {
        "requests": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p95_ms": round(float(np.percentile(ms, 95)), 2),
        "mean_ms": round(float(ms.mean()), 2),
        "min_ms": round(float(ms.min()), 2),
        "max_ms": round(float(ms.max()), 2),
        "round_p50_ms": [round(float(np.median(1000 * np.array(c))), 2) for c in rounds],
        "samples_ms": [round(float(x), 2) for x in ms],
    }


def report_rows(seconds: dict, texts: dict) -> tuple[dict, dict]:
    """Rows with the ratios to CTranslate2, and the differing lines between engines."""
    rows = {name: latency_row(rounds) for name, rounds in seconds.items()}
    for name, row in rows.items():
        ct2 = rows.get(f"ct2_{name.rsplit('_', 1)[1]}")
        if ct2 and not name.startswith("ct2"):
            row["p50_x_ct2"] = round(ct2["p50_ms"] / row["p50_ms"], 3)
            row["p95_x_ct2"] = round(ct2["p95_ms"] / row["p95_ms"], 3)
    pairs = {f"{p}_nanomt_vs_ct2": (f"nanomt_{p}", f"ct2_{p}") for p in PRECISIONS}
    pairs |= {f"{p}_serve_vs_nanomt": (f"serve_{p}", f"nanomt_{p}") for p in PRECISIONS}
    pairs |= {"nanomt_int8_vs_fp32": ("nanomt_int8", "nanomt_fp32")}
    compared = {key: differing(texts[a], texts[b]) for key, (a, b) in pairs.items() if a in texts and b in texts}
    return rows, compared


def markdown_table(results: dict) -> str:
    """The table for docs/performance.md."""
    lines = [
        "| engine | precision | p50 ms | p95 ms | mean ms | round p50s ms | x CTranslate2 p50 / p95 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["rows"].items():
        impl, precision = name.rsplit("_", 1)
        ratio = f"{r['p50_x_ct2']:.2f} / {r['p95_x_ct2']:.2f}" if "p50_x_ct2" in r else "-"
        spread = f"{min(r['round_p50_ms']):.1f}-{max(r['round_p50_ms']):.1f}"
        figures = f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['mean_ms']:.1f}"
        lines.append(f"| {impl} | {precision} | {figures} | {spread} | {ratio} |")
    return "\n".join(lines)


def request_lines(path: Path, n: int, warmup: int) -> tuple[list[str], list[int], list[int]]:
    """The file's lines, the first n non-empty ones' indices, and `warmup` from the end."""
    lines = path.read_text(encoding="utf-8").splitlines()
    full = [i for i, line in enumerate(lines) if line.strip()]
    if len(full) < n:
        sys.exit(f"latency.py: error: {path} has {len(full)} non-empty lines, fewer than --requests {n}")
    return lines, full[:n], full[::-1][:warmup]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="run directory (or any checkpoint)")
    p.add_argument("--src", type=Path, required=True, help="source sentences, one a line (test2016.de)")
    p.add_argument("--requests", type=int, default=300, help="requests per contender (default 300)")
    p.add_argument("--rounds", type=int, default=6, help="chunks of the requests, round-robin (default 6)")
    p.add_argument("--warmup", type=int, default=20, help="untimed requests per contender first (default 20)")
    p.add_argument("--no-serve", action="store_true", help="leave out the nanomt serve --one-lock contenders")
    p.add_argument("--threads", type=int, default=NUM_THREADS, help=f"every engine's threads (default {NUM_THREADS})")
    p.add_argument("--out", type=Path, default=RESULTS / "latency.json")
    args = p.parse_args()
    if not 1 <= args.rounds <= args.requests:
        p.error("--rounds must be between 1 and --requests")
    return args


def main() -> None:
    args = parse_args()
    lines, indices, warmup = request_lines(args.src, args.requests, args.warmup)
    chunks = [c.tolist() for c in np.array_split(np.array(indices), args.rounds)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nanomt-latency-") as tmp, contextlib.ExitStack() as stack:
        engines = engine_processes(str(args.checkpoint), args.src.resolve(), Path(tmp), args.threads)
        for proc in engines.values():
            stack.callback(proc.close)
        threads = {"nanomt": engines["nanomt"].info["threads"]}
        if "ct2" in engines:
            threads["ct2"] = engines["ct2"].info["intra_threads"]
        servers, serve_note = serve_requesters(args, lines, Path(tmp), stack)
        requesters = engine_requesters(engines) + servers
        print(f"== {len(indices)} requests of one sentence, beam {BEAM}, {[r.name for r in requesters]}", flush=True)
        seconds, texts = measure(requesters, chunks, warmup)
    rows, compared = report_rows(seconds, texts)
    results = {
        "what": "latency of one sentence at beam 5, per request: nanomt against CTranslate2, in process and through "
        "nanomt serve --one-lock",
        "command": "python -m benchmarks.latency " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": translate_machine({"threads": {**threads, "serve": args.threads}}),
        "checkpoint": shown(args.checkpoint),
        "src": shown(args.src),
        "beam": BEAM,
        "requests_per_contender": len(indices),
        "rounds": args.rounds,
        "warmup_requests_per_contender": len(warmup),
        "serve": serve_note,
        "rows": rows,
        "differing_lines": compared,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(markdown_table(results))
    print(json.dumps(compared), f"\nwrote {shown(args.out)}")


if __name__ == "__main__":
    main()
