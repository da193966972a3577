"""`nanomt distill`: the teacher's translations (cached, resumable after a kill without translating a line twice,
refused when made otherwise), the student's config and first weights, and a student that is a run like any other."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_nanomt, tiny_config, tree
from paths import REPO

from nanomt.core.checkpoint import WEIGHTS, read_weights
from nanomt.core.config import load_config
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.translate import Translator
from nanomt.training.teacher import translations_path

pytestmark = pytest.mark.usefixtures("one_thread")

STUDENT_BUDGET = ["--set", "train.max_steps=6", "--set", "train.eval_every=6", "--set", "train.save_every=6"]


@pytest.fixture(scope="module")
def teacher(toy_corpus, trained) -> Path:
    """A tiny post-norm teacher, two layers a side (read only)."""
    cfg = tiny_config(toy_corpus, max_steps=40, eval_every=40, save_every=40)
    cfg["model"].update(n_encoder_layers=2, n_decoder_layers=2, norm_first=False)
    return trained(cfg)


@pytest.fixture(scope="module")
def source(toy_corpus, tmp_path_factory) -> Path:
    """300 source sentences of the toy pair's training side."""
    lines = toy_corpus["train.src"].read_text(encoding="utf-8").splitlines()[:300]
    path = tmp_path_factory.mktemp("src") / "mono.src"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def student(teacher, source, tmp_path_factory) -> Path:
    """The fast student of the teacher, distilled on `source` with a few steps of training."""
    run = tmp_path_factory.mktemp("student") / "run"
    args = ["distill", teacher, "--src", source, "--run-dir", run, "--student", "fast", "--buffer-size", "128"]
    run_nanomt(*args, *STUDENT_BUDGET, check=True)
    return run


def test_the_command_line_offers_the_presets_distill_knows():
    from nanomt.cli import build_parser
    from nanomt.training.distill import STUDENTS

    distill = build_parser()._subparsers._group_actions[0].choices["distill"]
    (student,) = [a for a in distill._actions if a.dest == "student"]
    assert tuple(student.choices) == STUDENTS


def test_translations_are_the_teacher_s_with_its_decoding(teacher, source, student):
    """The cached targets are the teacher's translations with its checkpoint's decode section (beam 2 here),
    however the file was cut into chunks."""
    lines = source.read_text(encoding="utf-8").splitlines()
    expected = Translator.from_checkpoint(teacher).translate(lines)
    cached = translations_path(student / "distill", 0, source).read_text(encoding="utf-8").splitlines()
    assert cached == [" ".join(h.split()) for h in expected]


def test_student_is_a_run_with_the_preset_shape_and_the_teacher_s_tokenizer(teacher, source, student):
    cfg = load_config(student / "config.yaml")
    assert (cfg.model.n_encoder_layers, cfg.model.n_decoder_layers, cfg.model.norm_first) == (6, 1, False)
    assert cfg.model.d_model == load_config(teacher / "config.yaml").model.d_model
    assert Tokenizer.load(student / "tokenizer").fingerprint() == Tokenizer.load(teacher / "tokenizer").fingerprint()
    assert cfg.data.train[0].src == str(source)  # the student learns from the source and the teacher's translations
    assert cfg.data.train[0].tgt == str(translations_path(student / "distill", 0, source))
    out = run_nanomt("translate", student, input="ein haus\n", text=True, check=True)
    assert len(out.stdout.splitlines()) == 1


def test_student_starts_from_the_teacher_s_tensors_where_shapes_match(teacher, student):
    """--init teacher (the default): every tensor the teacher has under the same name and shape (embeddings, its
    two encoder layers, the first decoder layer) is the teacher's in the student's first weights; the others are
    new."""
    theirs, init = read_weights(teacher / WEIGHTS), read_weights(student / "distill" / "init" / WEIGHTS)
    shared = [name for name in init if name in theirs and theirs[name].shape == init[name].shape]
    assert any(n.startswith("encoder.1.") for n in shared) and any(n.startswith("decoder.0.") for n in shared)
    for name in shared:
        assert torch.equal(init[name], theirs[name]), name
    assert any(n.startswith("encoder.5.") for n in init) and not any(n.startswith("encoder.5.") for n in theirs)


