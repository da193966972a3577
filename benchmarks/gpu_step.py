"""Training-step throughput of the base model at the paper's batch size: nanomt's variants beside Hugging Face Marian.

One command on a GPU machine, from the repository root (scripts/gpu_check.sh runs it):

    python -m benchmarks.gpu_step --device cuda --out benchmarks/results/gpu_check/gpu_step.json

The batches are what training makes: sentence lengths drawn from WMT news (benchmarks/data/newstest2009_lengths.tsv,
words a sentence of newstest2009 de/en, scaled so that targets average WMT's ~27 pieces), token-budget batches of
sentences of similar length (nanomt.core.batches.make_batches, max_tokens 25,000 padded per side: ~25k target tokens
a step, as the paper's), random ids. Every contender takes the same sentences in each step; a batch starts on the
host, in pinned memory, and is copied to the device without a wait (as `nanomt train` does), except where the
contender says otherwise.

A step: forward under bf16 autocast (CUDA; fp32 elsewhere), label-smoothed (0.1) cross-entropy summed and divided by
the target tokens, backward, gradient clipping, fused AdamW, zero_grad; no host sync inside. The contenders, each one
change from `nanomt` (the training step as it is):

    nanomt              padded batches (widths a multiple of 8), F.cross_entropy, eager
    nanomt_packed       the same sentences packed into one row (train.packed): varlen flash attention on CUDA
    nanomt_chunked_ce   the blockwise label-smoothed loss (gradient written in the forward pass, 8192-row blocks)
    nanomt_compiled     torch.compile(dynamic=True) over bucketed shapes (train.compile); compile time reported
    nanomt_pageable     the batch copied from pageable (not pinned) memory: what pinning and overlap save
    nanomt_fp32         no autocast (TF32 matmuls): what bf16 buys
    marian              MarianMTModel of the same shape (SDPA attention), the same padded batches and loss

FLOPs of a step (model FLOPs, what MFU counts: the real tokens' work, padding excluded, so every contender is
credited the same FLOPs for the same sentences), with N_enc = L (4 D^2 + 2 D F), N_dec = L (8 D^2 + 2 D F), and
S_i, T_i the i-th sentence's source and target lengths (+ EOS / BOS):

    6 * (N_enc * sum S_i + (N_dec + D * V) * sum T_i) + 12 * D * L * sum_i (S_i^2 + T_i^2 + T_i * S_i)

6 per multiply-accumulate for forward and backward; attention scores and weighted sums are 2 matmuls of 2 FLOPs x 3
(forward + backward) per query-key pair and layer, causal pairs not halved; embedding lookups, norms, biases and
softmax are left out (under 1%). The cross-attention's K/V projections (2 D^2 of N_dec) run on source tokens and
are counted on target tokens: equal where the sums are (about, here). MFU = model FLOPs / step time / the device's
dense bf16 peak. step_memory_gib: the step's own peak, torch.cuda.max_memory_allocated over a contender's timed steps
less what was allocated before them (the contenders' weights and optimizer states, resident throughout):
activations, logits, gradients. Add 16 bytes a parameter (fp32 weight, gradient, two AdamW moments) for the whole.

--smoke runs the same code on a CPU at a tiny shape (a test). On a CPU the packed contender takes the block-diagonal
mask in rows of 128 positions (as train.packed does there), the loss is the blockwise one already (nanomt_chunked_ce
is nanomt), and compile defaults to the "eager" backend. The CPU's own step, the Multi30k recipe's model and batch:

    python -m benchmarks.gpu_step --device cpu --shape cpu --contenders nanomt nanomt_packed nanomt_compiled \
        --compile-backend inductor --out benchmarks/results/cpu_step.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import marian_config, model_config, sync
from nanomt import Transformer
from nanomt.core.batches import make_batches
from nanomt.core.config import SpecialIds
from nanomt.training.data import collate, pack
from nanomt.training.stream import PAD_MULTIPLE, bucketed, pad_width
from nanomt.training.train import label_smoothed_loss
from scripts.common import ROOT, cpu_model, git

BASE = dict(d_model=512, n_heads=8, layers=6, d_ff=2048, vocab=37000, max_tokens=25000, mean_tgt=27.0, sentences=60000)
SMOKE = dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200, max_tokens=300, mean_tgt=12.0, sentences=200)
# The Multi30k recipe's model and batches (configs/multi30k_de_en.yaml), for the CPU's step: --shape cpu.
CPU = dict(d_model=256, n_heads=4, layers=4, d_ff=1024, vocab=8000, max_tokens=2500, mean_tgt=15.0, sentences=6000)
SHAPES = {"base": BASE, "cpu": CPU, "smoke": SMOKE}
PEAK_BF16_TFLOPS = {"H100": 989.5, "H200": 989.5, "A100": 312.0}  # dense, SXM; by device-name substring
LENGTHS = ROOT / "benchmarks" / "data" / "newstest2009_lengths.tsv"
SMOOTHING = 0.1
IDS = SpecialIds(pad=0, bos=2, eos=3)
CONTENDERS = (
    "nanomt",
    "nanomt_packed",
    "nanomt_chunked_ce",
    "nanomt_compiled",
    "nanomt_pageable",
    "nanomt_fp32",
    "marian",
)
CPU_ROW_TOKENS = 128


def sentence_lengths(shape: dict, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`sentences` (source, target) lengths drawn from newstest2009's, scaled to a target mean of `mean_tgt`."""
    words = np.loadtxt(LENGTHS, dtype=np.float64, comments="#", ndmin=2)  # (N, 2): de, en words
    scale = shape["mean_tgt"] / words[:, 1].mean()
    rng = np.random.default_rng(seed)
    pick = words[rng.integers(0, len(words), shape["sentences"])] * scale
    lens = np.clip(np.rint(pick), 1, 250).astype(np.int64)
    return lens[:, 0], lens[:, 1]


