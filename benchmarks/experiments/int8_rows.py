"""int8 linear layers with per-row activation scales: the candidate kernels at the decoder's shapes, and test2016.

Run from the repository root on an otherwise idle machine:

    python -m benchmarks.experiments.int8_rows --checkpoint runs/multi30k_de_en --data ../shared/data/multi30k
    python -m benchmarks.experiments.int8_rows --only kernels          # the kernels alone, no checkpoint needed

1. kernels: one linear layer y = x W^T + b, x (rows, in) with rows 1, 5, 40 and 320 (one sentence greedy, one at
   beam 5, a batch, 64 sentences at beam 5), at every matrix shape of a decoder step of four models (Multi30k's
   256/1024 with 4,272 kept output ids, SMALL 256/1024/8k, BASE 512/2048/32k, opus-mt's 512/2048/58,101), in
   microseconds a call, median of --reps round-robin rounds in one process, 2 threads. The candidates:
   - `fp32`: F.linear (MKL);
   - `per_tensor`: torch.ao's dynamic quantization (what `--int8` was: FBGEMM, per-channel int8 weights, one 7-bit
     activation scale per tensor, so per batch);
   - `nanomt`: `nanomt.decoding.quantize.quantize_int8`'s Int8Linear: per-row 7-bit activation codes, then
     `torch._int_mm` for layers of up to 2^20 weights on CPUs with AVX512-VNNI, else oneDNN's prepacked u8 x s8
     `qlinear_pointwise`; the row's step and the bias after. `rows_int_mm` and `rows_qlinear` are the same layer
     with one kernel forced;
   - `fbgemm_rows`: each row divided by its max |x|, then FBGEMM's `linear_with_input_q_dq_qweight_dq_output_fp32`
     with one fixed 7-bit input scale, then the row's max and the bias (per-row scales through FBGEMM);
   - `weight_only`: `torch._weight_int8pack_mm`, int8 weights with float32 activations (timed up to 5 rows).
   With each: its error against fp32 (relative Frobenius norm over 320 rows of different sizes) and whether a
   row's output is bit-identical alone and among 319 others. The `decoder_step` rows add up one step's layers of
   each model (the cross-attention keys/values, computed once a sentence, left out).
2. translate (with --checkpoint): test2016 at beam 5 through `nanomt evaluate --json` (float32 and --int8, each in
   its own process), then in this process, round-robin over --rounds rounds: float32, `--int8` as it is now
   (`int8_rows`), the per-tensor int8 it replaced (`int8_per_tensor`) and per-row int8 with 8-bit codes through
   the same kernels (`int8_rows_8bit`, right only on CPUs with AVX512-VNNI): BLEU, chrF, sentences/s, translations
   identical to float32's, and the first --alone sentences translated one at a time (each engine in turn: the
   milliseconds a sentence, a lone request's latency) against the same sentences in the file's batches (identical
   lines).

Results: benchmarks/results/int8_rows.json, with the machine and the commit.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.harness import NUM_THREADS, Contender, limit_threads, round_robin
from scripts.common import DEFAULT_DATA, DEFAULT_RUN, RESULTS, ROOT, machine, shown, write_results

limit_threads()  # before torch starts

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from nanomt.core.checkpoint import load_checkpoint  # noqa: E402
from nanomt.decoding.quantize import Int8Linear, quantize_int8  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.training.evaluate import evaluate  # noqa: E402

ROWS = (1, 5, 40, 320)
# name: (d_model, d_ff, output rows, decoder layers)
MODELS = {
    "multi30k": (256, 1024, 4272, 4),
    "small": (256, 1024, 8000, 3),
    "base": (512, 2048, 32000, 6),
    "opus_mt": (512, 2048, 58101, 6),
}
MACS_PER_SAMPLE = 2e8  # each timed sample repeats a call until about this many multiply-adds (tens of ms)
WEIGHT_ONLY_MAX_ROWS = 5


def step_layers(d: int, ff: int, vocab: int) -> list[tuple[int, int]]:
    """(in, out) of every linear layer one decoder layer runs a step, then the output projection's."""
    # Self-attention Q/K/V and output, cross-attention query and output, the FFN (cross K/V: once per sentence).
    return [(d, 3 * d), (d, d), (d, d), (d, d), (d, ff), (ff, d), (d, vocab)]


