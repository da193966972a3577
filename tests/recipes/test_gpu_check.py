"""scripts/gpu_check.sh: its every step on a CPU (--smoke) with a summary of real figures; clear errors otherwise."""

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from paths import REPO as ROOT

from nanomt.training.synthetic import write_corpus

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
RESULT_FILES = {
    "cuda_tests.xml",
    "gpu_step.json",
    "multi30k_train.log",
    "multi30k_metrics.jsonl",
    "gpu_decode.json",
    "gpu_check.json",
}


@pytest.fixture(scope="module")
def multi30k_named(tmp_path_factory) -> Path:
    """The toy pair under Multi30k's file names, as the script's --data wants them."""
    corpus = write_corpus(tmp_path_factory.mktemp("toy"), pairs=300, seed=0, valid=20, test=20)
    data = tmp_path_factory.mktemp("multi30k")
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test2016")):
        shutil.copy(corpus[f"{split}.src"], data / f"{name}.de")
        shutil.copy(corpus[f"{split}.tgt"], data / f"{name}.en")
    return data


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_smoke_runs_every_step_on_a_cpu_and_sums_them_up(multi30k_named, tmp_path):
    res = gpu_check("--smoke", str(tmp_path / "results"), "--data", str(multi30k_named))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = tmp_path / "results"
    assert {p.name for p in results.iterdir()} == RESULT_FILES  # a device run brings back at most 8
    summary = json.loads((results / "gpu_check.json").read_text())
    assert summary["failed_steps"] == [] and set(summary["seconds"]) == {
        "cuda_tests",
        "gpu_step",
        "multi30k_train",
        "multi30k_test2016",
        "gpu_decode",
    }
    cases = list(ET.parse(results / "cuda_tests.xml").getroot().iter("testcase"))
    tests = summary["cuda_tests"]
    assert cases and tests["passed"] + len(tests["failed"]) + len(tests["skipped"]) == len(cases)
    if not torch.cuda.is_available():
        assert tests["passed"] == 0 and len(tests["skipped"]) == len(cases)
    rows = [json.loads(line) for line in (results / "multi30k_metrics.jsonl").read_text().splitlines()]
    assert summary["multi30k"]["steps"] == 12 == max(r["step"] for r in rows)
    assert [bleu for _, bleu in summary["multi30k"]["valid_bleu_greedy"]] == [
        r["valid_bleu"] for r in rows if "valid_bleu" in r
    ]
    test2016 = summary["multi30k"]["test2016"]
    assert test2016["beam_size"] == 5 and 0 <= test2016["bleu"] <= 100 and test2016["sentences_per_s"] > 0
    assert summary["gpu_step"]["nanomt"]["target_tokens_per_s"] > 0
    decoding = summary["decoding"]
    assert set(decoding) == {"fp32/greedy", "fp32/beam4"}
    assert all(row["sentences_identical_to_hf"] == "4/4" for row in decoding.values())  # same weights, fp32
    assert not [s for s in strings(summary) if os.path.isabs(s)]
    assert str(tmp_path) not in (results / "multi30k_train.log").read_text()  # the run directory, relative


def strings(obj) -> list[str]:
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return [obj] if isinstance(obj, str) else []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--data"], "--data needs a directory"),
        (["RES", "--data", "nowhere"], "--data nowhere: no train.de"),
        (["RES", "--bogus"], "unknown option --bogus"),
        ([], "usage: scripts/gpu_check.sh RESULTS_DIR"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, words, tmp_path):
    res = gpu_check(*[str(tmp_path / a) if a == "RES" else a for a in args])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and words in res.stderr, res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.slow  # the script run whole
def test_without_a_gpu_it_says_so_and_names_smoke(multi30k_named, tmp_path):
    res = gpu_check(str(tmp_path / "results"), "--data", str(multi30k_named))
    assert res.returncode == 2 and "sees no CUDA GPU" in res.stderr and "--smoke" in res.stderr
    assert not (tmp_path / "results").exists()
