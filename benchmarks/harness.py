"""What benchmarks share beyond scripts/common.py: round-robin timing, engines in worker processes of their own (the
translate harness of `benchmarks.speed`, `benchmarks.latency` and `benchmarks.opus_mt`), `nanomt serve` processes,
the toy and random models they time, and A/B runs of `nanomt train`'s step.

A helper, not a benchmark: it has no command line. Benchmarks import it, the package and scripts/common.py, never one
another. Importing it imports neither torch nor nanomt (each function imports what it uses), so the CTranslate2
worker, which must stay without torch, imports it too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scripts.common import (
    DEFAULT_CONFIG,
    DEFAULT_DATA,
    RESULTS,
    ROOT,
    cpu_model,
    data_overrides,
    git,
    machine,
    run_training,
    shown,
)

NUM_THREADS = 2  # every engine's, on the 2-core machines the results come from


def limit_threads(threads: int = NUM_THREADS) -> None:
    """Before torch, MKL or OpenMP start (each worker process inherits it): `threads` threads, tokenizers' own
    parallelism off, Hugging Face offline; a variable already set is left alone."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---------------------------------------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Contender:
    """One thing to time: `run()` does one timed call and returns its seconds."""

    name: str
    run: Callable[[], float]
    info: dict = field(default_factory=dict)


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A `run` that times one call of `fn` on the wall clock."""

    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return run


def summarize(samples: list[float]) -> dict:
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples), "samples_s": samples}


def round_robin(contenders: list[Contender], warmup: int, reps: int) -> dict[str, dict]:
    """Each round runs every contender once (starting one further along each round); the first `warmup` are dropped."""
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    errors: dict[str, str] = {}
    for r in range(warmup + reps):
        shift = r % len(contenders)
        line = []
        for c in contenders[shift:] + contenders[:shift]:
            if c.name in errors:
                continue
            try:
                dt = c.run()
            except Exception as e:  # one broken contender must not end the run
                errors[c.name] = repr(e)
                print(f"  {c.name} failed: {e!r}", flush=True)
                continue
            if r >= warmup:
                samples[c.name].append(dt)
            line.append(f"{c.name} {dt:.3f}s")
        print(f"  round {r + 1}/{warmup + reps}{' (warm-up)' if r < warmup else ''}: {', '.join(line)}", flush=True)
    out = {}
    for c in contenders:
        out[c.name] = {"error": errors[c.name]} if c.name in errors else summarize(samples[c.name])
        out[c.name].update(c.info)
    return out


def available(package: str, contender: str) -> bool:
    """Whether `package` can be imported; says which contender is skipped when it cannot."""
    if importlib.util.find_spec(package) is None:
        print(f"skipping {contender}: {package} not installed", flush=True)
        return False
    return True


def timed_reps(fn: Callable[[], list[str]], reps: int) -> tuple[list[float], list[list[str]]]:
    """Seconds of each of `reps` calls of `fn` (a whole file's translation), and what each call returned."""
    seconds, outputs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        outputs.append(fn())
        seconds.append(time.perf_counter() - t0)
    return seconds, outputs


# ---------------------------------------------------------------------------------------------------------
# Engines in worker processes of their own: nanomt's (`benchmarks.speed --engine-worker`) and CTranslate2's
# (`benchmarks.ct2_convert --worker`, which never imports torch), both answering the same requests.
# ---------------------------------------------------------------------------------------------------------

GAP_S = 0.3  # idle time around each worker's request (OpenMP threads spin for a while after work)
PRECISIONS = ("fp32", "int8")
SHOWN_DIFFERENCES = 20  # line numbers listed per comparison
BATCHINGS = {
    "plan": "CTranslate2 decodes nanomt's batches: the same sentences in each batch, in nanomt's order (sorted by "
    "length, cut at decode.max_tokens padded source tokens), one translate_batch call a batch. CTranslate2 takes "
    "one max_decoding_length a call, so each call gets the batch's largest generation budget and every output is "
    "cut at its own sentence's; the limit acts only at its last step, so a search that ends before its sentence's "
    "budget is unchanged (ct2_lines_changed_by_batch_budget counts the lines where it was not, against "
    "Ct2Translator's exact per-budget decoding). Both engines pad and decode the same rows.",
    "budget": "each engine its own batching: nanomt its token-budget batches, CTranslate2 Ct2Translator's one call "
    "per generation budget (padding-free batches of a single source length). Not the same work: a reference only.",
}


def answer_requests(handlers: dict[str, Callable[..., dict]], ready: dict) -> None:
    """A worker's loop: `READY:{json}`, then for each JSON request line on stdin one `REPLY:{json}` line."""
    print("READY:" + json.dumps(ready), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            reply = handlers[op](**request)
        except Exception as e:  # the parent raises it; the worker stays up for the next request
            reply = {"error": repr(e)}
        print("REPLY:" + json.dumps(reply), flush=True)


def lines_alone(translate: Callable[[list[str]], list[str]], lines: list[str], indices: list[int]) -> dict:
    """A worker's latency request: each line alone, one after another; the seconds and translation of each."""
    seconds, texts = [], []
    for i in indices:
        start = time.perf_counter()
        texts += translate([lines[i]])
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "translations": texts}


class EngineProcess:
    """The parent's end of a worker process (`answer_requests`): one engine, alone in its process."""

    def __init__(self, cmd: list[str], name: str, threads: int = NUM_THREADS):
        self.name = name
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(cmd, stdin=pipe, stdout=pipe, text=True, bufsize=1, cwd=ROOT, env=env)
        self.info = json.loads(self._line("READY:"))

    def _line(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"the {self.name} worker exited (rc {self.proc.wait()}) before answering {prefix}")

    def ask(self, op: str, **request) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **request}) + "\n")
        reply = json.loads(self._line("REPLY:"))
        if "error" in reply:
            raise RuntimeError(f"{self.name} worker: {reply['error']}")
        return reply

    def timed(self, op: str, **request) -> dict:
        """`ask`, with idle gaps around it: the other processes' OpenMP threads stop spinning first, then its own."""
        time.sleep(GAP_S)
        reply = self.ask(op, **request)
        time.sleep(GAP_S)
        return reply

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def engine_processes(checkpoint: str, src: Path, workdir: Path, threads: int = NUM_THREADS) -> dict[str, EngineProcess]:
    """The nanomt worker and, when ctranslate2 is installed, the CTranslate2 one (`export ct2` into workdir)."""
    ckpt = str(Path(checkpoint).resolve())
    cmd = [sys.executable, "-m", "benchmarks.speed", "--engine-worker", ckpt, str(src), str(threads)]
    engines = {"nanomt": EngineProcess(cmd, "nanomt", threads)}
    if available("ctranslate2", "ct2_translate"):
        cmd = [sys.executable, "-m", "benchmarks.ct2_convert", ckpt, str(workdir / "ct2"), "--src", str(src)]
        engines["ct2"] = EngineProcess([*cmd, "--worker", "--threads", str(threads)], "ctranslate2", threads)
    return engines