# ---------------------------------------------------------------------------------------------------------
# The candidates: each turns an nn.Linear into a function of x (rows, in).
# ---------------------------------------------------------------------------------------------------------


def per_tensor_int8(model: nn.Module) -> nn.Module:
    """torch.ao's dynamic quantization with per-channel int8 weights: one activation scale per tensor."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(torch\.ao\.quantization|quantize_per_).*deprecated")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantized = copy.deepcopy(model).eval()
        quantize_dynamic(quantized, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    return quantized


def forced(linear: nn.Linear, int_mm: bool) -> Int8Linear:
    """nanomt's Int8Linear of `linear` with one kernel for every call rather than the one it chooses."""
    q = Int8Linear.from_float(linear)
    return Int8Linear(q.weight_int8, q.weight_scale, q.bias, sys.maxsize if int_mm else 0)


class Int8Linear8bit(Int8Linear):
    """Int8Linear with codes in [-127, 127] (right only on CPUs with AVX512-VNNI), kernels chosen alike."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        amax = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)  # (..., 1)
        codes = (x * (127 / amax)).round_().to(torch.int8)  # (..., K)
        scale = self.weight_scale / 127
        if 0 < codes.numel() <= self.int_mm_rows * self.in_features:
            y = torch._int_mm(codes.reshape(-1, self.in_features), self.weight_t) * scale  # (R, N)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            unsigned = codes.view(torch.uint8).bitwise_xor(128)  # code + 128
            args = (self.packed, scale, self.weight_zero, None, 1.0, 0, torch.float32, "none", [], "")
            y = torch.ops.onednn.qlinear_pointwise(unsigned, 1.0, 128, *args)
        y.mul_(amax)
        return y if self.bias is None else y.add_(self.bias)


def with_8bit_codes(model: nn.Module) -> nn.Module:
    """`model` (quantized) with every Int8Linear an Int8Linear8bit of the same weights."""
    for name, m in list(model.named_modules()):
        if isinstance(m, Int8Linear):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, Int8Linear8bit(m.weight_int8, m.weight_scale, m.bias))
    return model


def fbgemm_rows(linear: nn.Linear):
    """Rows divided by their max |x| go through FBGEMM at one fixed 7-bit scale; the max and the bias after."""
    q = Int8Linear.from_float(linear)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*quantize_per_.*deprecated")
        zeros = torch.zeros(q.out_features, dtype=torch.long)
        weight = torch.quantize_per_channel(linear.weight.detach(), q.weight_scale.double(), zeros, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(weight, None)
    op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32

    def run(x):
        amax = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)  # (R, 1)
        return torch.addcmul(q.bias, op(x / amax, 1 / 63, 64, packed), amax)  # codes 1..127: [-1.016, 1]

    return run


def weight_only(linear: nn.Linear):
    """int8 weights (per output channel), float32 activations: torch._weight_int8pack_mm."""
    q = Int8Linear.from_float(linear)
    return lambda x: torch._weight_int8pack_mm(x, q.weight_int8, q.weight_scale) + q.bias


def candidates(linear: nn.Linear) -> dict:
    """Every candidate's function of x for this layer."""
    return {
        "fp32": lambda x: F.linear(x, linear.weight, linear.bias),
        "per_tensor": per_tensor_int8(nn.Sequential(linear)),
        "nanomt": quantize_int8(nn.Sequential(linear)),
        "rows_int_mm": forced(linear, int_mm=True),
        "rows_qlinear": forced(linear, int_mm=False),
        "fbgemm_rows": fbgemm_rows(linear),
        "weight_only": weight_only(linear),
    }


# ---------------------------------------------------------------------------------------------------------
# 1. Kernels.
# ---------------------------------------------------------------------------------------------------------


def quality(fns: dict, linear: nn.Linear, n_in: int) -> dict:
    """Per candidate: relative error against fp32 on 320 rows, and whether row 7 is the same alone."""
    g = torch.Generator().manual_seed(0)
    # Rows of different sizes, as LayerNorm'd and ReLU'd activations are not: each row gets its own range.
    x = torch.randn(320, n_in, generator=g) * torch.rand(320, 1, generator=g).mul(4).exp()
    with torch.inference_mode():
        ref = F.linear(x, linear.weight, linear.bias)
        out = {}
        for name, fn in fns.items():
            y = fn(x)
            out[name] = {
                "rel_error": float((y - ref).norm() / ref.norm()),
                "row_alone_identical": bool(torch.equal(fn(x[7:8])[0], y[7])),
            }
    return out