class RandomPairs:
    """A corpus of the given lengths with random ids (4 on: 0-3 are PAD, UNK, BOS, EOS), as collate and pack read."""

    def __init__(self, src_lens: np.ndarray, tgt_lens: np.ndarray, vocab: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.src_lens, self.tgt_lens = src_lens, tgt_lens
        self.ids = rng.integers(4, vocab, int(src_lens.sum() + tgt_lens.sum()))
        self.src_at = np.concatenate([[0], np.cumsum(src_lens)])
        self.tgt_at = self.src_at[-1] + np.concatenate([[0], np.cumsum(tgt_lens)])

    def __len__(self) -> int:
        return len(self.src_lens)

    def src(self, i: int) -> np.ndarray:
        return self.ids[self.src_at[i] : self.src_at[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.ids[self.tgt_at[i] : self.tgt_at[i + 1]]


def flops_per_step(shape: dict, src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Model FLOPs of one training step over these sentences (lengths + EOS / BOS; the module docstring's formula)."""
    d, f, layers, v = shape["d_model"], shape["d_ff"], shape["layers"], shape["vocab"]
    s, t = np.asarray(src_lens, dtype=np.float64), np.asarray(tgt_lens, dtype=np.float64)
    n_enc, n_dec = layers * (4 * d * d + 2 * d * f), layers * (8 * d * d + 2 * d * f)
    dense = 6 * (n_enc * s.sum() + (n_dec + d * v) * t.sum())
    attention = 12 * d * layers * float((s * s + t * t + t * s).sum())
    return float(dense + attention)


def nanomt_model(shape: dict, device: torch.device, max_positions: int) -> Transformer:
    cfg = model_config(
        shape["vocab"],
        shape["d_model"],
        shape["layers"],
        shape["n_heads"],
        shape["d_ff"],
        share_embeddings=True,
        tie_output=True,
        max_positions=max_positions,
        pad_id=IDS.pad,
        bos_id=IDS.bos,
        eos_id=IDS.eos,
    )
    return Transformer(cfg).to(device)


def marian_model(shape: dict, device: torch.device, max_positions: int) -> torch.nn.Module | None:
    """MarianMTModel of the same shape, or None without transformers."""
    try:
        from transformers import MarianMTModel
    except ImportError:
        return None
    cfg = marian_config(
        shape["vocab"],
        shape["d_model"],
        shape["layers"],
        shape["n_heads"],
        shape["d_ff"],
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=max_positions,
        pad_token_id=IDS.pad,
        decoder_start_token_id=IDS.bos,
        share_encoder_decoder_embeddings=True,
        scale_embedding=True,
    )
    return MarianMTModel._from_config(cfg, attn_implementation="sdpa").to(device)


def host_batches(name: str, corpus: RandomPairs, plan: list, device: torch.device, pin: bool, half: bool) -> list:
    """The contender's batches of the plan's sentences, on the host."""
    cuda = device.type == "cuda"
    out = []
    for idx in plan:
        if name == "nanomt_packed":  # one row where the varlen kernel runs (CUDA, half precision), as training packs
            one_row = int(corpus.src_lens[idx].sum() + corpus.tgt_lens[idx].sum()) + len(idx) * 2 + 2
            row_tokens = one_row if cuda and half else CPU_ROW_TOKENS
            b = pack(corpus, idx, IDS, row_tokens, multiple=PAD_MULTIPLE if cuda else 1)
        elif name == "nanomt_compiled":
            b = bucketed(collate(corpus, idx, IDS), IDS.pad)
        else:
            b = pad_width(collate(corpus, idx, IDS), PAD_MULTIPLE, IDS.pad) if cuda else collate(corpus, idx, IDS)
        out.append(b.map(torch.Tensor.pin_memory) if pin and cuda else b)
    return out


def make_step(name: str, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, backend: str):
    """One training step of this contender on a host batch; returns the loss (not read: no sync)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=device.type in ("cpu", "cuda"))
    model.train()
    forward = model
    if name == "nanomt_compiled":
        forward = torch.compile(model, dynamic=True, backend=backend)
    fused = False if name == "nanomt_chunked_ce" else None
    rows = 8192 if device.type == "cuda" else 32

    def step(host) -> torch.Tensor:
        b = host.map(lambda t: t.to(device, non_blocking=True))
        ctx = (
            torch.autocast(device.type, dtype=dtype)
            if dtype is not None
            else torch.autocast(device.type, enabled=False)
        )
        with ctx:
            if isinstance(model, Transformer):
                logits = forward(b.src, b.tgt_in, packing=b.packing)
            else:
                out = model(
                    input_ids=b.src, attention_mask=b.src != IDS.pad, decoder_input_ids=b.tgt_in, use_cache=False
                )
                logits = out.logits
        loss = label_smoothed_loss(logits, b.tgt_out, SMOOTHING, IDS.pad, fused=fused, rows=rows) / b.n_tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, its defaults resolved (they depend on --smoke and the device)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None, help="JSON results file (default: print only)")
    p.add_argument("--smoke", "--tiny", action="store_true", help="a tiny shape, a few steps (a CPU test)")
    p.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: base (smoke with --smoke)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per contender and round (default 10)")
    p.add_argument("--warmup", type=int, default=None, help="default 3 (the compiled contender: its compilations)")
    p.add_argument("--rounds", type=int, default=None, help="default 3")
    p.add_argument("--batches", type=int, default=8, help="distinct batches, taken in turn")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, else fp32")
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None, help="default: all")
    p.add_argument("--compile-backend", default=None, help="default: inductor on CUDA, eager elsewhere")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak for MFU")
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    cuda = args.device.type == "cuda"
    args.shape = dict(SHAPES[args.shape or ("smoke" if args.smoke else "base")])
    args.steps = args.steps or (2 if args.smoke else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    args.rounds = args.rounds or (1 if args.smoke else 3)
    args.precision = args.precision or ("bf16" if cuda else "fp32")
    args.dtype = torch.bfloat16 if args.precision == "bf16" else None
    args.compile_backend = args.compile_backend or ("inductor" if cuda else "eager")
    args.contenders = [n for n in (args.contenders or CONTENDERS) if not (n == "nanomt_fp32" and args.dtype is None)]
    return args


def prepare(args: argparse.Namespace, corpus: RandomPairs, plan: list, max_positions: int, errors: dict) -> dict:
    """Each contender's model, step and device-ready batches, warmed up (the compiled one on every batch shape):
    {name: {"model", "step", "batches", "warmup_s"}}; a contender that fails is an entry of `errors` instead."""
    ready = {}
    for name in args.contenders:
        try:
            torch.manual_seed(0)
            build = marian_model if name == "marian" else nanomt_model
            model = build(args.shape, args.device, max_positions + 2)
            if model is None:
                errors[name] = "skipped: no transformers"
                continue
            step_dtype = None if name == "nanomt_fp32" else args.dtype
            step = make_step(name, model, args.device, step_dtype, args.compile_backend)
            pin, half = name != "nanomt_pageable", args.dtype is not None
            batches = host_batches(name, corpus, plan, args.device, pin=pin, half=half)
            t0 = time.perf_counter()
            for i in range(max(args.warmup, len(plan) if name == "nanomt_compiled" else 0)):  # every shape compiled
                step(batches[i % len(plan)])
            sync(args.device)
            ready[name] = {
                "model": model,
                "step": step,
                "batches": batches,
                "warmup_s": round(time.perf_counter() - t0, 2),
            }
        except Exception as e:  # one contender's failure is its result; the others run
            errors[name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    return ready


def time_rounds(args: argparse.Namespace, ready: dict, n_batches: int, errors: dict) -> dict:
    """Each contender's seconds a step in each round ("seconds") and its step's own peak memory ("peak_memory"),
    the contenders taking turns within a round; one that fails leaves `ready` for `errors`."""
    cuda = args.device.type == "cuda"
    for r in ready.values():
        r["seconds"], r["peak_memory"] = [], 0
    for _ in range(args.rounds):
        for name, r in list(ready.items()):
            try:
                sync(args.device)
                if cuda:
                    torch.cuda.reset_peak_memory_stats(args.device)
                    resident = torch.cuda.memory_allocated(args.device)  # every contender's weights and AdamW state
                t0 = time.perf_counter()
                for i in range(args.steps):
                    r["step"](r["batches"][i % n_batches])
                sync(args.device)
                r["seconds"].append((time.perf_counter() - t0) / args.steps)
                if cuda:
                    r["peak_memory"] = max(r["peak_memory"], torch.cuda.max_memory_allocated(args.device) - resident)
            except Exception as e:
                errors[name] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
                del ready[name]
    return ready


def contender_results(args: argparse.Namespace, ready: dict, flops: float, tokens: float) -> dict:
    """A contender's line: its best round's step time, throughput, model TFLOP/s and MFU, memory, warm-up."""
    peak = peak_tflops(args.device, args.peak_tflops)
    results = {}
    for name, r in ready.items():
        best = min(r["seconds"])
        achieved = flops / best / 1e12
        results[name] = {
            "step_ms": round(best * 1e3, 3),
            "step_ms_all_rounds": [round(x * 1e3, 3) for x in r["seconds"]],
            "target_tokens_per_s": round(tokens / best, 1),
            "model_tflops": round(achieved, 3),
            "mfu": round(achieved / peak, 4) if peak else None,
            "step_memory_gib": round(r["peak_memory"] / 2**30, 3) if args.device.type == "cuda" else None,
            "warmup_s": r["warmup_s"],
            "speedup_vs_nanomt": None,
            "parameters": sum(p.numel() for p in r["model"].parameters()),
        }
    if "nanomt" in results:
        for r in results.values():
            r["speedup_vs_nanomt"] = round(results["nanomt"]["step_ms"] / r["step_ms"], 3)
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    shape, device = args.shape, args.device
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    src_lens, tgt_lens = sentence_lengths(shape)
    corpus = RandomPairs(src_lens, tgt_lens, shape["vocab"])
    plan = make_batches(src_lens, tgt_lens, shape["max_tokens"], seed=0, epoch=0)[: args.batches]
    max_positions = int(max(src_lens.max(), tgt_lens.max())) + 8
    errors: dict[str, str] = {}
    ready = time_rounds(args, prepare(args, corpus, plan, max_positions, errors), len(plan), errors)
    # Per step, averaged over the batches a timed block cycles through (steps_i % len(plan)).
    taken = [plan[i % len(plan)] for i in range(args.steps)]
    flops = sum(flops_per_step(shape, src_lens[b] + 1, tgt_lens[b] + 1) for b in taken) / args.steps
    tokens = sum(int(tgt_lens[b].sum()) + len(b) for b in taken) / args.steps
    padded = [collate(corpus, b, IDS) for b in taken]
    report = {
        "what": "training step (forward, label-smoothed CE, backward, clip, fused AdamW) on token-budget batches",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model(),
        "precision": args.precision,
        "shape": shape,
        "lengths": f"{LENGTHS.relative_to(ROOT)} scaled to a target mean of {shape['mean_tgt']}",
        "batches": len(plan),
        "sentences_per_step": sum(len(b) for b in taken) / args.steps,
        "target_tokens_per_step": tokens,
        "padding_fraction_padded": round(
            1 - sum(b.n_tgt_tokens for b in padded) / sum(b.tgt_out.numel() for b in padded), 4
        ),
        "flops_per_step": flops,
        "flops_per_target_token": flops / tokens,
        "flops_formula": "6*(N_enc*sum S_i + (N_dec + D*V)*sum T_i) + 12*D*L*sum_i(S_i^2 + T_i^2 + T_i*S_i)",
        "mfu_formula": "flops_per_step / step_s / peak_tflops",
        "peak_tflops": peak_tflops(device, args.peak_tflops),
        "compile_backend": args.compile_backend,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "results": contender_results(args, ready, flops, tokens),
        "skipped": [f"{n} ({e})" for n, e in errors.items()],
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "commit": git("rev-parse", "HEAD") or None,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
