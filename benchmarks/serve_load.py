"""`nanomt serve` under concurrent clients: the one-lock server (--one-lock) against the batching one.

    python -m benchmarks.serve_load --checkpoint RUN --sentences FILE   # benchmarks/results/serve_load.json

For each server kind a real `nanomt serve` process starts on 127.0.0.1 and a free port. After a warm-up (every
level once, --warmup-requests-per-client requests a client, the sentences from the end of the list), 1, 4, 16 and
64 clients (--clients) each send --requests-per-client requests one after another (a client stops early once a
level has run --max-seconds), each request --sentences-per-request lines of FILE, taken in turn. Reported per level:
sentences/s (translated sentences over the level's wall time), request latency p50/p95/p99, errors (any answer but
a 200, or no answer), and from the server's /metrics the mean sentences a decoding batch and the share of the wall
time the model spent decoding. The translations of both servers are compared sentence by sentence (float32:
batching must change none). The load generator runs in this process (asyncio, one connection a client) and takes
its share of the cores: on a 2-core machine the server gets less than 2, for both kinds alike.

    python -m benchmarks.serve_load --models de-en=RUN_A src-tgt=RUN_B --sentences de-en=FILE src-tgt=FILE
                                    --out benchmarks/results/serve_load_many.json

Many models: one batching server serves every run (`nanomt serve PAIR=RUN ...`), client c sends its requests in
pair c mod n (nanomt's API with source and target), and every answer is compared with what that run's own
Translator gives for the same sentences at the server's beam (no cross-talk: a batch never mixes models).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness import launch, stop
from scripts.common import RESULTS, machine, shown

KINDS = {"one_lock": ["--one-lock"], "batching": []}


def start(args: argparse.Namespace, kind: str, log: Path) -> tuple[subprocess.Popen, str]:
    """A `nanomt serve` process of this kind, once /ready answers; its URL."""
    served = args.models or [str(args.checkpoint)]
    serve_args = [*served, "--no-access-log", "--queue-size", "1024", "--timeout", str(args.timeout)]
    serve_args += ["--max-wait-ms", str(args.max_wait_ms), *KINDS[kind]]
    if args.beam is not None:
        serve_args += ["--beam", str(args.beam)]
    if args.max_batch_tokens is not None:
        serve_args += ["--max-batch-tokens", str(args.max_batch_tokens)]
    env = dict(os.environ)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    return launch(serve_args, env, log)


def server_stats(url: str) -> dict[str, float]:
    """The server's batch-size histogram (sum, count; zeros for the one-lock server) and its decoding seconds."""
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)
        for s in family.samples
        if not s.labels
    }
    keys = ("nanomt_batch_sentences_sum", "nanomt_batch_sentences_count", "nanomt_decode_seconds_total")
    return {k: samples.get(k, 0.0) for k in keys}


