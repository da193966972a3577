"""Greedy search against an uncached reference that re-runs the whole prefix every step, on a tiny random
Transformer."""

from __future__ import annotations

import math

import pytest
import search_models
import torch
from conftest import decoding, tokens
from search_models import BOS, EOS, LENGTHS, PAD, make_src

from nanomt.core.model import Transformer
from nanomt.decoding.greedy import greedy

model = search_models.model  # the tiny random Transformer, a fixture of this module too

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_greedy(model: Transformer, src: torch.Tensor, max_len: int, min_len: int = 0) -> list[int]:
    """Greedy decoding of one (1, S) sentence without a cache: re-run the full prefix every step."""
    prefix = [BOS]
    for step in range(max_len):
        with torch.no_grad():
            logits = model(src, torch.tensor([prefix]))[0, -1]  # (V,)
        logits[[PAD, BOS]] = -math.inf
        if step < min_len:
            logits[EOS] = -math.inf
        token = int(logits.argmax())
        if token == EOS:
            break
        prefix.append(token)
    return prefix[1:]


def test_fixture_gives_varied_outputs(model):
    out = tokens(greedy(model, make_src(LENGTHS), decoding(12)))
    assert len({tuple(o) for o in out}) >= 5
    assert any(len(o) < 12 for o in out) and any(len(o) == 12 for o in out)


@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_matches_uncached_reference(model, min_len):
    src = make_src(LENGTHS)
    out = tokens(greedy(model, src, decoding(12, min_len=min_len)))
    for i, n in enumerate(LENGTHS):
        assert out[i] == reference_greedy(model, src[i : i + 1, : n + 1], 12, min_len)
