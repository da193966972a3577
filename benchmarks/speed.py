"""Speed of nanomt against its baselines on this CPU: training steps, decoding, and `nanomt translate`.

Run from the repository root (the full run takes 12-15 minutes on the 2-core machine, a few more with translate):

    python -m benchmarks.speed                  # train + decode, SMALL and BASE -> benchmarks/results/speed.{json,md}
    python -m benchmarks.speed --quick          # smoke test: SMALL, 2 reps -> benchmarks/results/speed_quick.{json,md}
    python -m benchmarks.speed --only decode --configs BASE --out speed_decode_base
    python -m benchmarks.speed --only translate --reps 7 --warmup 1 --out translate_ct2 \\
        --translate-checkpoint runs/multi30k_de_en --src ../shared/data/multi30k/test2016.de

The baselines are imported from ../shared/bench/anchors/ (`--anchors DIR`), never copied: `common.CONFIGS` gives
the SMALL and BASE dimensions, `models.SeedImpl` the seed (the tutorial Transformer this project started from),
`models.MarianImpl` Hugging Face's MarianMTModel, and `bench_infer` the CTranslate2 conversion and timing. A
contender whose package is missing is skipped with a message. Everything runs on 2 threads. Paths in the results
are relative to the repository.

What it measures:
1. train: one training step (forward, label-smoothed cross-entropy 0.1, backward, AdamW step, zero_grad) on a fixed
   full-length synthetic batch, in fp32 and under bf16 autocast, in target tokens/s, for nanomt (shared embeddings
   tied to the output like Marian; `nanomt_untied` has the seed's parameter layout), the seed and Marian. nanomt
   uses its own `label_smoothed_loss` (sum / target tokens), the baselines their anchors' `forward_loss`. Also the
   model GFLOP/s (formula in `train_step_flops`) as a fraction of the bf16 matmul peak, both REPORT.md's 860
   GFLOP/s and a `gemm` probe timed among the training steps.
2. decode: 32 sentences of 32 source tokens, exactly 32 new tokens each, greedy and beam 4, in target tokens/s
   (32 * 32 / seconds): nanomt `greedy`/`beam_search` on a random model (fp32, bf16 autocast, int8 dynamic
   quantization), Marian `generate`, and CTranslate2 fp32/int8 timed in a worker process that never imports torch
   (REPORT.md: CT2 next to torch ran 2.5x slower).
3. translate (with --translate-checkpoint and --src): `Translator.translate(lines, beam_size=5)` of a whole file
   against the same checkpoint's `export ct2` decoded with nanomt's rules (benchmarks.ct2_convert), float32 and
   int8, in sentences/s. Each engine runs in a worker process of its own (nanomt's never loads CTranslate2,
   CTranslate2's never imports torch; this process imports neither with --only translate), both on 2 threads, and
   both decode the same batches: nanomt's (`BATCHINGS`; `--ct2-batching budget` gives CTranslate2 its own grouping
   by generation budget instead, as a named reference). Reported: the float32 lines that differ between the
   engines (expected: none), the int8 ones, the lines the batch's generation budget changed in CTranslate2, and
   whether both engines got the same batches. `--lines N` takes the first N lines (a smoke test).

Method: all contenders of a config are built first, then timed round-robin (each round runs every contender once,
starting one further along each time), `--warmup` rounds dropped, then `--reps` rounds kept; the median is reported
with min, max and every sample. The worker processes stay alive for the whole round-robin and answer one request
at a time; the other processes sleep meanwhile, with a short gap so no one's OpenMP threads spin on another's time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    BATCHINGS,
    GAP_S,
    NUM_THREADS,
    PRECISIONS,
    Contender,
    answer_requests,
    available,
    changed_by_batch_budget,
    engine_comparison,
    engine_contenders,
    engine_outputs,
    engine_processes,
    generate_exactly,
    harness_info,
    limit_threads,
    lines_alone,
    model_config,
    round_robin,
    same_batches,
    timed,
    translate_machine,
)
from scripts.common import RESULTS, ROOT, cpu_model, git, shown

limit_threads()  # before torch, MKL or OpenMP start, here and in every worker process

DEFAULT_ANCHORS = ROOT.parent / "shared" / "bench" / "anchors"

BF16_PEAK_GFLOPS = 860.0  # REPORT.md: oneDNN bf16 matmul on this CPU (AVX-512 bf16, no AMX)
GEMM_SHAPE = (2048, 512, 2048)  # (M, K, N): 64 x 32 tokens through a 512 -> 2048 layer
GEMM_CALLS = 50  # matmuls per gemm sample (0.1 s with AMX, 0.25 s at 860 GFLOP/s)
N_SENT, SRC_LEN, N_NEW = 32, 32, 32  # decoding workload, as bench_infer.py
BEAMS = (1, 4)
CT2_TYPES = {"fp32": "float32", "int8": "int8"}
LABEL_SMOOTHING = 0.1
TARGETS = {
    "train_x_seed": 2.0,
    "train_x_marian": 1.5,
    "bf16_peak_fraction": 0.5,
    "decode_x_hf": 2.0,
    "decode_x_ct2": 1.0,
}


# ---------------------------------------------------------------------------------------------------------
# 1. Training step.
# ---------------------------------------------------------------------------------------------------------


def train_step_flops(c: dict) -> float:
    """Model FLOPs of one training step, counted as REPORT.md does (embeddings excluded).

    matmul weights: encoder layer 4 d^2 (Q, K, V, O) + 2 d d_ff; decoder layer 8 d^2 (self + cross) + 2 d d_ff;
    output projection d V. Each weight costs 2 FLOPs per token forward and 4 backward:
        dense     = 6 * (N * (4 d^2 + 2 d d_ff) * B*S + (N * (8 d^2 + 2 d d_ff) + d V) * B*T)
    attention: QK^T and PV, 4 B Tq Tk d FLOPs per module forward, times 3 for forward + backward:
        attention = 3 * 4 * B * d * N * (S*S + T*T + T*S)
    SMALL: 95 GFLOP per step (2048 target tokens); BASE: 375 GFLOP (1024).
    """
    d, n, d_ff, v = c["d_model"], c["N"], c["d_ff"], c["vocab"]
    b, s, t = c["batch"], c["src_len"], c["tgt_len"]
    dense = 6 * (n * (4 * d * d + 2 * d * d_ff) * b * s + (n * (8 * d * d + 2 * d * d_ff) + d * v) * b * t)
    attention = 3 * 4 * b * d * n * (s * s + t * t + t * s)
    return float(dense + attention)


def nanomt_model_config(c: dict, tied: bool):
    """nanomt at the anchors' dimensions; tied = one embedding for source, target and output (as Marian)."""
    dims = (c["vocab"], c["d_model"], c["N"], c["h"], c["d_ff"])
    return model_config(*dims, dropout=0.1, share_embeddings=tied, tie_output=tied)


