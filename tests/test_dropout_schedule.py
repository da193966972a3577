"""Curriculum dropout: train.dropout_start ramps model.dropout up over the first part of the budget."""

import shutil

import pytest
import torch
from conftest import random_src, tiny_config

from nanomt.checkpoint import WEIGHTS, read_weights, step_dirs
from nanomt.config import ConfigError, ModelConfig, config_from_dict
from nanomt.model import Transformer
from nanomt.plots import read_metrics
from nanomt.train import dropout_at, train


def config(max_minutes=None, **train):
    return config_from_dict(
        {
            "model": {"dropout": 0.3, "src_vocab_size": 50, "tgt_vocab_size": 50},
            "train": {"max_steps": 100, "max_minutes": max_minutes, **train},
        }
    )


def test_dropout_rises_from_the_start_value_to_the_models_over_the_ramp():
    cfg = config(dropout_start=0.1, dropout_ramp=0.5)
    got = [dropout_at(s, cfg) for s in (0, 10, 25, 50, 80, 100)]
    assert got == pytest.approx([0.1, 0.14, 0.2, 0.3, 0.3, 0.3])
    # With max_minutes the clock counts too, whichever has spent more of the budget.
    timed = config(max_minutes=10, dropout_start=0.1, dropout_ramp=0.5)
    assert dropout_at(10, timed, elapsed=150.0) == pytest.approx(0.2)  # a quarter of the time, a tenth of the steps
    assert dropout_at(25, timed, elapsed=30.0) == pytest.approx(0.2)
    assert all(dropout_at(s, config()) == 0.3 for s in (1, 50, 100))  # no dropout_start: constant


def test_set_dropout_sets_the_embedding_and_sublayer_dropout_only():
    kw = dict(d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=64)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(50, 50, dropout=0.5, attention_dropout=0.0, activation_dropout=0.0, **kw))
    src, tgt = random_src([5, 3], vocab=50), random_src([4, 6], seed=1, vocab=50)
    ref = model.eval()(src, tgt)
    model.train()
    assert not torch.allclose(model(src, tgt), ref)  # dropout 0.5 is on
    model.set_dropout(0.0)
    assert torch.equal(model(src, tgt), ref)  # every dropout the model has was the one set
    other = Transformer(ModelConfig(50, 50, dropout=0.3, attention_dropout=0.1, activation_dropout=0.05, **kw))
    other.set_dropout(0.2)
    assert {m.dropout.p for m in (other.src_embed, other.tgt_embed, *other.encoder, *other.decoder)} == {0.2}
    assert {layer.ffn.dropout.p for layer in (*other.encoder, *other.decoder)} == {0.05}
    assert {layer.self_attn.dropout_p for layer in other.encoder} == {0.1}


def test_a_scheduled_run_logs_the_curriculum_and_resumes_exactly(toy_corpus, tmp_path):
    raw = tiny_config(toy_corpus, max_steps=8, log_every=1, save_every=4, keep_last=5, eval_every=1000)
    raw["model"]["dropout"] = 0.3
    raw["train"].update(dropout_start=0.1, dropout_ramp=0.5)
    cfg = config_from_dict(raw)
    whole = train(cfg, tmp_path / "whole")
    rows = [r for r in read_metrics(whole / "metrics.jsonl") if "loss" in r]
    assert [r["dropout"] for r in rows] == pytest.approx([0.15, 0.2, 0.25, 0.3, 0.3, 0.3, 0.3, 0.3])
    # Resumed from its step-4 checkpoint, a copy of the run ends on the same weights: the rate is the step's.
    split = tmp_path / "split"
    shutil.copytree(whole, split)
    shutil.rmtree(dict(step_dirs(split))[8])
    train(cfg, split)
    a, b = (read_weights(dict(step_dirs(r))[8] / WEIGHTS) for r in (whole, split))
    assert all(torch.equal(a[name], b[name]) for name in a)
    constant = train(config_from_dict({**raw, "train": {**raw["train"], "dropout_start": None}}), tmp_path / "c")
    c = read_weights(dict(step_dirs(constant))[8] / WEIGHTS)
    assert any(not torch.equal(a[name], c[name]) for name in a)  # and the schedule changed what was trained


@pytest.mark.parametrize(("key", "value"), [("dropout_start", 1.0), ("dropout_start", -0.1), ("dropout_ramp", 0.0)])
def test_bad_schedule_values_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=key):
        config(**{key: value})