def run_request(impl: str, precision: str, beam: int, batching: str) -> dict:
    """The `run` request of an engine: CTranslate2 is told how to batch, nanomt batches as it always does."""
    request = {"engine": precision, "beam": beam}
    return {**request, "batching": batching} if impl == "ct2" else request


def engine_contenders(engines: dict[str, EngineProcess], beams: dict[str, int], batching: str) -> list[Contender]:
    """One contender per engine, precision and mode (name -> beam): a whole-file `run` in the engine's process."""
    contenders = []
    for mode, beam in beams.items():
        for impl, proc in engines.items():
            for precision in PRECISIONS:
                info: dict = {}
                request = run_request(impl, precision, beam, batching)

                def run(proc=proc, request=request, info=info) -> float:
                    reply = proc.timed("run", **request)
                    info.update({k: v for k, v in reply.items() if k != "seconds"})
                    return reply["seconds"]

                contenders.append(Contender(f"{impl}_translate_{precision}/{mode}", run, info))
    return contenders


def engine_outputs(engines: dict[str, EngineProcess], beams: dict[str, int], batching: str, names) -> dict:
    """The translations of every engine's last run (for the contenders in `names`)."""
    out = {}
    for mode, beam in beams.items():
        for impl, proc in engines.items():
            for precision in PRECISIONS:
                name = f"{impl}_translate_{precision}/{mode}"
                if name in names:
                    request = run_request(impl, precision, beam, batching)
                    out[name] = proc.ask("outputs", **request)["translations"]
    return out