def nanomt_ids(batch: int, length: int, vocab: int, seed: int):
    """(batch, length) random ids above nanomt's special tokens (PAD 0, UNK 1, BOS 2, EOS 3)."""
    import torch

    return torch.randint(4, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def nanomt_trainee(c: dict, tied: bool):
    """A nanomt model in train mode and its loss(bf16) on a fixed full-length batch, as training computes it."""
    import torch

    from nanomt.core.config import BOS_ID, EOS_ID
    from nanomt.core.model import Transformer
    from nanomt.training.train import label_smoothed_loss

    torch.manual_seed(0)
    model = Transformer(nanomt_model_config(c, tied)).train()
    b = c["batch"]
    src = torch.cat([nanomt_ids(b, c["src_len"] - 1, c["vocab"], 1), torch.full((b, 1), EOS_ID)], 1)
    body = nanomt_ids(b, c["tgt_len"] - 1, c["vocab"], 2)
    tgt_in = torch.cat([torch.full((b, 1), BOS_ID), body], 1)
    tgt_out = torch.cat([body, torch.full((b, 1), EOS_ID)], 1)
    n_tokens = int((tgt_out != model.cfg.pad_id).sum())

    def loss(bf16: bool):
        with torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=bf16
        ):  # as nanomt.training.train: the forward pass only
            logits = model(src, tgt_in)
        return label_smoothed_loss(logits, tgt_out, LABEL_SMOOTHING, model.cfg.pad_id) / n_tokens

    return model, loss


def anchor_trainee(impl):
    """An anchor implementation (models.SeedImpl / MarianImpl) and its own forward_loss on its own batch."""
    import torch

    impl.model.train()
    batch = impl.make_batch()

    def loss(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # as bench_train.py: forward + loss
            return impl.forward_loss(**batch)

    return impl.model, loss


def train_contender(name: str, model, loss_fn, optimizer, bf16: bool) -> Contender:
    """One full training step of `model` as a contender; keeps the last loss to show the step is sane."""
    info = {"params": sum(p.numel() for p in model.parameters())}

    def step() -> float:
        t0 = time.perf_counter()
        loss = loss_fn(bf16)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        info["last_loss"] = float(loss.detach())
        return dt

    return Contender(name, step, info)


def gemm_contender() -> Contender:
    """GEMM_CALLS bf16 matmuls of GEMM_SHAPE: the achievable matmul peak, timed among the training steps."""
    import torch

    m, k, n = GEMM_SHAPE
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()

    def run() -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(GEMM_CALLS):
                torch.matmul(a, b)
            return time.perf_counter() - t0

    return Contender("gemm/bf16", run, {"shape": f"({m}x{k})@({k}x{n})", "calls": GEMM_CALLS})


def train_trainees(c: dict, anchors: dict) -> dict:
    """name -> (model, loss_fn) for every training contender whose packages are present."""
    import torch

    trainees = {}
    torch.manual_seed(0)
    trainees["seed"] = anchor_trainee(anchors["models"].SeedImpl(c))
    if available("transformers", "marian"):
        trainees["marian"] = anchor_trainee(anchors["models"].MarianImpl(c))
    trainees["nanomt"] = nanomt_trainee(c, tied=True)
    trainees["nanomt_untied"] = nanomt_trainee(c, tied=False)
    return trainees


def bench_train(cfg_name: str, anchors: dict, warmup: int, reps: int) -> dict:
    """Training-step throughput of every contender at fp32 and bf16, round-robin; the ratios and peak fractions."""
    import torch

    c = anchors["common"].CONFIGS[cfg_name]
    print(f"== train {cfg_name}: building contenders", flush=True)
    contenders = [gemm_contender()]
    for name, (model, loss_fn) in train_trainees(c, anchors).items():
        # AdamW as the anchors' bench_train.py: lr 1e-4, eps 1e-9; the anchors with PyTorch's default (for-loop)
        # CPU implementation, nanomt with the fused kernel that nanomt.training.train uses.
        fused = name.startswith("nanomt")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-9, fused=fused or None)
        for precision in ("fp32", "bf16"):
            contenders.append(train_contender(f"{name}/{precision}", model, loss_fn, optimizer, precision == "bf16"))
    timings = round_robin(contenders, warmup, reps)
    del contenders
    gc.collect()
    return train_rows(c, timings)


