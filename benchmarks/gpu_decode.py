"""Decoding speed on a GPU: nanomt's greedy and beam search beside Hugging Face `generate`, with the same weights.

One command on a GPU machine, from the repository root (scripts/gpu_check.sh runs it):

    python -m benchmarks.gpu_decode --device cuda --out benchmarks/results/gpu_check/gpu_decode.json

The model: a random MarianMTModel of opus-mt's shape (d_model 512, 6+6 post-norm layers, 8 heads, d_ff 2048,
swish, shared embeddings tied to the output, sinusoidal positions; 32,000 ids here), saved with
`save_pretrained` and read into nanomt by `nanomt.interop.marian`, the code `nanomt import marian` runs: the same
weights in both. EOS's logit bias is -1e4, so no sentence ends early: every engine generates exactly --new-tokens
tokens a sentence, the same work. The sources are --batch random id sequences of 8 to 32 tokens (padded: the
masks are exercised), decoded as one batch, greedy and beam 4.

Precisions: fp32 with TF32 off (the tokens must then equal transformers', counted per sentence) and bf16 under
`torch.autocast` for both engines (counted, not required: bf16 rounding changes near ties). Each contender is timed
round-robin after --warmup untimed rounds, with a device synchronize around each call; the median of --reps is
reported, in new target tokens/s. --tiny runs the same code on a small shape, for a test on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.harness import OPUS_MT, generate_exactly, marian_config, sync
from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.interop.marian import load_marian_weights, model_config, read_marian_weights
from scripts.common import git

BASE = dict(d_model=512, n_heads=8, layers=6, d_ff=2048, vocab=32000, batch=64, new_tokens=32)
TINY = dict(d_model=32, n_heads=2, layers=1, d_ff=64, vocab=200, batch=4, new_tokens=6)
SRC_LENS = (8, 32)  # shortest and longest source, EOS included
EOS_BIAS = -1e4
BEAM = 4
MODES = {"greedy": 1, f"beam{BEAM}": BEAM}


def marian(s: dict, out: Path):
    """A random MarianMTModel of shape `s`, saved to `out` and returned (EOS 0, PAD last, start token PAD)."""
    from transformers import MarianMTModel

    pad = s["vocab"] - 1
    shape = dict(vocab=s["vocab"], d_model=s["d_model"], layers=s["layers"], heads=s["n_heads"], d_ff=s["d_ff"])
    cfg = marian_config(**shape, **OPUS_MT, max_position_embeddings=256, pad_token_id=pad, decoder_start_token_id=pad)
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias[0, 0] = EOS_BIAS
    model.save_pretrained(out)
    return model


def nanomt_of(hf_dir: Path) -> Transformer:
    """nanomt's model of a saved Marian directory, as `nanomt import marian` builds it."""
    hf = json.loads((hf_dir / "config.json").read_text())
    model = Transformer(model_config(hf)).eval()
    load_marian_weights(model, read_marian_weights(hf_dir))
    return model


def sources(s: dict, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) random ids ending in EOS (0), right-padded with `pad`, and the attention mask (True = a token)."""
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(SRC_LENS[0], SRC_LENS[1] + 1, (s["batch"],), generator=g)
    src = torch.full((s["batch"], int(lens.max())), pad)
    for row, n in enumerate(lens.tolist()):
        src[row, : n - 1] = torch.randint(2, pad, (n - 1,), generator=g)
        src[row, n - 1] = 0
    return src, src != pad


def nanomt_decoder(model: Transformer, src: torch.Tensor, n: int, beams: int) -> Callable[[], list[list[int]]]:
    def run() -> list[list[int]]:
        exactly = Decoding(beam_size=beams, max_len_a=0, max_len_b=n, min_len=n)  # n tokens each
        return [hyps[0].tokens for hyps in (greedy if beams == 1 else beam_search)(model, src, exactly)]

    return run


def hf_decoder(model, src: torch.Tensor, mask: torch.Tensor, n: int, beams: int) -> Callable[[], list[list[int]]]:
    def run() -> list[list[int]]:
        return generate_exactly(model, src, mask, n, beams)[:, 1:].tolist()  # without the decoder start column

    return run


def timed(run: Callable[[], object], device: torch.device, dtype: torch.dtype | None) -> Callable[[], float]:
    def once() -> float:
        ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        sync(device)
        t0 = time.perf_counter()
        with ctx:
            run()
        sync(device)
        return time.perf_counter() - t0

    return once


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None, help="JSON results file (default: print only)")
    p.add_argument("--tiny", action="store_true", help="a tiny shape (a CPU smoke test)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    s = dict(TINY if args.tiny else BASE)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: the tokens are compared
    torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        hf = marian(s, Path(tmp)).to(device)
        ours = nanomt_of(Path(tmp)).to(device)
    src, mask = (t.to(device) for t in sources(s, s["vocab"] - 1))
    n = s["new_tokens"]
    precisions = {"fp32": None, "bf16": torch.bfloat16}
    if device.type == "cpu":
        precisions.pop("bf16")  # a CPU without bf16 kernels runs them ~60x slower; the test needs fp32 alone
    rows, contenders = {}, {}
    for precision, dtype in precisions.items():
        for mode, beams in MODES.items():
            runs = {"nanomt": nanomt_decoder(ours, src, n, beams), "hf": hf_decoder(hf, src, mask, n, beams)}
            ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
            with ctx:
                tokens = {name: run() for name, run in runs.items()}
            assert {len(t) for t in tokens["nanomt"] + tokens["hf"]} == {n}, "a sentence ended early"
            same = sum(a == b for a, b in zip(tokens["nanomt"], tokens["hf"]))
            rows[f"{precision}/{mode}"] = {"sentences_identical_to_hf": f"{same}/{len(src)}"}
            for name, run in runs.items():
                contenders[f"{name}_{precision}/{mode}"] = timed(run, device, dtype)
    samples = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.warmup + args.reps):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            dt = contenders[name]()
            if r >= args.warmup:
                samples[name].append(dt)
    new_tokens = len(src) * n
    for key, row in rows.items():
        precision, mode = key.split("/")
        for engine in ("nanomt", "hf"):
            median = statistics.median(samples[f"{engine}_{precision}/{mode}"])
            row[engine] = {"median_s": round(median, 5), "tokens_per_s": round(new_tokens / median, 1)}
        row["nanomt_x_hf"] = round(row["hf"]["median_s"] / row["nanomt"]["median_s"], 3)
    import transformers

    results = {
        "what": "decoding one padded batch of random sources, exactly new_tokens new tokens a sentence, nanomt "
        "greedy/beam_search beside transformers' generate with the same Marian weights; new target tokens/s, "
        f"median of {args.reps} round-robin reps",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": s,
        "src_lens": list(SRC_LENS),
        "rows": rows,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "commit": git("rev-parse", "HEAD") or None,
    }
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
