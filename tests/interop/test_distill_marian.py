"""`nanomt distill` with an imported opus-mt model as the teacher (a small random MarianMTModel built locally, as
opus-mt stands in offline): its SentencePiece pair is the student's tokenizer, its shape the student's but for the
preset's layers, and the student translates, evaluates and exports like any run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_nanomt
from test_finetune_marian import corpus, marian_dir  # noqa: F401 (the module's fixtures, used here by name)

from nanomt.core.checkpoint import WEIGHTS, read_weights
from nanomt.core.config import load_config
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding.translate import Translator
from nanomt.interop import import_marian
from nanomt.training.teacher import translations_path

pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # foreign converters and loaders

BUDGET = ["--set", "train.max_steps=4", "--set", "train.eval_every=4", "--set", "train.save_every=4",
          "--set", "train.max_tokens=400", "--set", "train.calibrate=false"]  # fmt: skip


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory) -> Path:  # noqa: F811
    return import_marian(marian_dir, tmp_path_factory.mktemp("imported") / "opus-mt")


@pytest.mark.parametrize("student", ["fast", "same"])
def test_an_imported_opus_mt_model_teaches_a_student(imported, corpus, student, tmp_path):  # noqa: F811
    source = corpus["train.src"]
    run = tmp_path / "student"
    valid = ["--valid", corpus["valid.src"], corpus["valid.tgt"]]
    out = run_nanomt("distill", imported, "--src", source, "--run-dir", run, "--student", student, *valid, *BUDGET,
                     "--beam", "2", text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = source.read_text(encoding="utf-8").splitlines()
    cached = translations_path(run / "distill", 0, source).read_text(encoding="utf-8").splitlines()
    teacher = Translator.from_checkpoint(imported)
    assert cached == [" ".join(h.split()) for h in teacher.translate(lines, beam_size=2)]

    theirs, ours = load_config(imported / "config.yaml").model, load_config(run / "config.yaml").model
    assert Tokenizer.load(run / "tokenizer").fingerprint() == Tokenizer.load(imported / "tokenizer").fingerprint()
    assert (ours.activation, ours.positional, ours.output_bias, ours.pad_id, ours.bos_id) == (
        theirs.activation, theirs.positional, theirs.output_bias, theirs.pad_id, theirs.bos_id)  # fmt: skip
    layers = (6, 1) if student == "fast" else (theirs.n_encoder_layers, theirs.n_decoder_layers)
    assert (ours.n_encoder_layers, ours.n_decoder_layers) == layers
    if student == "same":  # every tensor starts as the teacher's
        init, weights = read_weights(run / "distill" / "init" / WEIGHTS), read_weights(imported / WEIGHTS)
        assert init.keys() == weights.keys()
        assert all(torch.equal(init[k], weights[k]) for k in init)

    translated = run_nanomt("translate", run, "--input", corpus["test.src"], text=True, check=True)
    assert len(translated.stdout.splitlines()) == len(corpus["test.src"].read_text().splitlines())
    exported = run_nanomt("export", "marian", run, "--out", tmp_path / "hf", text=True)
    assert exported.returncode == 0, exported.stderr
