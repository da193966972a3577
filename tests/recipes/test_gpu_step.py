"""benchmarks/gpu_step.py: its smoke run on a CPU (every contender, tiny shape); its FLOPs formula counts the real
model's matmuls; its lengths are WMT news's, scaled to the mean it says."""

import json
import subprocess
import sys

import numpy as np
import pytest
from paths import REPO as ROOT

from nanomt import ModelConfig, Transformer

sys.path.insert(0, str(ROOT))
gpu_step = pytest.importorskip("benchmarks.gpu_step")


@pytest.mark.slow
def test_smoke_run_on_a_cpu_times_every_contender(tmp_path):
    out = tmp_path / "gpu_step.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu_step", "--device", "cpu", "--smoke", "--batches", "2"]
    res = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["shape"] == gpu_step.SMOKE and report["precision"] == "fp32"
    assert not [s for s in report["skipped"] if "no transformers" not in s], report["skipped"]
    results = report["results"]
    assert all(r["target_tokens_per_s"] > 0 and r["step_ms"] > 0 for r in results.values())
    assert results["nanomt"]["speedup_vs_nanomt"] == 1.0
    contenders = set(results) | {s.split()[0] for s in report["skipped"]}
    assert contenders == set(gpu_step.CONTENDERS) - {"nanomt_fp32"}  # fp32 is the baseline's own precision here
    assert report["flops_per_target_token"] == pytest.approx(
        report["flops_per_step"] / report["target_tokens_per_step"]
    )


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
    src, tgt = np.array([10, 33, 7]), np.array([12, 30, 9])
    d, layers = s["d_model"], s["layers"]
    attention = sum(12 * d * layers * (a * a + b * b + a * b) for a, b in zip(src, tgt, strict=True))
    expected = 6 * (enc * src.sum() + (dec + d * s["vocab"]) * tgt.sum()) + attention
    assert gpu_step.flops_per_step(s, src, tgt) == pytest.approx(expected, rel=1e-12)


def test_lengths_are_wmt_news_scaled_to_the_stated_mean():
    src, tgt = gpu_step.sentence_lengths(gpu_step.BASE)
    assert len(src) == len(tgt) == gpu_step.BASE["sentences"]
    assert tgt.mean() == pytest.approx(gpu_step.BASE["mean_tgt"], rel=0.03)
    assert 0.8 < src.mean() / tgt.mean() < 1.1 and tgt.max() > 3 * tgt.mean()  # a long tail, as real text has
