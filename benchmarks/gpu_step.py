"""Training-step throughput of the base model on a GPU: target tokens/s and MFU, nanomt beside Hugging Face Marian.

One command on a GPU machine, from the repository root:

    python -m benchmarks.gpu_step --device cuda --out benchmarks/results/gpu_step.json

A step is what `nanomt train` does on a GPU: forward under bf16 autocast, label-smoothed (0.1) cross-entropy
summed and divided by the target tokens (F.cross_entropy, one fused expression), backward, gradient clipping,
fused AdamW, zero_grad; no host sync inside. Marian (MarianMTModel of the same shape: shared embeddings tied to
the output, ReLU, sinusoidal positions, SDPA attention) takes the same batches and the same loss on its logits.
Both are timed round-robin after warm-up steps, with a device synchronize around each timed block.

FLOPs per step (model FLOPs, what MFU counts): 6 per multiply-accumulate parameter and token for forward plus
backward, over the matmul parameters each token passes through (encoder layers for source tokens; decoder layers
and the V x D output projection for target tokens), plus attention scores and weighted sums, 12 x D per query-key
pair and layer (2 matmuls x 2 FLOPs x 3 for backward), with every padded pair counted as the kernels compute them:

    6 * (N_enc * src_tokens + (N_dec + D * V) * tgt_tokens) + 12 * D * B * (L_enc * S^2 + L_dec * (T^2 + T * S))

N_enc = L_enc * (4 D^2 + 2 D F), N_dec = L_dec * (8 D^2 + 2 D F); embeddings lookups, norms, biases and softmax
are left out (under 1%). The cross-attention's K/V projections (2 D^2 of N_dec) run on source tokens: the same
count where S = T, as here. The batches are full-length (no padding), so the formula's tokens are the real ones.
--tiny runs the same code on a small shape, for a test on a CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from benchmarks.common import git
from nanomt import ModelConfig, Transformer
from nanomt.training.train import label_smoothed_loss

BASE = dict(d_model=512, n_heads=8, layers=6, d_ff=2048, vocab=37000, batch=128, src_len=32, tgt_len=32)
TINY = dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200, batch=4, src_len=8, tgt_len=8)
PEAK_BF16_TFLOPS = {"H100": 989.5, "H200": 989.5, "A100": 312.0}  # dense, SXM; by device-name substring
SMOOTHING, PAD, BOS = 0.1, 0, 2


def flops_per_step(s: dict) -> float:
    """Model FLOPs of one training step on a full-length batch (the formula in the module docstring)."""
    d, f, layers, b = s["d_model"], s["d_ff"], s["layers"], s["batch"]
    n_enc, n_dec = layers * (4 * d * d + 2 * d * f), layers * (8 * d * d + 2 * d * f)
    src, tgt = b * s["src_len"], b * s["tgt_len"]
    dense = 6 * (n_enc * src + (n_dec + d * s["vocab"]) * tgt)
    attention = 12 * d * b * (layers * s["src_len"] ** 2 + layers * (s["tgt_len"] ** 2 + s["tgt_len"] * s["src_len"]))
    return float(dense + attention)


def batches(s: dict, n: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """n random full-length (src, tgt_in, tgt_out) batches; ids from 4 on (0-3 are PAD, UNK, BOS, EOS)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        src = torch.randint(4, s["vocab"], (s["batch"], s["src_len"]), generator=g)
        tgt = torch.randint(4, s["vocab"], (s["batch"], s["tgt_len"] + 1), generator=g)
        tgt[:, 0] = BOS
        out.append(tuple(t.to(device) for t in (src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous())))
    return out


def nanomt_model(s: dict, device: torch.device) -> torch.nn.Module:
    cfg = ModelConfig(
        src_vocab_size=s["vocab"],
        tgt_vocab_size=s["vocab"],
        d_model=s["d_model"],
        n_heads=s["n_heads"],
        n_encoder_layers=s["layers"],
        n_decoder_layers=s["layers"],
        d_ff=s["d_ff"],
        share_embeddings=True,
        tie_output=True,
    )
    return Transformer(cfg).to(device)