def train_rows(c: dict, timings: dict) -> dict:
    """Tokens/s, GFLOP/s, ratios vs seed and Marian at the same precision, fraction of the bf16 peak."""
    m, k, n = GEMM_SHAPE
    gemm = timings.pop("gemm/bf16")
    gemm["gflops"] = 2 * m * k * n * GEMM_CALLS / gemm["median_s"] / 1e9 if "median_s" in gemm else None
    tokens, flops = c["batch"] * c["tgt_len"], train_step_flops(c)
    rows = {}
    for name, t in timings.items():
        impl, precision = name.split("/")
        row = {"impl": impl, "precision": precision, **t}
        if "median_s" in t:
            row["tgt_tokens_per_s"] = tokens / t["median_s"]
            row["gflops"] = flops / t["median_s"] / 1e9
            if precision == "bf16":
                row["fraction_of_860"] = row["gflops"] / BF16_PEAK_GFLOPS
                if gemm["gflops"]:
                    row["fraction_of_measured_peak"] = row["gflops"] / gemm["gflops"]
        rows[name] = row
    for row in rows.values():
        for base in ("seed", "marian"):
            other = rows.get(f"{base}/{row['precision']}", {})
            if "tgt_tokens_per_s" in row and "tgt_tokens_per_s" in other:
                row[f"x_{base}"] = row["tgt_tokens_per_s"] / other["tgt_tokens_per_s"]
    return {"config": c, "tgt_tokens_per_step": tokens, "model_flops_per_step": flops, "gemm": gemm, "rows": rows}


# ---------------------------------------------------------------------------------------------------------
# 2. Decoding.
# ---------------------------------------------------------------------------------------------------------


def nanomt_decode_contenders(c: dict) -> tuple[list[Contender], dict]:
    """nanomt greedy and beam 4 at fp32, bf16 autocast and int8 (quantize_dynamic), exactly N_NEW tokens each."""
    import torch

    from nanomt.core.config import EOS_ID
    from nanomt.core.decoding import Decoding
    from nanomt.core.model import Transformer
    from nanomt.decoding.beam import beam_search
    from nanomt.decoding.greedy import greedy

    torch.manual_seed(0)
    model = Transformer(nanomt_model_config(c, tied=True)).eval()
    src = torch.cat([nanomt_ids(N_SENT, SRC_LEN - 1, c["vocab"], 1), torch.full((N_SENT, 1), EOS_ID)], 1)
    variants, notes = {"fp32": (model, False), "bf16": (model, True)}, {}
    quantized, notes["int8"] = quantize_int8(model)
    if quantized is not None:
        variants["int8"] = (quantized, False)

    def decode(m, bf16: bool, beams: int) -> list[list[int]]:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            exactly = Decoding(beam_size=beams, max_len_a=0, max_len_b=N_NEW, min_len=N_NEW)  # N_NEW tokens each
            return [hyps[0].tokens for hyps in (greedy if beams == 1 else beam_search)(m, src, exactly)]

    reference = decode(model, False, 1)
    contenders = []
    for precision, (m, bf16) in variants.items():
        for beams in BEAMS:
            out = decode(m, bf16, beams)
            assert {len(x) for x in out} == {N_NEW}, f"nanomt {precision} beam {beams}: lengths {set(map(len, out))}"
            info = {}
            if beams == 1:
                same = sum(a == b for x, y in zip(out, reference) for a, b in zip(x, y))
                info["agreement_with_fp32_greedy"] = same / (N_SENT * N_NEW)
            run = timed(functools.partial(decode, m, bf16, beams))
            contenders.append(Contender(f"nanomt_{precision}/{mode_name(beams)}", run, info))
    return contenders, notes


def quantize_int8(model) -> tuple[object | None, dict]:
    """nanomt.decoding.quantize.quantize_int8 (what `translate --int8` uses); None and the error when it fails."""
    from nanomt.decoding.quantize import quantize_int8 as quantize

    api = "nanomt.decoding.quantize.quantize_int8 (int8 x int8 products: weights scaled per output row, inputs per row)"
    try:
        return quantize(model), {"api": api}
    except Exception as e:
        print(f"skipping nanomt_int8: quantization failed: {e!r}", flush=True)
        return None, {"api": api, "error": repr(e)}


def mode_name(beams: int) -> str:
    return "greedy" if beams == 1 else f"beam{beams}"


def hf_decode_contenders(c: dict, anchors: dict) -> list[Contender]:
    """Marian `generate` as bench_infer.py runs it: KV cache, exactly N_NEW new tokens."""
    import torch

    model = anchors["models"].build_marian(c).eval()
    src = anchors["bench_infer"]._marian_inputs(c, torch)
    attn = torch.ones_like(src)

    def generate(beams: int):
        out = generate_exactly(model, src, attn, N_NEW, beams)
        assert out.shape == (N_SENT, N_NEW + 1), out.shape  # + the decoder start column
        return out

    info = {"attn_impl": model.config._attn_implementation}
    return [Contender(f"hf_fp32/{mode_name(b)}", timed(functools.partial(generate, b)), dict(info)) for b in BEAMS]