async def level(
    url: str, clients: int, args: argparse.Namespace, lines: list[str] | dict[str, list[str]], seen: dict
) -> dict:
    """`clients` clients, each sending its requests one after another; sentences/s, latency percentiles, errors.
    `lines` are sentences, or per pair ("de-en") its sentences (many models: client c sends pair c mod n's)."""
    k = args.sentences_per_request
    latencies: list[float] = []
    errors: list[str] = []
    done_sentences = 0
    deadline = time.monotonic() + args.max_seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal done_sentences
        for j in range(args.requests_per_client):
            if time.monotonic() > deadline:
                return
            pair, body = None, {}
            pool = lines
            if isinstance(lines, dict):  # many models: this client's pair
                pair = sorted(lines)[c % len(lines)]
                pool = lines[pair]
                body = dict(zip(("source", "target"), pair.split("-", 1)))
            at = ((c * args.requests_per_client + j) * k) % len(pool)
            texts = [pool[(at + i) % len(pool)] for i in range(k)]
            start = time.perf_counter()
            try:
                res = await http.post("/translate", json={"text": texts, **body})
                latencies.append(time.perf_counter() - start)
                if res.status_code != 200:
                    errors.append(f"{res.status_code}: {res.text[:200]}")
                    continue
                for t, out in zip(texts, res.json()["translations"]):
                    seen[(pair, t) if pair else t] = out
                done_sentences += k
            except httpx.HTTPError as e:
                latencies.append(time.perf_counter() - start)
                errors.append(repr(e)[:200])

    async with httpx.AsyncClient(base_url=url, timeout=args.timeout + 30, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        seconds = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    return {
        "clients": clients,
        "requests": len(latencies),
        "sentences": done_sentences,
        "errors": len(errors),
        "first_errors": errors[:3],
        "seconds": round(seconds, 2),
        "sentences_per_s": round(done_sentences / seconds, 2),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p95_ms": round(float(np.percentile(ms, 95)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
    }


def run_kind(kind: str, args: argparse.Namespace, lines, tmp: Path) -> tuple[list[dict], dict]:
    proc, url = start(args, kind, tmp / f"{kind}.log")
    seen: dict[str, str] = {}
    rows = []
    try:
        # Warm-up at every level: oneDNN compiles a kernel per matrix shape the first time it meets it, and a
        # batching server meets more shapes (sentences x length) than a one-lock one; a server that has run a
        # while has them all.
        warm = argparse.Namespace(**{**vars(args), "requests_per_client": args.warmup_requests_per_client})
        for clients in args.clients:
            reverse = {k: v[::-1] for k, v in lines.items()} if isinstance(lines, dict) else lines[::-1]
            asyncio.run(level(url, clients, warm, reverse, {}))
        for clients in args.clients:
            before = server_stats(url)
            row = asyncio.run(level(url, clients, args, lines, seen))
            d = {k: v - before[k] for k, v in server_stats(url).items()}
            batches = d["nanomt_batch_sentences_count"]
            row["mean_batch_sentences"] = round(d["nanomt_batch_sentences_sum"] / batches, 2) if batches else None
            # The share of the level's wall time the model was decoding: below 1, the server waited for requests.
            row["decoding_share"] = round(d["nanomt_decode_seconds_total"] / row["seconds"], 2)
            rows.append(row)
            print(f"{kind:9s} {clients:3d} clients: {json.dumps(row)}", flush=True)
    finally:
        stop(proc)
    return rows, seen


def read_lines(path: Path, n: int) -> list[str]:
    lines = [x.strip() for x in path.read_text(encoding="utf-8").splitlines() if x.strip()][:n]
    if not lines:
        raise SystemExit(f"{path}: no sentences")
    return lines


def many(args: argparse.Namespace) -> None:
    """One batching server of every run; clients spread over the pairs; every answer checked against its run."""
    from nanomt.decoding.translate import Translator

    runs = dict(spec.split("=", 1) for spec in args.models)
    files = dict(spec.split("=", 1) for spec in args.sentences)
    if set(files) != set(runs):
        raise SystemExit(f"--sentences needs PAIR=FILE for each pair of --models ({', '.join(runs)})")
    lines = {pair: read_lines(Path(f), args.lines) for pair, f in files.items()}
    with tempfile.TemporaryDirectory() as tmp:
        rows, seen = run_kind("batching", args, lines, Path(tmp))
    differing, compared = {}, {}
    for pair, run in runs.items():
        texts = sorted({t for p, t in seen if p == pair})
        translator = Translator.from_checkpoint(run)
        beam = args.beam or translator.cfg.decode.beam_size
        expected = dict(zip(texts, translator.translate(texts, beam_size=beam)))
        compared[pair] = len(texts)
        differing[pair] = sum(seen[(pair, t)] != expected[t] for t in texts)
    out = {
        "what": "nanomt serve with many models: one batching server, clients spread over the pairs, every answer "
        "compared with its run's own translation",
        "models": {pair: shown(run) for pair, run in runs.items()},
        "sentences_files": {pair: shown(f) for pair, f in files.items()},
        "lines_used": {pair: len(v) for pair, v in lines.items()},
        "sentences_per_request": args.sentences_per_request,
        "requests_per_client": args.requests_per_client,
        "server": {"beam": args.beam, "max_batch_tokens": args.max_batch_tokens, "max_wait_ms": args.max_wait_ms},
        "results": rows,
        "sentences_compared": compared,
        "translations_differing": differing,
        "errors": sum(r["errors"] for r in rows),
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("sentences_compared", "translations_differing", "errors")}, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="run directory (or any checkpoint) to serve")
    p.add_argument("--models", nargs="+", metavar="PAIR=RUN", help="many models: one server of these runs")
    p.add_argument(
        "--sentences", nargs="+", required=True, help="source sentences, one a line (many models: PAIR=FILE each)"
    )
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--requests-per-client", type=int, default=12)
    p.add_argument("--warmup-requests-per-client", type=int, default=3, help="at every level, before measuring")
    p.add_argument("--sentences-per-request", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=90.0, help="a level's clients stop starting requests after")
    p.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    p.add_argument("--beam", type=int, default=None, help="server's default beam (default: the checkpoint's)")
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=60.0, help="the servers' --timeout")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the servers (default: unset)")
    p.add_argument("--lines", type=int, default=2000, help="use the first N lines of --sentences")
    p.add_argument("--out", type=Path, default=RESULTS / "serve_load.json")
    args = p.parse_args()
    if (args.checkpoint is None) == (args.models is None):
        raise SystemExit("give --checkpoint (one model) or --models PAIR=RUN ... (many)")
    if args.models:
        many(args)
        return
    args.sentences = Path(args.sentences[0])
    lines = read_lines(args.sentences, args.lines)
    results, seen = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            results[kind], seen[kind] = run_kind(kind, args, lines, Path(tmp))

    summary = {}
    if set(KINDS) <= set(results):
        common = set(seen["one_lock"]) & set(seen["batching"])
        summary["sentences_compared"] = len(common)
        summary["translations_differing"] = sum(seen["one_lock"][t] != seen["batching"][t] for t in common)
        summary["speedup"] = {
            str(a["clients"]): round(b["sentences_per_s"] / a["sentences_per_s"], 2)
            for a, b in zip(results["one_lock"], results["batching"])
            if a["sentences_per_s"]
        }
        at16 = [(a, b) for a, b in zip(results["one_lock"], results["batching"]) if a["clients"] == 16]
        if at16:
            a, b = at16[0]
            summary["target_16_clients"] = {
                "speedup_at_least_3x": b["sentences_per_s"] >= 3 * a["sentences_per_s"],
                "p99_under_2s": b["p99_ms"] < 2000,
                "no_errors": b["errors"] == 0,
            }
    out = {
        "what": "nanomt serve: sentences/s and request latency, one-lock server against batching server",
        "checkpoint": shown(args.checkpoint),
        "sentences_file": shown(args.sentences),
        "lines_used": len(lines),
        "sentences_per_request": args.sentences_per_request,
        "requests_per_client": args.requests_per_client,
        "warmup_requests_per_client_at_every_level": args.warmup_requests_per_client,
        "max_seconds_per_level": args.max_seconds,
        "server": {
            "beam": args.beam,
            "max_batch_tokens": args.max_batch_tokens,
            "max_wait_ms": args.max_wait_ms,
            "omp_num_threads": args.threads,
        },
        "results": results,
        **summary,
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2), f"\nwrote {shown(args.out)}")


if __name__ == "__main__":
    main()