def differing(a: list[str], b: list[str]) -> dict:
    """How many lines differ, and the first few line numbers (1-based)."""
    lines = [i + 1 for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    return {"differing_lines": len(lines), "first_differing_line_numbers": lines[:SHOWN_DIFFERENCES]}


def changed_by_batch_budget(ct2: EngineProcess, beams: dict[str, int], outputs: dict) -> dict:
    """Per precision and mode: lines where nanomt's batches changed CTranslate2's output against its exact decoding."""
    changed = {}
    for mode, beam in beams.items():
        for precision in PRECISIONS:
            name = f"ct2_translate_{precision}/{mode}"
            if name in outputs:  # one untimed run with Ct2Translator's own grouping by generation budget
                ct2.ask("run", engine=precision, beam=beam, batching="budget")
                exact = ct2.ask("outputs", engine=precision, beam=beam, batching="budget")["translations"]
                changed[name] = differing(outputs[name], exact)["differing_lines"]
    return changed


def engine_comparison(outputs: dict, modes) -> dict:
    """Differing lines: nanomt against CTranslate2 at each precision, and int8 against float32 in each engine."""
    out = {}
    for mode in modes:
        pairs = {
            "fp32_nanomt_vs_ct2": ("nanomt_translate_fp32", "ct2_translate_fp32"),
            "int8_nanomt_vs_ct2": ("nanomt_translate_int8", "ct2_translate_int8"),
            "nanomt_int8_vs_fp32": ("nanomt_translate_int8", "nanomt_translate_fp32"),
            "ct2_int8_vs_fp32": ("ct2_translate_int8", "ct2_translate_fp32"),
        }
        for key, (a, b) in pairs.items():
            a, b = f"{a}/{mode}", f"{b}/{mode}"
            if a in outputs and b in outputs:
                out.setdefault(mode, {})[key] = differing(outputs[a], outputs[b])
    return out


def same_batches(timings: dict, batching: str) -> bool | None:
    """Whether every engine decoded the same batches: the same sizes, and nanomt's runs cut the plan's batches."""
    rows = [t for t in timings.values() if "batch_sizes" in t]
    checks = [t["matches_plan"] for t in rows if "matches_plan" in t]
    if batching != "plan" or not rows or None in checks:
        return False if batching != "plan" else None  # None: nanomt's batches were not seen
    return all(checks) and all(t["batch_sizes"] == rows[0]["batch_sizes"] for t in rows)


def harness_info(
    engines: dict[str, EngineProcess], beams: dict[str, int], batching: str, warmup: int, reps: int
) -> dict:
    """What the harness did: the batching, the plan's shape, the processes and their threads."""
    nanomt = engines["nanomt"].info
    sizes = [len(b) for b in nanomt["plan"]]
    threads = {"nanomt": nanomt["threads"]}
    if "ct2" in engines:
        threads["ct2"] = engines["ct2"].info["intra_threads"]
    return {
        "batching": batching,
        "how": BATCHINGS[batching],
        "processes": "each engine in its own worker process (CTranslate2's never imports torch), this one only "
        f"orchestrates; one whole-file run a request, {GAP_S} s idle before and after each; round-robin, "
        f"starting one engine further along each round; {warmup} warm-up round(s) dropped, {reps} kept",
        "threads": threads,
        "omp_num_threads": nanomt["omp_num_threads"],
        "nanomt_max_tokens": nanomt["max_tokens"],
        "plan_batches": len(sizes),
        "plan_sentences_per_batch": sizes,
        "plan_beam_rows_per_batch": {mode: [n * beam for n in sizes] for mode, beam in beams.items()},
        "versions": {
            "torch": nanomt["torch"],
            "ctranslate2": engines["ct2"].info["version"] if "ct2" in engines else None,
        },
    }


def translate_machine(harness: dict) -> dict:
    """CPU, threads, versions and git, without importing torch (the engines run in their own processes)."""
    versions = {}
    for package in ("torch", "transformers", "ctranslate2", "numpy", "sentencepiece"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
        versions.setdefault(package, None)
    return {
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "threads": max(harness["threads"].values()),
        "engine_threads": harness["threads"],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---------------------------------------------------------------------------------------------------------
# `nanomt serve` in a process of its own.
# ---------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(serve_args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """`nanomt serve SERVE_ARGS` on a free local port, its output in `log`; the process and its URL once ready."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "nanomt.cli", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"nanomt serve exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"nanomt serve was not ready in 300 s:\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains), then SIGKILL after a minute."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------------------------
# Models and texts to time.
# ---------------------------------------------------------------------------------------------------------

# Helsinki-NLP's opus-mt models (MarianMTModel): what marian_config adds to the dimensions for their shape.
OPUS_MT = dict(
    activation_function="swish",
    scale_embedding=True,
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
    eos_token_id=0,
    forced_eos_token_id=None,  # opus-mt forces EOS at max_length; the random models here end no sentence early
)
SENTENCE_END = re.compile(r"[.!?…][\"'“”„»«’)\]]*$")


def tiny_run(out: Path, test: int) -> tuple[Path, Path]:
    """A toy-pair model trained for a few seconds, and `test` test sentences."""
    from nanomt.core.config import config_from_dict
    from nanomt.training.synthetic import write_corpus
    from nanomt.training.train import train

    corpus = write_corpus(out / "toy", pairs=3000, seed=0, valid=100, test=test)
    files = {k: {"src": str(corpus[f"{k}.src"]), "tgt": str(corpus[f"{k}.tgt"])} for k in ("train", "valid")}
    cfg = {
        "data": {**files, "vocab_size": 120, "shared_vocab": False, "max_len": 48},
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
                  "max_positions": 64},
        "train": {"max_steps": 300, "max_tokens": 600, "lr": 3e-3, "warmup_steps": 10, "log_every": 50,
                  "eval_every": 300, "save_every": 300, "valid_bleu_sentences": 20, "num_threads": 1,
                  "progress": False},
        "decode": {"beam_size": 2, "max_len_a": 1.5, "max_len_b": 5},
    }  # fmt: skip
    return train(config_from_dict(cfg), out / "run"), corpus["test.src"]


def model_config(vocab: int, d_model: int, layers: int, heads: int, d_ff: int, **settings):
    """A nanomt ModelConfig of these dimensions, the same on both sides, with `settings` for the rest."""
    from nanomt.core.config import ModelConfig

    return ModelConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=d_model,
        n_heads=heads,
        n_encoder_layers=layers,
        n_decoder_layers=layers,
        d_ff=d_ff,
        **settings,
    )


def marian_config(vocab: int, d_model: int, layers: int, heads: int, d_ff: int, **settings):
    """A transformers MarianConfig of these dimensions, the same on both sides, with `settings` for the rest."""
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        **settings,
    )