class Ct2Worker:
    """A torch-free process holding CTranslate2 translators; times one translate_batch per request."""

    def __init__(self, workdir: Path, cfg_name: str, anchors_dir: Path):
        cmd = [sys.executable, __file__, "--worker", "ct2-time", str(workdir), cfg_name, "--anchors", str(anchors_dir)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = json.loads(self._reply("READY:"))

    def _reply(self, prefix: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"CTranslate2 worker exited (rc {self.proc.wait()}) before answering {prefix}")

    def run(self, name: str) -> float:
        time.sleep(GAP_S)  # let this process's OpenMP threads go to sleep first
        self.proc.stdin.write(name + "\n")
        seconds = float(self._reply("TIME:"))
        time.sleep(GAP_S)  # ... and the worker's
        return seconds

    def contenders(self) -> list[Contender]:
        return [
            Contender(name, functools.partial(self.run, name), info) for name, info in self.info["variants"].items()
        ]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def ct2_time_worker(workdir: str, cfg_name: str) -> None:
    """Worker process: load fp32 and int8 translators, then answer `name` lines with `TIME:seconds` lines."""
    import bench_infer  # torch-free: it imports only the stdlib and common

    bench_infer.WORKDIR = Path(workdir)
    runs, variants = {}, {}
    for precision, compute_type in CT2_TYPES.items():
        for beams in BEAMS:
            out, run = bench_infer.ct2_worker(cfg_name, compute_type, beams)  # also checks lengths, HF agreement
            name = f"ct2_{precision}/{mode_name(beams)}"
            runs[name] = run
            variants[name] = {k: out[k] for k in ("compute_type", "load_s", "agreement_with_hf_greedy") if k in out}
    if "torch" in sys.modules:
        raise RuntimeError("the CTranslate2 worker imported torch")
    print("READY:" + json.dumps({"variants": variants, "torch_imported": False}), flush=True)
    for line in sys.stdin:
        t0 = time.perf_counter()
        runs[line.strip()]()
        print(f"TIME:{time.perf_counter() - t0}", flush=True)


def ct2_convert_worker(workdir: str, cfg_name: str) -> dict:
    """Worker process (torch + ctranslate2): build the random Marian and convert it, as bench_infer.py does."""
    import bench_infer

    bench_infer.WORKDIR = Path(workdir)
    return bench_infer.ct2_prepare(cfg_name)


def bench_decode(cfg_name: str, anchors: dict, warmup: int, reps: int) -> dict:
    """Decoding throughput of nanomt, Marian generate and CTranslate2, round-robin; ratios at the same precision."""
    c = anchors["common"].CONFIGS[cfg_name]
    print(f"== decode {cfg_name}: building contenders", flush=True)
    # The CTranslate2 workers run this file as a script, whose imports need the repository's root on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    contenders, notes = nanomt_decode_contenders(c)
    if available("transformers", "hf generate"):
        contenders += hf_decode_contenders(c, anchors)
    has_ct2 = available("ctranslate2", "ct2") and available("transformers", "ct2")  # converted from Marian
    worker, workdir = None, Path(tempfile.mkdtemp(prefix="nanomt-speed-ct2-"))
    try:
        if has_ct2:
            args = ["ct2-convert", str(workdir), cfg_name, "--anchors", str(anchors["dir"])]
            converted = anchors["common"].run_worker(Path(__file__), args)
            converted.pop("ct2_dir", None)  # a temporary directory, removed below
            notes["ct2_convert"] = converted
            if "error" in converted:
                print(f"skipping ct2: conversion failed: {converted.get('stderr_tail', converted)}", flush=True)
            else:
                worker = Ct2Worker(workdir, cfg_name, anchors["dir"])
                contenders += worker.contenders()
        timings = round_robin(contenders, warmup, reps)
    finally:
        if worker is not None:
            worker.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"notes": notes, "rows": decode_rows(timings)}


def decode_rows(timings: dict) -> dict:
    """Target tokens/s; nanomt's ratios vs Marian generate (fp32) and vs CTranslate2 at the same precision."""
    rows = {}
    for name, t in timings.items():
        impl_precision, mode = name.split("/")
        impl, precision = impl_precision.split("_")
        row = {"impl": impl, "precision": precision, "mode": mode, **t}
        if "median_s" in t:
            row["tgt_tokens_per_s"] = N_SENT * N_NEW / t["median_s"]
        rows[name] = row
    for row in rows.values():
        if row["impl"] != "nanomt" or "tgt_tokens_per_s" not in row:
            continue
        # CTranslate2 has no bf16 on the CPU, so nanomt bf16 is compared with CT2 fp32 (marked "ct2_precision").
        row["ct2_precision"] = "int8" if row["precision"] == "int8" else "fp32"
        for key, other in (("x_hf", f"hf_fp32/{row['mode']}"), ("x_ct2", f"ct2_{row['ct2_precision']}/{row['mode']}")):
            if "tgt_tokens_per_s" in rows.get(other, {}):
                row[key] = row["tgt_tokens_per_s"] / rows[other]["tgt_tokens_per_s"]
    return rows


# ---------------------------------------------------------------------------------------------------------
# 3. `nanomt translate` against CTranslate2: the same batches, each engine in its own process.
# ---------------------------------------------------------------------------------------------------------

TRANSLATE_BEAM = 5


