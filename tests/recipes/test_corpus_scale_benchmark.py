"""benchmarks/corpus_scale.py end to end at a tiny size: every stage of every variant measured, the report's
figures in place, no path of this machine in it."""

import json
import subprocess
import sys

import pytest
from paths import REPO as ROOT


@pytest.mark.slow
def test_benchmark_runs_end_to_end_at_a_tiny_size(tmp_path):
    out = tmp_path / "corpus_scale.json"
    cmd = [sys.executable, "-m", "benchmarks.corpus_scale", "--pairs", "2000", "--source", "toy", "--vocab", "120"]
    cmd += ["--steps", "2", "--seconds", "0.1", "--workdir", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pairs"] == 2000 and result["machine"]["cores"] and result["machine"]["ram_gib"] > 0
    assert result["machine"]["git_commit"]
    assert result["shared"]["binarize"]["pairs_kept"] == 2000 and result["shared"]["binarize"]["pairs_per_s"] > 0
    assert result["shared"]["tokenizer"]["tokenizer_sentences"] == 2_000_000
    for stage in ("tokenizer", "binarize", "cached"):
        assert result["shared"][stage]["wall_s"] > 0 and result["shared"][stage]["peak_rss_mib"] > 0
    assert set(result["variants"]) == {"plain", "bpe_dropout", "bidirectional"}
    for name, variant in result["variants"].items():
        stages = variant["stages"]
        assert set(stages) == {"epoch", "loader", "train", "restart"}, name
        for figures in stages.values():
            assert figures["wall_s"] > 0 and figures["peak_rss_mib"] > 0 and figures["rss_mib"] > 0
        assert stages["epoch"]["epoch0_batches"] > 0 and stages["loader"]["batches_per_s"] > 0
        assert variant["peak_rss_gib_end_to_end"] > 0
    assert result["variants"]["bidirectional"]["stages"]["epoch"]["epoch0_pairs"] == 4000
    assert set(result["targets_met"]) >= {"binarize_pairs_per_s", "plain_peak_rss", "plain_restart"}
    assert isinstance(result["bounds"], list)
    text = out.read_text()
    assert '"/' not in text and " /" not in text  # no absolute paths of this machine