def generate_exactly(model, src, mask, n: int, beams: int):
    """transformers' `generate` of exactly `n` new tokens a sentence (KV cache, no early stop): the output ids."""
    import torch

    with torch.inference_mode():
        return model.generate(
            input_ids=src,
            attention_mask=mask,
            num_beams=beams,
            do_sample=False,
            min_new_tokens=n,
            max_new_tokens=n,
            use_cache=True,
            early_stopping=False,
        )


def sync(device) -> None:
    """Wait for the device's work (a CUDA device's kernels run behind the host)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def paragraphs(news: Path, lang: str, seed: int = 0) -> list[list[str]]:
    """Runs of 2-6 consecutive non-empty lines of every DIR/*.lang file, in file order."""
    rng = random.Random(seed)
    out = []
    for path in sorted(news.glob(f"*.{lang}")):
        lines = [s.strip() for s in path.read_text(encoding="utf-8").splitlines()]
        lines = [s for s in lines if s]
        i = 0
        while i + 2 <= len(lines):
            k = rng.randint(2, 6)
            out.append(lines[i : i + k])
            i += k
    return out


# ---------------------------------------------------------------------------------------------------------
# A/B of the Multi30k recipe's training step through `nanomt train`.
# ---------------------------------------------------------------------------------------------------------


def timed_run(config: Path, data: Path, run_dir: Path, steps: int, warmup: int, overrides: list[str] = ()) -> dict:
    """Train `steps` steps in a fresh run dir: median and mean ms a step after `warmup`, the child's faults and CPU."""
    from nanomt.training.metrics_log import read_metrics

    overrides = [
        *data_overrides(data),
        f"train.max_steps={steps}",
        "train.max_minutes=null",
        "train.log_every=1",
        "train.eval_every=1000000",
        "train.save_every=1000000",
        "train.progress=false",
        *overrides,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run_training(config, run_dir, overrides, log=run_dir.with_suffix(".log"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]
    elapsed = [r["elapsed_s"] for r in rows]
    step_s = [b - a for a, b in zip(elapsed, elapsed[1:])][warmup:]
    return {
        "ms_per_step_median": round(1000 * statistics.median(step_s), 1),
        "ms_per_step_mean": round(1000 * statistics.mean(step_s), 1),
        "minor_page_faults": after.ru_minflt - before.ru_minflt,
        "system_cpu_s": round(after.ru_stime - before.ru_stime, 2),
        "user_cpu_s": round(after.ru_utime - before.ru_utime, 2),
    }


def step_timing_args(doc: str, pairs: int, out: str) -> argparse.Namespace:
    """The command line of an A/B of `timed_run`s: data, config, steps a run, warmup, pairs, results file."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--pairs", type=int, default=pairs)
    p.add_argument("--out", type=Path, default=RESULTS / out)
    return p.parse_args()


def write_step_timings(out: Path, config: Path, steps: int, warmup: int, runs: dict, speedup: list, **extra) -> None:
    """Write an A/B of `timed_run`s (each setting's runs, the speedup per pair, the machine); print the speedups."""
    result = {
        "config": shown(config),
        **extra,
        "steps_per_run": steps,
        "warmup_steps_excluded": warmup,
        "runs": runs,
        "speedup_per_pair": speedup,
        "machine": machine(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(speedup), f"\nwrote {out}")