def nanomt_plan(translator, lines: list[str]):
    """The batches (line indices) `Translator.translate` cuts for `lines`, and the lines it decodes at all."""
    # As Translator.translate batches a file: source ids plus EOS, empty lines not decoded, sorted by length and cut at
    # decode.max_tokens padded source tokens. A line past the model's positions is decoded in pieces there, which
    # this plan does not model (capped here): BatchSpy checks the plan against each run and reports a mismatch.
    import numpy as np

    from nanomt.core.batches import make_batches

    ids = translator.tokenizer.encode_src(lines)
    cap = translator.cfg.model.max_positions - 1
    lens = np.array([min(len(s), cap) + 1 if s else 0 for s in ids], dtype=np.int64)
    todo = np.flatnonzero(lens > 0)
    batches = make_batches(lens[todo], lens[todo], translator.cfg.decode.max_tokens, 0, 0, shuffle=False)
    return [todo[b].tolist() for b in batches], todo


class BatchSpy:
    """Records the batches the Translator cuts (its make_batches calls), to check each run against the plan."""

    def __init__(self, module):
        self.module, self.calls = module, []
        self.original = getattr(module, "make_batches", None)
        if self.original is not None:  # a rewrite that batches otherwise leaves the runs unchecked (None)
            module.make_batches = self._record

    def _record(self, *args, **kwargs):
        batches = self.original(*args, **kwargs)
        self.calls.append([list(b) for b in batches])
        return batches

    def take(self, todo) -> list[list[int]] | None:
        """Line indices of the batches of the one translate call since the last take; None if not seen as one."""
        calls, self.calls = self.calls, []
        return [todo[b].tolist() for b in calls[0]] if len(calls) == 1 else None


