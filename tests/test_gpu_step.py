"""benchmarks/gpu_step.py: runs on a CPU with a tiny shape; its FLOPs formula counts the real model's matmuls."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanomt import ModelConfig, Transformer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
gpu_step = pytest.importorskip("benchmarks.gpu_step")


@pytest.mark.slow
def test_runs_on_a_cpu_with_a_tiny_shape(tmp_path):
    out = tmp_path / "gpu_step.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_step", "--device", "cpu", "--tiny", "--steps", "2", "--warmup", "1"]
    res = subprocess.run(
        [*cmd, "--rounds", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert report["shape"] == gpu_step.TINY and report["precision"] == "fp32"
    assert report["results"]["nanomt"]["target_tokens_per_s"] > 0
    assert report["flops_per_target_token"] == gpu_step.flops_per_step(gpu_step.TINY) / (4 * 8)
    contenders = set(report["results"]) | {s.split()[0] for s in report["skipped"]}
    assert contenders == {"nanomt", "marian"}


def test_flops_formula_counts_the_base_models_matmul_parameters():
    s = gpu_step.BASE
    cfg = ModelConfig(
        s["vocab"], s["vocab"], d_model=s["d_model"], n_heads=s["n_heads"], n_encoder_layers=s["layers"],
        n_decoder_layers=s["layers"], d_ff=s["d_ff"], share_embeddings=True, tie_output=True,
    )  # fmt: skip
    model = Transformer(cfg)
    matmul = {n: p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n}
    enc = sum(v for n, v in matmul.items() if n.startswith("encoder"))
    dec = sum(v for n, v in matmul.items() if n.startswith("decoder"))
    d, b, src, tgt = s["d_model"], s["batch"], s["src_len"], s["tgt_len"]
    attention = 12 * d * b * s["layers"] * (src**2 + tgt**2 + tgt * src)
    expected = 6 * (enc * b * src + (dec + d * s["vocab"]) * b * tgt) + attention
    assert gpu_step.flops_per_step(s) == expected
