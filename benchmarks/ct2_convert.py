"""Convert a nanomt checkpoint to CTranslate2, and time CTranslate2 translating a file with it.

    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR                       # convert (float32 weights)
    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR --src test.de --json  # + translate, time, print JSON
    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR --src test.de --worker # the harness's CTranslate2 engine

The converter and the decoding are the package's (nanomt/interop/ct2.py: `nanomt export ct2`), with the
checkpoint's decoding settings mapped onto CTranslate2's, so the translations are nanomt's. This process never
imports torch: CTranslate2 in a process that has imported torch ran ~2.5x slower in the baselines' measurements
(two OpenMP runtimes). nanomt.interop.ct2 imports no torch, but `ctranslate2.specs` does whenever torch is
installed: the conversion runs in a child process.

`--worker` is the CTranslate2 side of the translate harness (benchmarks/harness.py: `benchmarks.speed`,
`benchmarks.opus_mt`, `benchmarks.latency`): float32 and int8 translators that answer one JSON request a line.
Given nanomt's batches (`plan`), it decodes exactly those, one `translate_batch` call each in nanomt's order
(`translate_in_batches`); `batching: "budget"` is `Ct2Translator`'s own grouping by generation budget instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ctranslate2

from benchmarks.harness import NUM_THREADS, answer_requests, lines_alone
from nanomt.interop import ct2

COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}


def convert(checkpoint: Path, out_dir: Path) -> Path:
    """Write the CTranslate2 model directory for a nanomt checkpoint (float32 weights), in a child process."""
    # ctranslate2.specs imports torch whenever it is installed, so converting here would load it into the process
    # that then times the translation.
    code = "import sys; from nanomt.interop.ct2 import export_ct2; export_ct2(sys.argv[1], sys.argv[2])"
    res = subprocess.run([sys.executable, "-c", code, str(checkpoint), str(out_dir)], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"ct2_convert.py: error: conversion failed: {res.stderr.strip().splitlines()[-1:]}")
    return out_dir


def translate_in_batches(t, ids: list[list[int]], batches: list[list[int]], beam_size: int) -> list[list[int]]:
    """Target ids of `ids`, decoding exactly `batches` (lists of indices), one translate_batch call each, in order."""
    # CTranslate2 takes one max_decoding_length a call: the batch's largest budget, and every output is cut at its
    # sentence's own. The limit acts only at its last step (BeamSearch's is_last_step), so a sentence whose search
    # ends before its own budget gets the same tokens; greedy tokens never depend on it. The harness counts the
    # lines where it did matter (against `batching: "budget"`).
    d = t.decoding.replace(beam_size=beam_size)
    options = {**t.search_options(d), "max_batch_size": 0}  # 0: the batch as given, not re-cut
    out: list[list[int]] = [[] for _ in ids]
    for batch in batches:
        src = [ids[i][: t.max_src_tokens] for i in batch]
        budgets = [t.max_len(len(s)) for s in src]
        tokens = [[t.src_vocab[x] for x in s] for s in src]
        results = t.translator.translate_batch(tokens, max_decoding_length=max(budgets), **options)
        for i, budget, res in zip(batch, budgets, results):
            hyps = [h[:budget] for h in res.hypotheses]
            best = t.rescore(hyps, res.scores, budget, d) if res.scores else hyps[0]
            out[i] = [t.tgt_ids[p] for p in best]
    return out


def budget_calls(t, lines: list[str], beam_size: int) -> int:
    """How many translate_batch calls `Ct2Translator.translate` makes: one per generation budget (beam search)."""
    budgets = {t.max_len(len(s[: t.max_src_tokens])) for s in t.encode(lines) if s}
    return min(len(budgets), 1) if beam_size == 1 else len(budgets)


def engine_worker(ct2_dir: Path, src_file: Path, threads: int, ready: dict) -> None:
    """Answer the harness's requests (benchmarks.harness.answer_requests) with float32 and int8 translators."""
    lines = src_file.read_text(encoding="utf-8").splitlines()
    t0 = time.perf_counter()
    engines = {
        name: ct2.Ct2Translator(ct2_dir, device="cpu", compute_type=compute_type, intra_threads=threads)
        for name, compute_type in COMPUTE_TYPES.items()
    }
    ready.update(load_s=time.perf_counter() - t0, intra_threads=threads, inter_threads=1)
    state: dict = {"batches": None, "outputs": {}}

    def plan(batches: list[list[int]]) -> dict:
        state["batches"] = batches
        return {"batches": len(batches), "sentences": sum(map(len, batches))}

    def run(engine: str, beam: int, batching: str = "plan") -> dict:
        t = engines[engine]
        start = time.perf_counter()
        if batching == "plan":
            texts = t.decode_ids(translate_in_batches(t, t.encode(lines), state["batches"], beam))
            sizes = [len(b) for b in state["batches"]]
        else:
            texts = t.translate(lines, beam_size=beam)
            sizes = None
        seconds = time.perf_counter() - start
        state["outputs"][engine, beam, batching] = texts
        calls = len(sizes) if sizes is not None else budget_calls(t, lines, beam)
        return {"seconds": seconds, "batch_sizes": sizes, "calls": calls}

    def outputs(engine: str, beam: int, batching: str = "plan") -> dict:
        return {"translations": state["outputs"][engine, beam, batching]}

    def latency(engine: str, beam: int, indices: list[int]) -> dict:
        return lines_alone(lambda one: engines[engine].translate(one, beam_size=beam), lines, indices)

    if "torch" in sys.modules:
        raise RuntimeError("the CTranslate2 worker imported torch")
    answer_requests({"plan": plan, "run": run, "outputs": outputs, "latency": latency}, ready)