def marian_model(s: dict, device: torch.device) -> torch.nn.Module | None:
    """MarianMTModel of the same shape, or None without transformers."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    cfg = MarianConfig(
        vocab_size=s["vocab"],
        decoder_vocab_size=s["vocab"],
        d_model=s["d_model"],
        encoder_layers=s["layers"],
        decoder_layers=s["layers"],
        encoder_attention_heads=s["n_heads"],
        decoder_attention_heads=s["n_heads"],
        encoder_ffn_dim=s["d_ff"],
        decoder_ffn_dim=s["d_ff"],
        activation_function="relu",
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=max(s["src_len"], s["tgt_len"]) + 2,
        pad_token_id=PAD,
        decoder_start_token_id=BOS,
        share_encoder_decoder_embeddings=True,
        scale_embedding=True,
    )
    return MarianMTModel._from_config(cfg, attn_implementation="sdpa").to(device)


def logits_of(model: torch.nn.Module, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    if isinstance(model, Transformer):
        return model(src, tgt_in)
    out = model(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in, use_cache=False)
    return out.logits


def make_step(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None):
    """One training step on a batch, as `nanomt train` runs it on this device; returns the loss (not read)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=device.type in ("cpu", "cuda"))
    model.train()

    def step(src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        ctx = (
            torch.autocast(device.type, dtype=dtype)
            if dtype is not None
            else torch.autocast(device.type, enabled=False)
        )
        with ctx:
            logits = logits_of(model, src, tgt_in)
        loss = label_smoothed_loss(logits, tgt_out, SMOOTHING, PAD) / tgt_out.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None, help="JSON results file (default: print only)")
    p.add_argument("--tiny", action="store_true", help="a tiny shape (a CPU smoke test)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per contender and round")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, else fp32")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak for MFU")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    shape = dict(TINY if args.tiny else BASE)
    precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if precision == "bf16" else None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    data = batches(shape, 4, device)
    contenders = {"nanomt": nanomt_model(shape, device), "marian": marian_model(shape, device)}
    steps = {name: make_step(m, device, dtype) for name, m in contenders.items() if m is not None}
    for step in steps.values():  # warm-up: kernels chosen, caches filled
        for i in range(args.warmup):
            step(*data[i % len(data)])
    sync(device)
    seconds = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            sync(device)
            t0 = time.perf_counter()
            for i in range(args.steps):
                step(*data[i % len(data)])
            sync(device)
            seconds[name].append((time.perf_counter() - t0) / args.steps)
    flops, tokens = flops_per_step(shape), shape["batch"] * shape["tgt_len"]
    peak = peak_tflops(device, args.peak_tflops)
    results = {}
    for name, s in seconds.items():
        best = min(s)
        achieved = flops / best / 1e12
        results[name] = {
            "step_ms": round(best * 1e3, 3),
            "step_ms_all_rounds": [round(x * 1e3, 3) for x in s],
            "target_tokens_per_s": round(tokens / best, 1),
            "model_tflops": round(achieved, 3),
            "mfu": round(achieved / peak, 4) if peak else None,
            "parameters": sum(p.numel() for p in contenders[name].parameters()),
        }
    report = {
        "what": "training step (forward, label-smoothed CE, backward, clip, fused AdamW), base shape unless tiny",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "precision": precision,
        "shape": shape,
        "flops_per_step": flops,
        "flops_per_target_token": flops / tokens,
        "flops_formula": "6*(N_enc*src_tokens + (N_dec + D*V)*tgt_tokens) + 12*D*B*(L*S^2 + L*(T^2 + T*S))",
        "peak_tflops": peak,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "results": results,
        "skipped": [] if contenders["marian"] is not None else ["marian (no transformers)"],
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