def test_init_none_starts_from_the_seed_alone(teacher, source, student, tmp_path):
    """--init none: no tensor of the student's first weights is the teacher's (the cached translations reused)."""
    run = tmp_path / "scratch"
    shutil.copytree(student / "distill", run / "distill", ignore=shutil.ignore_patterns("init"))
    out = run_nanomt(
        "distill", teacher, "--src", source, "--run-dir", run, "--init", "none", *STUDENT_BUDGET, text=True
    )
    assert out.returncode == 0, out.stderr
    theirs, init = read_weights(teacher / WEIGHTS), read_weights(run / "distill" / "init" / WEIGHTS)
    shared = [name for name in init if name in theirs and theirs[name].shape == init[name].shape]
    assert shared and not any(torch.equal(init[n], theirs[n]) for n in shared if theirs[n].std() > 0)


def test_a_cache_made_otherwise_is_refused(teacher, source, student, tmp_path):
    """Other decoding settings (beam 1 against the beam 2 of the cache): one line, nothing written."""
    before = {p: p.stat().st_mtime_ns for p in (student / "distill").iterdir()}
    out = run_nanomt("distill", teacher, "--src", source, "--run-dir", student, "--beam", "1", text=True)
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0
    assert "other decoding settings" in out.stderr and "another --run-dir" in out.stderr
    assert {p: p.stat().st_mtime_ns for p in (student / "distill").iterdir()} == before


def test_teachers_that_cannot_share_a_tokenizer_are_refused(toy_corpus, trained, teacher, source, tmp_path):
    """An ensemble of teachers with different vocabularies, and a student config asking for its own vocabulary:
    one line each, before anything is translated."""
    other_cfg = tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10)
    other_cfg["data"]["vocab_size"] = 100
    other = trained(other_cfg)
    run = tmp_path / "student"
    out = run_nanomt("distill", teacher, other, "--src", source, "--run-dir", run, text=True)
    assert out.returncode == 1 and out.stderr.strip().count("\n") == 0
    assert "tokenizer differs" in out.stderr and not run.exists()
    config = tmp_path / "student.yaml"
    config.write_text(yaml.safe_dump({"data": {"vocab_size": 100}, "model": {"d_model": 32}}), encoding="utf-8")
    out = run_nanomt("distill", teacher, "--src", source, "--run-dir", run, "--config", config, text=True)
    assert out.returncode == 1 and out.stderr.strip().count("\n") == 0
    assert "shares its teacher's tokenizer" in out.stderr


def test_what_cannot_make_a_student_is_refused_before_translating(teacher, source, toy_corpus, tmp_path):
    """A --run-dir inside the teacher's run or holding it, a file, a folder holding an averaged model; an empty --src;
    --pairs or --valid files missing or not line-aligned: one line each, naming the problem and the path, before a
    line is translated (which can take hours); nothing is written anywhere."""
    shutil.copytree(teacher, tmp_path / "teacher")
    teacher_copy, step = tmp_path / "teacher", next((tmp_path / "teacher" / "checkpoints").iterdir())
    averaged, empty, a_file = tmp_path / "averaged", tmp_path / "empty.src", tmp_path / "a_file"
    assert run_nanomt("average", step, "--out", averaged).returncode == 0
    empty.write_text("", encoding="utf-8")
    a_file.write_text("not a folder\n", encoding="utf-8")
    student, missing, tgt = tmp_path / "student", tmp_path / "missing.src", toy_corpus["train.tgt"]
    before = tree(tmp_path)
    for teacher_dir, run_dir, flags, problem, named in [
        (teacher_copy, teacher_copy / "checkpoints", [], "is inside the run of teacher", teacher_copy / "checkpoints"),
        (step, teacher_copy, [], "is the run of teacher", teacher_copy),
        (teacher_copy, tmp_path, [], "holds the run of teacher", tmp_path),
        (teacher_copy, a_file, [], "not a directory", a_file),
        (teacher_copy, averaged, [], "not trained there", averaged),
        (teacher_copy, student, ["--src", empty], "the file is empty", empty),
        (teacher_copy, student, ["--pairs", source, tgt], "must be line-aligned", tgt),
        (teacher_copy, student, ["--pairs", missing, tgt], "file not found", missing),
        (teacher_copy, student, ["--valid", missing, tgt], "file not found", missing),
    ]:
        src = [] if "--src" in flags else ["--src", source]
        out = run_nanomt("distill", teacher_dir, *src, "--run-dir", run_dir, *flags, *STUDENT_BUDGET, text=True)
        assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
        assert problem in out.stderr and str(named) in out.stderr, out.stderr
        assert tree(tmp_path) == before, problem