def time_translation(ct2_dir: Path, src_file: Path, compute_type: str, beam: int, length_penalty, reps: int) -> dict:
    """Median wall time of translating the whole file (SentencePiece in and out included), after one warm-up."""
    # length_penalty None: the checkpoint's (decode.length_penalty and its kind, as nanomt decodes). The sentences
    # are grouped by generation budget here (Ct2Translator.translate); the harness (--worker) takes nanomt's batches.
    translator = ct2.Ct2Translator(ct2_dir, device="cpu", compute_type=compute_type, intra_threads=NUM_THREADS)
    lines = src_file.read_text(encoding="utf-8").splitlines()

    def run() -> list[str]:
        return translator.translate(lines, beam_size=beam, length_penalty=length_penalty)

    run()  # warm-up
    samples, outputs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        outputs = run()
        samples.append(time.perf_counter() - t0)
    median = statistics.median(samples)
    return {
        "compute_type": compute_type,
        "beam": beam,
        "length_penalty": translator.decode["length_penalty"] if length_penalty is None else length_penalty,
        "length_penalty_kind": translator.decode["length_penalty_kind"],
        "median_s": median,
        "min_s": min(samples),
        "max_s": max(samples),
        "samples_s": samples,
        "n_sentences": len(lines),
        "sentences_per_s": len(lines) / median,
        "translations": outputs,
    }


def main() -> None:
    """Convert, then optionally translate and time, or answer the harness's requests; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--src", type=Path, help="also translate this file and time it")
    p.add_argument("--compute-types", default="float32,int8")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="alpha of the checkpoint's length penalty kind (default: its own)",
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--worker", action="store_true", help="answer requests on stdin (the translate harness)")
    p.add_argument("--threads", type=int, default=NUM_THREADS, help=f"intra_threads (default {NUM_THREADS})")
    args = p.parse_args()
    if args.worker and not args.src:
        p.error("--worker needs --src")
    t0 = time.perf_counter()
    convert(args.checkpoint, args.out_dir)
    report = {"ct2_dir": str(args.out_dir), "convert_s": time.perf_counter() - t0, "version": ctranslate2.__version__}
    report["torch_loaded"] = "torch" in sys.modules  # should stay False: see the module docstring
    if args.worker:
        engine_worker(args.out_dir, args.src, args.threads, {"engine": "ctranslate2", **report})
        return
    if args.src:
        report["runs"] = [
            time_translation(args.out_dir, args.src, compute_type, args.beam, args.length_penalty, args.reps)
            for compute_type in args.compute_types.split(",")
        ]
    print(json.dumps(report) if args.json else f"converted to {args.out_dir}")


if __name__ == "__main__":
    main()