def bench_shape(n_in: int, n_out: int, reps: int) -> dict:
    """Microseconds a call of every candidate at each row count, and their quality, for one layer shape."""
    torch.manual_seed(0)
    linear = nn.Linear(n_in, n_out).eval()
    fns = candidates(linear)
    result = {"quality": quality(fns, linear, n_in), "us_per_call": {}}
    for rows in ROWS:
        x = torch.randn(rows, n_in)
        calls = max(1, round(MACS_PER_SAMPLE / (rows * n_in * n_out)))

        def timed(fn, x=x, calls=calls):
            def run():
                with torch.inference_mode():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn(x)
                    return (time.perf_counter() - t0) / calls

            return run

        # weight_only runs 10-100x slower than fp32 past a few rows (a first run): timed where it might win.
        timed_fns = {k: f for k, f in fns.items() if k != "weight_only" or rows <= WEIGHT_ONLY_MAX_ROWS}
        timings = round_robin([Contender(name, timed(fn)) for name, fn in timed_fns.items()], 1, reps)
        result["us_per_call"][rows] = {name: round(1e6 * t["median_s"], 2) for name, t in timings.items()}
        print(f"  {n_in}x{n_out} rows {rows}: {result['us_per_call'][rows]}", flush=True)
    return result


def bench_kernels(reps: int) -> dict:
    """Every distinct layer shape of the four models, then each model's decoder step summed up."""
    shapes = sorted({s for d, ff, v, _ in MODELS.values() for s in step_layers(d, ff, v)})
    per_shape = {f"{i}x{o}": bench_shape(i, o, reps) for i, o in shapes}
    steps = {}
    for model, (d, ff, vocab, layers) in MODELS.items():
        shapes = step_layers(d, ff, vocab)
        counts = [layers] * (len(shapes) - 1) + [1]
        steps[model] = {}
        for rows in ROWS:
            total = {
                name: sum(n * per_shape[f"{i}x{o}"]["us_per_call"][rows][name] for n, (i, o) in zip(counts, shapes))
                for name in per_shape[f"{d}x{d}"]["us_per_call"][rows]
                if all(name in per_shape[f"{i}x{o}"]["us_per_call"][rows] for i, o in shapes)
            }
            steps[model][rows] = {
                "us": {k: round(v, 1) for k, v in total.items()},
                "x_fp32": {k: round(total["fp32"] / v, 3) for k, v in total.items()},
                "x_per_tensor": {k: round(total["per_tensor"] / v, 3) for k, v in total.items()},
            }
    return {"per_shape": per_shape, "decoder_step": steps}


# ---------------------------------------------------------------------------------------------------------
# 2. Translation of test2016.
# ---------------------------------------------------------------------------------------------------------


