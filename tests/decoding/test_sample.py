"""Sampling: one seed one output, greedy's output where the settings leave one choice, valid draws at extreme
settings, the global RNG left alone, and the distribution drawn from a table under top-k, top-p and temperature."""

from __future__ import annotations

from collections import Counter

import pytest
import search_models
import torch
from conftest import KEPT, TIED_VOCAB, decoding, random_src, tied_pair, tokens
from search_models import BOS, EOS, LENGTHS, PAD, A, B, TableModel, V, make_src, table_src

from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample
from nanomt.decoding.steps import Targets

model = search_models.model  # the tiny random Transformer, a fixture of this module too

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sampling_deterministic_for_a_seed_and_varies_across_seeds(model):
    src = make_src(LENGTHS)
    assert tokens(sample(model, src, decoding(10, temperature=2.0, seed=7))) == tokens(
        sample(model, src, decoding(10, temperature=2.0, seed=7))
    )
    outputs = {str(tokens(sample(model, src, decoding(10, temperature=2.0, seed=s)))) for s in range(4)}
    assert len(outputs) == 4


@pytest.mark.parametrize(
    "kwargs", [{"top_k": 1}, {"top_k": 1, "temperature": 5.0}, {"temperature": 1e-4}, {"top_p": 1e-6}]
)
def test_sampling_degenerates_to_greedy(model, kwargs):
    src = make_src(LENGTHS)
    assert tokens(sample(model, src, decoding(12, seed=3, **kwargs))) == tokens(greedy(model, src, decoding(12)))


def test_sampling_leaves_global_rng_alone(model):
    src = make_src(LENGTHS)
    state = torch.get_rng_state()
    tokens(sample(model, src, decoding(10, seed=1)))
    tokens(sample(model, src, decoding(10, seed=None)))
    assert torch.equal(torch.get_rng_state(), state)


# Settings too small or too large for float32: top_p 1e-300 once compared as 0 and dropped every token, a temperature
# of 1e-300 divided by 0, one of 1e300 made the -inf of masked ids nan; multinomial raised on the nan.
VANISHING = [{"top_p": 1e-300}, {"top_p": 5e-324}, {"temperature": 1e-30}, {"temperature": 1e-300},
             {"temperature": 1e-300, "top_k": 1}, {"temperature": 1e-30, "top_p": 5e-324}]  # fmt: skip


EXTREME = [{"temperature": 1e3}, {"temperature": 1e300}, {"temperature": 1e3, "top_k": 1}, {"top_k": 1}]


@pytest.mark.parametrize("restricted", [False, True], ids=["random", "restricted"])
def test_sampling_at_extreme_settings_is_valid_and_at_vanishing_ones_greedy(model, restricted):
    """Any valid Sampling draws: allowed ids only, and greedy's tokens where the temperature or top_p vanishes, also
    where many ids are -inf (a restricted output, no_repeat_ngram_size 1) or all are (an unscored forced prefix)."""
    if restricted:
        m, _ = tied_pair()
        m.set_output_vocab(KEPT)
        src, allowed = random_src(LENGTHS, seed=3, vocab=TIED_VOCAB), set(KEPT.tolist()) - {EOS}
    else:
        m, src, allowed = model, make_src(LENGTHS), set(range(V)) - {PAD, BOS, EOS}
    for rules in ({}, {"no_repeat_ngram_size": 1}):
        expected = tokens(greedy(m, src, decoding(12, **rules)))
        for kwargs in VANISHING:
            assert tokens(sample(m, src, decoding(12, seed=3, **rules, **kwargs))) == expected, kwargs
        for kwargs in EXTREME:
            out = tokens(sample(m, src, decoding(12, seed=3, **rules, **kwargs)))
            assert all(set(o) <= allowed and len(o) <= 12 for o in out), kwargs
    if restricted:  # id 5 is not kept: the forced step's row is all -inf, and softmax over it was nan
        unscored = Targets(prefixes=[[5]] + [[]] * (len(LENGTHS) - 1))
        expected = tokens(greedy(m, src, decoding(12), unscored))
        for kwargs in VANISHING:
            assert tokens(sample(m, src, decoding(12, seed=3, **kwargs), unscored)) == expected, kwargs
        drawn = tokens(sample(m, src, decoding(12, seed=3), unscored))  # temperature 1: the forced step is greedy's
        assert drawn[0][0] == expected[0][0]


SAMPLE_DEFAULT = {EOS: 0.2, A: 0.5, B: 0.3}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {EOS: 0.2, A: 0.5, B: 0.3}),
        ({"top_k": 2}, {A: 0.625, B: 0.375}),
        ({"top_p": 0.6}, {A: 0.625, B: 0.375}),  # A alone has 0.5 < 0.6, so B stays
        ({"top_p": 0.5}, {A: 1.0}),
        ({"temperature": 0.5}, {EOS: 0.04 / 0.38, A: 0.25 / 0.38, B: 0.09 / 0.38}),
    ],
)
def test_sampling_distribution(kwargs, expected):
    n = 4000
    stub = TableModel({}, default=SAMPLE_DEFAULT)
    out = tokens(sample(stub, table_src([1] * n), decoding(1, seed=0, **kwargs)))
    counts = Counter(o[0] if o else EOS for o in out)
    assert set(counts) == set(expected)
    for token, p in expected.items():
        assert counts[token] / n == pytest.approx(p, abs=0.03)
