"""The translate and latency harnesses (benchmarks.speed, benchmarks.latency) on a tiny toy run, end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_config
from paths import REPO

import nanomt.decoding.translate
from benchmarks.harness import differing, same_batches
from benchmarks.speed import BatchSpy, nanomt_plan
from nanomt.core.config import config_from_dict
from nanomt.decoding.translate import Translator
from nanomt.training.train import train

LINES = 16


def toy_run(corpus: dict, out: Path, steps: int) -> Path:
    """A toy run whose decode.max_tokens cuts a few lines into several batches."""
    cfg = tiny_config(corpus, max_steps=steps, save_every=steps, eval_every=steps)
    cfg["decode"]["max_tokens"] = 60
    return train(config_from_dict(cfg), out)


@pytest.fixture(scope="module")
def run_dir(toy_corpus, tmp_path_factory):
    return toy_run(toy_corpus, tmp_path_factory.mktemp("harness") / "run", 60)


@pytest.fixture(scope="module")
def src_file(toy_corpus, tmp_path_factory) -> Path:
    """LINES toy sentences with an empty line among them (not decoded, by either engine)."""
    lines = toy_corpus["test.src"].read_text().splitlines()[: LINES - 1]
    path = tmp_path_factory.mktemp("src") / "src.txt"
    path.write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n")
    return path


def test_the_plan_is_the_batches_nanomt_cuts(run_dir, src_file, monkeypatch):
    monkeypatch.setattr(
        nanomt.decoding.translate, "make_batches", nanomt.decoding.translate.make_batches
    )  # restored afterwards
    translator = Translator.from_checkpoint(run_dir)
    lines = src_file.read_text().splitlines()
    plan, todo = nanomt_plan(translator, lines)
    assert len(plan) > 1 and sorted(i for b in plan for i in b) == [i for i in range(LINES) if i != 5]
    spy = BatchSpy(nanomt.decoding.translate)
    translator.translate(lines, beam_size=2)
    assert spy.take(todo) == plan
    assert spy.take(todo) is None  # nothing since


def test_same_batches_and_differing_lines():
    plan = {"batch_sizes": [3, 2], "matches_plan": True}
    ct2 = {"batch_sizes": [3, 2]}
    assert same_batches({"nanomt": plan, "ct2": ct2}, "plan") is True
    assert same_batches({"nanomt": plan, "ct2": {"batch_sizes": [5]}}, "plan") is False
    assert same_batches({"nanomt": {**plan, "matches_plan": None}, "ct2": ct2}, "plan") is None
    assert same_batches({"nanomt": plan, "ct2": {"batch_sizes": None}}, "budget") is False
    assert differing(["a", "b", "c"], ["a", "x", "y"]) == {"differing_lines": 2, "first_differing_line_numbers": [2, 3]}


def ct2_export(run: Path, out: Path):
    """The run's CTranslate2 export and the harness's module for it (CTranslate2 next to torch: correct, slower)."""
    pytest.importorskip("ctranslate2")
    from benchmarks import ct2_convert
    from nanomt.interop.ct2 import export_ct2

    return ct2_convert, ct2_convert.ct2.Ct2Translator(export_ct2(run, out), intra_threads=1)


def test_ct2_decodes_nanomt_batches_as_each_sentence_alone(run_dir, src_file, tmp_path):
    ct2_convert, t = ct2_export(run_dir, tmp_path / "ct2")
    ids = t.encode(src_file.read_text().splitlines())
    order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
    for beam in (1, 2, 5):
        exact = t.translate_ids(ids, beam_size=beam)  # one call per generation budget
        for size in (3, len(order)):
            batches = [order[k : k + size] for k in range(0, len(order), size)]
            assert ct2_convert.translate_in_batches(t, ids, batches, beam) == exact, (beam, size)


def test_greedy_ignores_the_batch_budget_even_when_sentences_hit_it(toy_corpus, src_file, tmp_path):
    ct2_convert, t = ct2_export(toy_run(toy_corpus, tmp_path / "run", 2), tmp_path / "ct2")
    ids = t.encode(src_file.read_text().splitlines())
    exact = t.translate_ids(ids, beam_size=1)
    assert any(len(x) == t.max_len(len(s)) for x, s in zip(exact, ids) if s)  # an untrained model runs to its budget
    order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
    assert ct2_convert.translate_in_batches(t, ids, [order], 1) == exact


def harness(module: str, *args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.mark.slow
def test_translate_harness_gives_both_engines_the_same_batches(run_dir, src_file, tmp_path):
    pytest.importorskip("ctranslate2")
    args = ["--only", "translate", "--translate-checkpoint", run_dir, "--src", src_file, "--lines", LINES]
    res = harness("speed", *args, "--reps", 1, "--warmup", 0, "--threads", 1, "--out", tmp_path / "speed")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "speed.json").read_text())
    assert (tmp_path / "speed.md").read_text().startswith("Machine:")
    rows, comparison, h = report["translate"]["rows"], report["translate"]["comparison"], report["translate"]["harness"]
    names = {f"{impl}_translate_{p}/beam5" for impl in ("nanomt", "ct2") for p in ("fp32", "int8")}
    assert set(rows) == names
    for row in rows.values():
        assert len(row["samples_s"]) == 1 and row["n_sentences"] == LINES and row["sentences_per_s"] > 0
        assert row["batch_sizes"] == rows["nanomt_translate_fp32/beam5"]["batch_sizes"]
        assert sum(row["batch_sizes"]) == LINES - 1 and row["calls"] == len(row["batch_sizes"]) > 1
    assert comparison["same_batches"] is True and h["batching"] == "plan" and h["parent_imported_torch"] is False
    assert comparison["beam5"]["fp32_nanomt_vs_ct2"]["differing_lines"] == 0
    assert set(comparison["beam5"]) >= {"int8_nanomt_vs_ct2", "nanomt_int8_vs_fp32", "ct2_int8_vs_fp32"}
    assert comparison["ct2_lines_changed_by_batch_budget"] == {f"ct2_translate_{p}/beam5": 0 for p in ("fp32", "int8")}
    assert h["threads"] == {"nanomt": 1, "ct2": 1} and h["plan_batches"] == len(
        rows["ct2_translate_fp32/beam5"]["batch_sizes"]
    )
    assert report["machine"]["versions"]["ctranslate2"] and len(report["machine"]["git_commit"]) == 40
    assert "x_ct2" in rows["nanomt_translate_int8/beam5"] and "x_fp32" in rows["ct2_translate_int8/beam5"]


@pytest.mark.slow
def test_latency_harness_times_one_sentence_a_request(run_dir, src_file, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "latency.json"
    res = harness("latency", "--checkpoint", run_dir, "--src", src_file, "--requests", 4, "--rounds", 2,
                  "--warmup", 1, "--threads", 1, "--out", out)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    engines = ["nanomt_fp32", "nanomt_int8", "ct2_fp32", "ct2_int8"]
    if report["serve"].startswith("measured"):
        engines += ["serve_fp32", "serve_int8"]
    assert list(report["rows"]) == engines
    for name, row in report["rows"].items():
        assert row["requests"] == 4 and len(row["samples_ms"]) == 4 and len(row["round_p50_ms"]) == 2
        assert row["min_ms"] <= row["p50_ms"] <= row["p95_ms"] <= row["max_ms"]
        assert ("p50_x_ct2" in row) == (not name.startswith("ct2"))
    assert report["differing_lines"]["fp32_nanomt_vs_ct2"]["differing_lines"] == 0
    if "fp32_serve_vs_nanomt" in report["differing_lines"]:
        assert report["differing_lines"]["fp32_serve_vs_nanomt"]["differing_lines"] == 0
    assert report["beam"] == 5 and len(report["machine"]["git_commit"]) == 40


@pytest.mark.slow
def test_the_whole_process_harness_times_both_engines_and_bounds_the_ratio(run_dir, src_file, tmp_path):
    """benchmarks.translate_ct2: nanomt translate and the plain CTranslate2 script as whole processes, one round."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "process.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.translate_ct2", str(run_dir), "--src", str(src_file), "--beam", "2",
         "--reps", "1", "--warmup", "0", "--out", str(out)],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert set(report["whole_s"]) == {"nanomt_fp32", "ct2_fp32", "nanomt_int8", "ct2_int8"}
    assert set(report["one_line_s"]) == {*report["whole_s"], "import_torch"}
    assert report["differing_lines"]["fp32_nanomt_vs_ct2"] == 0  # the same translations in float32
    for kind in ("fp32", "int8"):
        b = report["bound"][kind]
        assert b["nanomt_decoding_s"] == pytest.approx(
            report["whole_s"][f"nanomt_{kind}"] - report["one_line_s"][f"nanomt_{kind}"], abs=1e-3
        )
    assert not any(str(REPO) in json.dumps(v) for v in (report["run"], report["src"]))