def cli_evaluate(checkpoint: Path, data: Path, int8: bool) -> dict:
    """`nanomt evaluate CHECKPOINT --src test2016.de --ref test2016.en --json` [--int8], in a process of its own."""
    args = ["evaluate", str(checkpoint), "--src", str(data / "test2016.de"), "--ref", str(data / "test2016.en")]
    args += ["--json", *(["--int8"] if int8 else [])]
    done = subprocess.run([sys.executable, "-m", "nanomt.cli", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"nanomt evaluate failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    command = " ".join(["nanomt", *(shown(a) if os.path.isabs(a) else a for a in args)])
    keep = ("bleu", "chrf", "beam_size", "sentences", "seconds", "sentences_per_s", "bleu_signature")
    return {"command": command, **{k: report[k] for k in keep if k in report}}


def engines(checkpoint: Path) -> dict[str, Translator]:
    """float32, `--int8` as it is now, the per-tensor int8 it replaced, and the per-row one with 8-bit codes."""
    model, cfg, tokenizer = load_checkpoint(checkpoint)
    per_tensor, rows_8bit = Translator(model, tokenizer, cfg), Translator(model, tokenizer, cfg)
    per_tensor.model = per_tensor_int8(per_tensor.model)  # the pruned output projection quantized too, as --int8
    rows_8bit.model = with_8bit_codes(quantize_int8(rows_8bit.model))
    return {
        "fp32": Translator(model, tokenizer, cfg),
        "int8_rows": Translator(model, tokenizer, cfg, int8=True),
        "int8_per_tensor": per_tensor,
        "int8_rows_8bit": rows_8bit,
    }


def bench_translate(checkpoint: Path, data: Path, rounds: int, alone: int) -> dict:
    """BLEU, chrF and sentences/s of each engine over test2016 at beam 5, and its lines decoded alone."""
    src, ref = data / "test2016.de", data / "test2016.en"
    result = {"checkpoint": shown(checkpoint), "src": shown(src), "ref": shown(ref), "beam_size": 5}
    result["nanomt_evaluate"] = {"fp32": cli_evaluate(checkpoint, data, False)}
    result["nanomt_evaluate"]["int8"] = cli_evaluate(checkpoint, data, True)
    print(json.dumps(result["nanomt_evaluate"]), flush=True)
    translators = engines(checkpoint)
    reports: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:

        def run(name: str, t: Translator) -> float:
            reports[name] = evaluate(t, src, ref, beam_size=5, save_hyp=Path(tmp) / f"{name}.txt")
            return reports[name]["seconds"]

        contenders = [Contender(name, lambda n=name, t=t: run(n, t)) for name, t in translators.items()]
        timings = round_robin(contenders, 0, rounds)
        outputs = {n: (Path(tmp) / f"{n}.txt").read_text(encoding="utf-8").splitlines() for n in translators}
    lines = src.read_text(encoding="utf-8").splitlines()
    per_engine = {}
    for name, t in translators.items():
        speed = len(lines) / timings[name]["median_s"]
        print(f"{name}: translating the first {alone} lines one at a time", flush=True)
        start = time.perf_counter()
        alone_out = [t.translate([line], beam_size=5)[0] for line in lines[:alone]]
        alone_ms = 1000 * (time.perf_counter() - start) / max(alone, 1)
        per_engine[name] = {
            "bleu": reports[name]["bleu"],
            "chrf": reports[name]["chrf"],
            "sentences_per_s": round(speed, 2),
            "seconds_samples": [round(s, 3) for s in timings[name]["samples_s"]],
            "lines_identical_to_fp32": sum(a == b for a, b in zip(outputs[name], outputs["fp32"])),
            "alone_lines": alone,
            "alone_identical_to_batched": sum(a == b for a, b in zip(alone_out, outputs[name])),
            "alone_ms_per_sentence": round(alone_ms, 1),
        }
    fp32 = per_engine["fp32"]
    for row in per_engine.values():
        row["bleu_minus_fp32"] = round(row["bleu"] - fp32["bleu"], 2)
        row["x_fp32"] = round(row["sentences_per_s"] / fp32["sentences_per_s"], 3)
        row["x_int8_per_tensor"] = round(row["sentences_per_s"] / per_engine["int8_per_tensor"]["sentences_per_s"], 3)
    result["engines"] = per_engine
    result["sentences"] = len(lines)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("kernels", "translate"), default=None)
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--reps", type=int, default=5, help="round-robin rounds a kernel shape (after 1 warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds of test2016 translation")
    p.add_argument("--alone", type=int, default=1000, help="test2016 lines each engine also translates alone")
    p.add_argument("--out", type=Path, default=RESULTS / "int8_rows.json")
    args = p.parse_args()
    torch.set_num_threads(NUM_THREADS)
    if args.only != "kernels" and not (args.checkpoint / "model.safetensors").is_file():
        raise SystemExit(f"{args.checkpoint}: no model.safetensors (give --checkpoint RUN, or --only kernels)")
    result: dict = {"measures": __doc__.split("\n\n")[0], "threads": NUM_THREADS, "rows": list(ROWS)}
    start = time.perf_counter()
    # The 1-minute load average before and after each part: 2 threads on 2 cores, so anything else running shows.
    if args.only != "translate":
        load = os.getloadavg()[0]
        result["kernels"] = bench_kernels(args.reps)
        result["kernels"]["load_average_before_after"] = [load, os.getloadavg()[0]]
    if args.only != "kernels":
        load = os.getloadavg()[0]
        result["translate"] = bench_translate(args.checkpoint, args.data, args.rounds, args.alone)
        result["translate"]["load_average_before_after"] = [load, os.getloadavg()[0]]
    result["wall_s"] = round(time.perf_counter() - start, 1)
    result["machine"] = machine()
    write_results(args.out, result)


if __name__ == "__main__":
    main()