def test_original_pairs_are_mixed_in_with_their_weight(toy_corpus, teacher, source, student, tmp_path):
    """--pairs SRC TGT --pairs-weight W: a corpus of the student's config beside the translations; the translations
    cached in the first run's folder are not made again (a copy of it: nothing translated)."""
    run = tmp_path / "mixed"
    shutil.copytree(student / "distill", run / "distill")
    pairs = ["--pairs", toy_corpus["valid.src"], toy_corpus["valid.tgt"], "--pairs-weight", "0.5"]
    out = run_nanomt("distill", teacher, "--src", source, "--run-dir", run, *pairs, *STUDENT_BUDGET, text=True)
    assert out.returncode == 0, out.stderr
    assert "translating" not in out.stderr
    corpora = load_config(run / "config.yaml").data.train
    assert [(c.src, c.weight) for c in corpora] == [(str(source), 1.0), (str(toy_corpus["valid.src"]), 0.5)]


@pytest.mark.slow
def test_a_killed_distill_resumes_without_translating_a_line_twice(teacher, student, toy_corpus, tmp_path,
                                                                   monkeypatch):  # fmt: skip
    """SIGKILL while the teacher translates (a real process), then distill again: it starts after the last complete
    line, translates each remaining line once, and the file is the one an unkilled distill wrote."""
    lines = toy_corpus["train.src"].read_text(encoding="utf-8").splitlines()[:3000]
    source = tmp_path / "big.src"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tmp_path / "student"
    out = translations_path(run / "distill", 0, source)
    args = ["distill", teacher, "--src", source, "--run-dir", run, "--buffer-size", "100", *STUDENT_BUDGET]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nanomt.cli", *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.is_file() or out.read_bytes().count(b"\n") < 100):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = out.read_bytes().count(b"\n")
    assert 100 <= done < len(lines), "the kill came after the translations were complete"

    translated: list[str] = []
    real = Translator.translate

    def counted(self, sentences, *a, **k):
        if "decoding" in k:  # the teacher's calls (validation during training asks for beam_size=1)
            translated.extend(sentences)
        return real(self, sentences, *a, **k)

    monkeypatch.setattr(Translator, "translate", counted)
    result = run_nanomt(*args, text=True)
    assert result.returncode == 0, result.stderr
    assert translated == lines[done:]  # each remaining source line once, none of the first `done`
    assert f"{done} lines were translated already" in result.stderr
    whole = Translator.from_checkpoint(teacher).translate(lines)
    assert out.read_text(encoding="utf-8").splitlines() == [" ".join(h.split()) for h in whole]
    assert json.loads((run / "distill" / "manifest.json").read_text())["int8"] is False


def test_the_student_is_served_like_any_run(student, toy_corpus):
    """`nanomt serve STUDENT`'s app: /translate gives the student's own translation."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    translator = Translator.from_checkpoint(student)
    sentence = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[0]
    with TestClient(create_app(translator)) as c:
        r = c.post("/translate", json={"text": sentence})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == translator.translate([sentence])
