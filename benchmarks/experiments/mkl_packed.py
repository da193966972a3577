"""MKL's packed single-precision GEMM against F.linear on the decoder's shapes, float32, 2 threads.

    python -m benchmarks.experiments.mkl_packed        # the Multi30k recipe's model shapes -> results/mkl_packed.json
    python -m benchmarks.experiments.mkl_packed --d-model 512 --d-ff 2048 --vocab 58101 \\
        --out runs/mkl_opus.json                       # opus-mt's

PyTorch ships MKL's packed GEMM as torch.ops.mkl._mkl_reorder_linear_weight (pack W once, for a given row count) and
torch.ops.mkl._mkl_linear (what Inductor's freezing pass calls for CPU inference). Here each linear layer of a
decoder step (fused QKV, the self- and cross-attention output, the cross-attention query, the FFN's two, the
vocabulary projection) is timed at the row counts beam search feeds it (sentences x beam), both ways, alternated,
and checked equal to float tolerance. A packed weight is packed for one row count: the table says whether packing
wins at each, which decides whether decoding should use it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from scripts.common import RESULTS, machine

ROWS = (5, 40, 160, 320, 640)  # one sentence at beam 5 .. a batch of 128 sentences at beam 5


def shapes(d_model: int, d_ff: int, vocab: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer a decoder step runs."""
    return {
        "self_qkv": (d_model, 3 * d_model),
        "attn_out": (d_model, d_model),
        "cross_q": (d_model, d_model),
        "ffn_in": (d_model, d_ff),
        "ffn_out": (d_ff, d_model),
        "vocab": (d_model, vocab),
    }


def timed(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def compare(k: int, n: int, rows: int, reps: int, rounds: int) -> dict:
    """Median microseconds of F.linear and the packed GEMM on a (rows, k) x (k, n) product, alternated."""
    torch.manual_seed(0)
    x, w, b = torch.randn(rows, k), torch.randn(n, k) * k**-0.5, torch.randn(n)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    plain = lambda: F.linear(x, w, b)  # noqa: E731
    mkl = lambda: torch.ops.mkl._mkl_linear(x, packed, w, b, rows)  # noqa: E731
    error = float((plain() - mkl()).abs().max())
    a, p = [], []
    for _ in range(rounds):
        a.append(timed(plain, reps))
        p.append(timed(mkl, reps))
    linear, packed = statistics.median(a), statistics.median(p)
    return {
        "rows": rows, "linear_us": round(1e6 * linear, 1), "packed_us": round(1e6 * packed, 1),
        "speedup": round(linear / packed, 3), "max_abs_difference": error,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4272, help="scored target ids (the recipe's restricted output)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "mkl_packed.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    table = {
        name: [compare(k, n, rows, args.reps, args.rounds) for rows in ROWS]
        for name, (k, n) in shapes(args.d_model, args.d_ff, args.vocab).items()
    }
    totals = {
        rows: {
            kind: round(sum(next(r for r in table[name] if r["rows"] == rows)[kind] for name in table), 1)
            for kind in ("linear_us", "packed_us")
        }
        for rows in ROWS
    }
    result = {
        "measures": "one decoder step's linear layers, float32: F.linear against MKL's packed GEMM "
        "(torch.ops.mkl._mkl_linear, weights packed once for the row count), median microseconds",
        "shape": {"d_model": args.d_model, "d_ff": args.d_ff, "vocab": args.vocab},
        "layers": table,
        "step_totals_us": totals,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for rows, t in totals.items():
        print(f"rows {rows:4d}: linear {t['linear_us']:8.1f} us  packed {t['packed_us']:8.1f} us  "
              f"x{t['linear_us'] / t['packed_us']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
