"""A one-layer decoder that collapses writes one sentence for every source: its output stops depending on the encoder.
Caught early on a small model (different sources get different translations, and its cross-attention looks at some
source words more than others), and warned of while training (validation outputs that hardly differ)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from conftest import tiny_config

from nanomt.decoding.translate import Translator
from nanomt.training import train as train_module
from nanomt.training.metrics import COLLAPSED_BELOW, source_dependence

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 400  # where a healthy two-layer-encoder, one-layer-decoder model of tiny_config reads its source


def cross_entropy_ratio(translator: Translator, sentences: list[str]) -> float:
    """The last layer's cross-attention entropy (heads averaged), over that of a uniform look at the source: 1.0
    when each target token attends to every source token alike, as a decoder that ignores its source may."""
    ratios = []
    for sentence in sentences:
        weights = translator.attention(sentence).cross[-1].mean(0)  # (T, S): heads averaged
        if weights.shape[1] > 1:
            entropy = -(weights * np.log(weights + 1e-12)).sum(-1).mean()
            ratios.append(entropy / math.log(weights.shape[1]))
    return float(np.mean(ratios))


@pytest.fixture(scope="module")
def shallow(toy_corpus, trained):
    """A two-layer encoder and a one-layer post-norm decoder (the fast student's proportions), trained STEPS."""
    cfg = tiny_config(toy_corpus, max_steps=STEPS, eval_every=STEPS // 2, save_every=STEPS)
    cfg["model"].update(n_encoder_layers=2, n_decoder_layers=1, norm_first=False)
    return trained(cfg)


@pytest.mark.slow  # a training
def test_a_one_layer_decoder_s_translations_depend_on_the_source(shallow, toy_corpus):
    sources = toy_corpus["valid.src"].read_text(encoding="utf-8").splitlines()
    translator = Translator.from_checkpoint(shallow)
    hyps = translator.translate(sources, beam_size=1)
    assert source_dependence(sources, hyps) >= 0.9  # collapsed: one or a few sentences for all 100
    assert cross_entropy_ratio(translator, sources[:20]) < 0.9
    rows = [json.loads(line) for line in (shallow / "metrics.jsonl").read_text().splitlines()]
    assert [r["valid_distinct"] for r in rows if "valid_distinct" in r][-1] >= 0.9


def test_source_dependence_counts_distinct_translations_of_distinct_sources():
    assert source_dependence(["a", "b", "c", "c"], ["x", "y", "z", "z"]) == 1.0
    assert source_dependence(["a", "b", "c", "d"], ["x", "x", "x", "x"]) == 0.25
    with pytest.raises(ValueError, match="differ in length"):
        source_dependence(["a"], [])


def test_training_warns_when_validation_translations_stop_depending_on_the_source(toy_corpus, tmp_path, caplog,
                                                                                  monkeypatch):  # fmt: skip
    """A decoder that writes one sentence whatever its source (the Translator the evaluation builds, made so): each
    evaluation logs a warning naming the share, and metrics.jsonl records it."""
    from nanomt.core.config import config_from_dict

    monkeypatch.setattr(Translator, "translate", lambda self, sentences, **kw: ["a man is standing ."] * len(sentences))
    cfg = tiny_config(toy_corpus, max_steps=10, eval_every=5, save_every=10)
    with caplog.at_level(logging.WARNING, logger="nanomt"):
        run = train_module.train(config_from_dict(cfg), tmp_path / "run")
    warnings = [r.getMessage() for r in caplog.records if "hardly depend on the source" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0].startswith("step 5:")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    shares = [r["valid_distinct"] for r in rows if "valid_distinct" in r]
    assert shares == [0.05, 0.05] and shares[0] < COLLAPSED_BELOW  # 1 translation for 20 distinct sources