def nanomt_engine_worker(checkpoint: str, src_file: str, threads: str) -> None:
    """Worker process: nanomt's Translator in float32 and int8, answering the harness (no CTranslate2 here)."""
    import torch

    import nanomt.decoding.translate
    from nanomt.core import runtime
    from nanomt.decoding.translate import Translator

    torch.set_num_threads(int(threads))
    lines = Path(src_file).read_text(encoding="utf-8").splitlines()
    t0 = time.perf_counter()
    engines = {p: Translator.from_checkpoint(checkpoint, int8=p == "int8") for p in PRECISIONS}
    load_s = time.perf_counter() - t0
    runtime.keep_freed_memory()  # as `nanomt translate` does once its model is loaded (nanomt.cli)
    plan, todo = nanomt_plan(engines["fp32"], lines)
    spy, outputs = BatchSpy(nanomt.decoding.translate), {}

    def run(engine: str, beam: int) -> dict:
        start = time.perf_counter()
        texts = engines[engine].translate(lines, beam_size=beam)
        seconds = time.perf_counter() - start
        outputs[engine, beam] = texts
        seen = spy.take(todo)
        sizes = [len(b) for b in (plan if seen is None else seen)]
        matches = None if seen is None else seen == plan
        return {"seconds": seconds, "batch_sizes": sizes, "calls": len(sizes), "matches_plan": matches}

    def latency(engine: str, beam: int, indices: list[int]) -> dict:
        reply = lines_alone(lambda one: engines[engine].translate(one, beam_size=beam), lines, indices)
        spy.calls.clear()
        return reply

    handlers = {
        "run": run,
        "outputs": lambda engine, beam: {"translations": outputs[engine, beam]},
        "latency": latency,
    }
    ready = {"engine": "nanomt", "threads": torch.get_num_threads(), "torch": torch.__version__, "load_s": load_s}
    ready["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    answer_requests(handlers, {**ready, "plan": plan, "max_tokens": engines["fp32"].cfg.decode.max_tokens})


def bench_translate(
    checkpoint: str,
    src_file: str,
    warmup: int,
    reps: int,
    batching: str = "plan",
    n_lines: int | None = None,
    threads: int = NUM_THREADS,
) -> dict:
    """`Translator.translate(lines, beam_size=5)` against CTranslate2's export, float32 and int8, same batches."""
    lines = Path(src_file).read_text(encoding="utf-8").splitlines()[:n_lines]
    beams = {f"beam{TRANSLATE_BEAM}": TRANSLATE_BEAM}
    print(f"== translate {len(lines)} lines of {src_file} with {checkpoint}, beam 5, {batching} batching", flush=True)
    with tempfile.TemporaryDirectory(prefix="nanomt-translate-") as tmp, contextlib.ExitStack() as stack:
        src = Path(tmp) / "src.txt"
        src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        engines = engine_processes(checkpoint, src, Path(tmp), threads)
        for proc in engines.values():
            stack.callback(proc.close)
        if "ct2" in engines:
            engines["ct2"].ask("plan", batches=engines["nanomt"].info["plan"])
        timings = round_robin(engine_contenders(engines, beams, batching), warmup, reps)
        outputs = engine_outputs(engines, beams, batching, {k for k, t in timings.items() if "median_s" in t})
        changed = changed_by_batch_budget(engines["ct2"], beams, outputs) if "ct2" in engines else {}
        harness = harness_info(engines, beams, batching, warmup, reps)
    rows = translate_rows(timings, outputs, checkpoint, src_file, len(lines))
    comparison = engine_comparison(outputs, beams)
    if batching == "plan":
        comparison["ct2_lines_changed_by_batch_budget"] = changed
    comparison["same_batches"] = same_batches(timings, batching)
    return {"rows": rows, "comparison": comparison, "harness": harness}


def translate_rows(timings: dict, outputs: dict, checkpoint: str, src_file: str, n: int) -> dict:
    """Sentences/s of every run, nanomt's ratio to CTranslate2 at the same precision, int8's to float32."""
    rows = {}
    for name, t in timings.items():
        rows[name] = dict(t, checkpoint=shown(checkpoint), src=shown(src_file), n_sentences=n)
        if "median_s" in t:
            rows[name]["sentences_per_s"] = n / t["median_s"]
            rows[name]["output_words"] = sum(len(x.split()) for x in outputs.get(name, []))
    for name, row in rows.items():
        impl_precision, mode = name.split("/")
        if "sentences_per_s" not in row:
            continue
        ct2 = rows.get(f"ct2_translate_{impl_precision.rsplit('_', 1)[1]}/{mode}", {})
        if impl_precision.startswith("nanomt") and "sentences_per_s" in ct2:
            row["x_ct2"] = row["sentences_per_s"] / ct2["sentences_per_s"]
        fp32 = rows.get(f"{impl_precision.replace('int8', 'fp32')}/{mode}", {})
        if impl_precision.endswith("int8") and "sentences_per_s" in fp32:
            row["x_fp32"] = row["sentences_per_s"] / fp32["sentences_per_s"]
    return rows


# ---------------------------------------------------------------------------------------------------------
# Targets, machine, report.
# ---------------------------------------------------------------------------------------------------------


def targets(results: dict) -> list[dict]:
    """The issue's targets, each with its measured value and whether it is met."""
    out = []

    def check(what: str, value: float | None, needed: float) -> None:
        met = None if value is None else value >= needed
        out.append({"target": what, "value": value, "needed": needed, "met": met})

    for cfg, r in results.get("train", {}).items():
        for precision in ("fp32", "bf16"):
            row = r["rows"].get(f"nanomt/{precision}", {})
            check(f"{cfg} train {precision}: nanomt / seed", row.get("x_seed"), TARGETS["train_x_seed"])
            check(f"{cfg} train {precision}: nanomt / Marian", row.get("x_marian"), TARGETS["train_x_marian"])
        row = r["rows"].get("nanomt/bf16", {})
        check(f"{cfg} train bf16: fraction of 860 GFLOP/s", row.get("fraction_of_860"), TARGETS["bf16_peak_fraction"])
        check(
            f"{cfg} train bf16: fraction of measured peak",
            row.get("fraction_of_measured_peak"),
            TARGETS["bf16_peak_fraction"],
        )
    for cfg, r in results.get("decode", {}).items():
        for beams in BEAMS:
            mode = mode_name(beams)
            fp32, int8 = r["rows"].get(f"nanomt_fp32/{mode}", {}), r["rows"].get(f"nanomt_int8/{mode}", {})
            check(f"{cfg} decode {mode} fp32: nanomt / HF generate", fp32.get("x_hf"), TARGETS["decode_x_hf"])
            check(f"{cfg} decode {mode} fp32: nanomt / CT2 fp32", fp32.get("x_ct2"), TARGETS["decode_x_ct2"])
            check(f"{cfg} decode {mode} int8: nanomt / CT2 int8", int8.get("x_ct2"), TARGETS["decode_x_ct2"])
    for name, row in results.get("translate", {}).get("rows", {}).items():
        if name.startswith("nanomt"):
            check(f"translate {name}: nanomt / CT2", row.get("x_ct2"), TARGETS["decode_x_ct2"])
    return out


def machine_info(anchors_dir: Path) -> dict:
    """CPU, threads, versions (read from package metadata: importing ctranslate2 here would slow torch) and git."""
    import torch

    versions = {}
    for package in ("torch", "transformers", "ctranslate2", "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None

    return {
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain")),
        "anchors": shown(anchors_dir),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict) -> str:
    """The tables for the README."""
    m = results["machine"]
    s = results["settings"]
    lines = [
        f"Machine: {m['cpu']}, {m['threads']} threads; torch {m['versions']['torch']}, transformers "
        f"{m['versions']['transformers']}, ctranslate2 {m['versions']['ctranslate2']}; commit {m['git_commit'][:10]}"
        f"{' (dirty)' if m['git_dirty'] else ''}. Median of {s['reps']} round-robin repetitions after {s['warmup']} "
        "warm-up rounds.",
        "",
    ]
    if results.get("train"):
        lines += train_table(results["train"])
    if results.get("decode"):
        lines += decode_table(results["decode"])
    if results.get("translate"):
        lines += translate_table(results["translate"])
    if results.get("targets"):
        lines += ["### Targets", "", "| target | measured | needed | met |", "|---|---|---|---|"]
        for t in results["targets"]:
            met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
            lines.append(f"| {t['target']} | {fmt(t['value'])} | {t['needed']:g} | {met} |")
        lines.append("")
    return "\n".join(lines)


def train_table(train: dict) -> list[str]:
    lines = [
        "### Training step (forward, label-smoothed loss, backward, AdamW)",
        "",
        "| config | implementation | precision | params (M) | step ms | target tok/s | x seed | x Marian | GFLOP/s "
        "| of 860 | of measured peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg, r in train.items():
        for row in r["rows"].values():
            if "median_s" not in row:
                lines.append(f"| {cfg} | {row['impl']} | {row['precision']} | failed: {row.get('error')} |")
                continue
            frac = (fmt(row.get("fraction_of_860"), ".0%"), fmt(row.get("fraction_of_measured_peak"), ".0%"))
            lines.append(
                f"| {cfg} | {row['impl']} | {row['precision']} | {row['params'] / 1e6:.1f} "
                f"| {row['median_s'] * 1e3:.0f} | {row['tgt_tokens_per_s']:.0f} "
                f"| {fmt(row.get('x_seed'))} | {fmt(row.get('x_marian'))} "
                f"| {row['gflops']:.0f} | {frac[0]} | {frac[1]} |"
            )
    lines.append("")
    for cfg, r in train.items():
        g = r["gemm"]
        lines.append(
            f"{cfg}: {r['model_flops_per_step'] / 1e9:.0f} model GFLOP per step; bf16 matmul {g['shape']} measured "
            f"among the steps: {fmt(g.get('gflops'), '.0f')} GFLOP/s (REPORT.md: 860)."
        )
    return [*lines, ""]


def decode_table(decode: dict) -> list[str]:
    lines = [
        f"### Decoding: {N_SENT} sentences x {SRC_LEN} source tokens -> exactly {N_NEW} new tokens each (target tok/s)",
        "",
        "| config | implementation | precision | greedy | beam 4 | greedy x HF | beam 4 x HF | greedy x CT2 "
        "| beam 4 x CT2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg, r in decode.items():
        groups: dict[str, dict] = {}
        for row in r["rows"].values():
            groups.setdefault(f"{row['impl']}_{row['precision']}", {})[row["mode"]] = row
        for rows in groups.values():
            g, b = rows.get("greedy", {}), rows.get("beam4", {})
            first = g or b
            vs = first.get("ct2_precision", first["precision"])
            ct2 = f" ({vs})" if vs != first["precision"] else ""
            lines.append(
                f"| {cfg} | {first['impl']} | {first['precision']} | {fmt(g.get('tgt_tokens_per_s'), '.0f')} "
                f"| {fmt(b.get('tgt_tokens_per_s'), '.0f')} | {fmt(g.get('x_hf'))} | {fmt(b.get('x_hf'))} "
                f"| {fmt(g.get('x_ct2'))}{ct2} | {fmt(b.get('x_ct2'))}{ct2} |"
            )
    lines += [
        "",
        "x HF: against Marian `generate` (fp32). x CT2: against CTranslate2 at the same precision; it has no bf16 on "
        "the CPU, so bf16 is compared with CT2 fp32.",
        "",
    ]
    return lines


def translate_table(translate: dict) -> list[str]:
    """The translate section: each run's times and ratio, then what the harness did and how the outputs compare."""
    lines = [
        f"### `nanomt translate` against CTranslate2 (beam {TRANSLATE_BEAM})",
        "",
        "| run | sentences | median s | min-max s | sentences/s | x CTranslate2 | x float32 | batches |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in translate["rows"].items():
        if "median_s" not in t:
            lines.append(f"| {name} | failed: {t.get('error')} |")
            continue
        lines.append(
            f"| {name} | {t['n_sentences']} | {t['median_s']:.2f} | {t['min_s']:.2f}-{t['max_s']:.2f} "
            f"| {t['sentences_per_s']:.1f} | {fmt(t.get('x_ct2'))} | {fmt(t.get('x_fp32'))} | {t.get('calls', '-')} |"
        )
    h, c = translate["harness"], translate["comparison"]
    threads = ", ".join(f"{k} {v}" for k, v in h["threads"].items())
    lines += ["", f"Batching: {h['how']} Threads: {threads}; {h['processes']}.", ""]
    for name, t in translate["rows"].items():
        if "samples_s" in t:
            lines.append(f"- {name} samples (s): {', '.join(f'{x:.2f}' for x in t['samples_s'])}")
    lines.append(f"- same batches for both engines: {c['same_batches']} ({h['plan_batches']} batches of nanomt's plan)")
    for key, n in c.get("ct2_lines_changed_by_batch_budget", {}).items():
        lines.append(f"- {key}: {n} lines changed by the batch's generation budget")
    for mode, pairs in ((k, v) for k, v in c.items() if k.startswith("beam") or k == "greedy"):
        for key, d in pairs.items():
            lines.append(f"- {mode} {key}: {d['differing_lines']} differing lines {d['first_differing_line_numbers']}")
    return [*lines, ""]


def save(results: dict, out: str) -> tuple[Path, Path]:
    """Write OUT.json and OUT.md: in benchmarks/results/ for a bare name, else where the path says."""
    base = Path(out) if Path(out).parent != Path(".") else RESULTS / out
    base.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = base.with_name(base.name + ".json"), base.with_name(base.name + ".md")
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(markdown(results))
    return json_path, md_path


# ---------------------------------------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------------------------------------


def load_anchors(anchors_dir: Path, with_torch: bool = True) -> dict:
    """The baseline programs of ../shared/bench/anchors/, imported in place."""
    if not (anchors_dir / "common.py").is_file():
        sys.exit(f"baselines not found: {anchors_dir}/common.py is missing (pass --anchors DIR)")
    sys.path.insert(0, str(anchors_dir))
    import bench_infer
    import common

    anchors = {"dir": anchors_dir, "common": common, "bench_infer": bench_infer}
    if with_torch:
        import models

        anchors["models"] = models
    return anchors


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("train", "decode", "translate"), help="run one section (default: all)")
    ap.add_argument("--configs", default="SMALL,BASE", help="comma-separated, from the anchors' common.CONFIGS")
    ap.add_argument("--reps", type=int, default=7, help="timed round-robin rounds (default 7; at least 5 for results)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    ap.add_argument("--quick", action="store_true", help="smoke test: SMALL, 2 reps, 1 warm-up, to speed_quick.*")
    ap.add_argument("--out", help="result file name in benchmarks/results/ (default speed, or speed_quick)")
    ap.add_argument("--anchors", type=Path, default=DEFAULT_ANCHORS, help=f"baselines (default {DEFAULT_ANCHORS})")
    ap.add_argument("--translate-checkpoint", help="checkpoint directory for the translate section")
    ap.add_argument("--src", help="source file for the translate section, one sentence a line")
    ap.add_argument("--lines", type=int, help="translate only the first N lines of --src (--quick: 100)")
    ap.add_argument(
        "--ct2-batching",
        choices=tuple(BATCHINGS),
        default="plan",
        help="plan (default): CTranslate2 decodes nanomt's batches; budget: its own grouping by generation budget",
    )
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "DIR", "CONFIG"), help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=NUM_THREADS, help="translate: each engine's threads (default 2)")
    ap.add_argument("--engine-worker", nargs=3, metavar=("CHECKPOINT", "SRC", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.configs, args.reps, args.warmup = "SMALL", 2, 1
        args.lines = args.lines or 100
    args.out = args.out or ("speed_quick" if args.quick else "speed")
    if bool(args.translate_checkpoint) != bool(args.src):
        ap.error("--translate-checkpoint and --src go together")
    if args.only == "translate" and not args.translate_checkpoint:
        ap.error("--only translate needs --translate-checkpoint DIR --src FILE")
    return args


def run_worker(args: argparse.Namespace) -> None:
    """The worker processes: CTranslate2 conversion (torch) and CTranslate2 timing (no torch)."""
    kind, workdir, cfg_name = args.worker
    anchors = load_anchors(args.anchors, with_torch=False)
    if kind == "ct2-time":
        ct2_time_worker(workdir, cfg_name)
        return
    try:
        anchors["common"].emit(ct2_convert_worker(workdir, cfg_name))
    except Exception as e:
        anchors["common"].emit({"error": repr(e)})


def translate_only(args: argparse.Namespace) -> None:
    """--only translate: no anchors and no torch here, only the engines' worker processes."""
    start = time.perf_counter()
    settings = {"sections": ["translate"], "reps": args.reps, "warmup": args.warmup, "quick": args.quick}
    results: dict = {"settings": {**settings, "lines": args.lines, "ct2_batching": args.ct2_batching}}
    results["translate"] = bench_translate(
        args.translate_checkpoint, args.src, args.warmup, args.reps, args.ct2_batching, args.lines, args.threads
    )
    results["translate"]["harness"]["parent_imported_torch"] = "torch" in sys.modules  # stays False here
    results["machine"] = translate_machine(results["translate"]["harness"])
    results["targets"] = targets(results)
    results["wall_s"] = time.perf_counter() - start
    json_path, md_path = save(results, args.out)
    print(markdown(results))
    print(f"wrote {json_path} and {md_path} in {results['wall_s']:.0f} s")


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
        return
    if args.engine_worker:
        nanomt_engine_worker(*args.engine_worker)
        return
    if args.only == "translate":
        translate_only(args)
        return
    anchors = load_anchors(args.anchors)
    import torch

    torch.set_num_threads(NUM_THREADS)
    configs = [x.strip() for x in args.configs.split(",") if x.strip()]
    unknown = set(configs) - set(anchors["common"].CONFIGS)
    if unknown:
        sys.exit(f"unknown config(s) {sorted(unknown)}; the anchors have {sorted(anchors['common'].CONFIGS)}")
    sections = [args.only] if args.only else ["train", "decode"] + (["translate"] if args.translate_checkpoint else [])
    from nanomt.core.runtime import cpu_has_bf16_kernels

    if {"train", "decode"} & set(sections) and not cpu_has_bf16_kernels():
        sys.exit(
            "benchmarks.speed: this CPU has no bf16 matrix kernels (AVX2 only: bf16 matmuls ~60x slower than fp32); "
            "the train and decode sections time bf16 against an AVX-512 report: run them on an AVX-512 or AMX CPU, "
            "or --only translate"
        )
    results = {
        "machine": machine_info(args.anchors),
        "settings": {
            "configs": configs,
            "sections": sections,
            "reps": args.reps,
            "warmup": args.warmup,
            "quick": args.quick,
            "bf16_peak_gflops_report": BF16_PEAK_GFLOPS,
            "targets": TARGETS,
        },
    }
    start = time.perf_counter()
    if "train" in sections:
        results["train"] = {}
        for cfg in configs:
            results["train"][cfg] = bench_train(cfg, anchors, args.warmup, args.reps)
            save(results, args.out)
    if "decode" in sections:
        results["decode"] = {}
        for cfg in configs:
            results["decode"][cfg] = bench_decode(cfg, anchors, args.warmup, args.reps)
            save(results, args.out)
    if "translate" in sections:
        results["translate"] = bench_translate(
            args.translate_checkpoint, args.src, args.warmup, args.reps, args.ct2_batching, args.lines, args.threads
        )
    results["targets"] = targets(results)
    results["wall_s"] = time.perf_counter() - start
    json_path, md_path = save(results, args.out)
    print(markdown(results))
    print(f"wrote {json_path} and {md_path} in {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
