"""Ensemble decoding against references: the members' averaged probabilities, uncached, and a single model."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import decoding, random_src, random_transformer, tokens

from nanomt.core.checkpoint import CheckpointError
from nanomt.core.config import ModelConfig
from nanomt.core.model import Transformer
from nanomt.decoding.beam import beam_search
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.greedy import greedy
from nanomt.decoding.translate import Translator

PAD, UNK, BOS, EOS = range(4)
V = 20


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def members() -> list[Transformer]:
    # Different widths and depths: the ensemble must keep each member's memory and cache apart.
    return [random_transformer(1, V), random_transformer(2, V, d_model=48, layers=1), random_transformer(3, V)]


make_src = functools.partial(random_src, vocab=V)


def mean_log_probs(models: list[Transformer], src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The reference: log of the average of each model's softmax, each model run on the full prefix."""
    with torch.no_grad():
        probs = [m(src, tgt).softmax(dim=-1) for m in models]  # per model (B, T, V)
    return torch.stack(probs).mean(dim=0).log()


def reference_greedy(models: list[Transformer], src: torch.Tensor, max_len: int) -> list[int]:
    """Greedy decoding of one (1, S) sentence by the averaged probabilities, without a cache."""
    prefix = [BOS]
    for _ in range(max_len):
        log_probs = mean_log_probs(models, src, torch.tensor([prefix]))[0, -1]  # (V,)
        log_probs[[PAD, BOS]] = -math.inf
        token = int(log_probs.argmax())
        if token == EOS:
            break
        prefix.append(token)
    return prefix[1:]


def test_teacher_forced_output_is_the_mean_of_probabilities(members):
    src, tgt = make_src([5, 3, 7]), torch.randint(4, V, (3, 6))
    with torch.no_grad():
        out = Ensemble(members)(src, tgt)
    torch.testing.assert_close(out, mean_log_probs(members, src, tgt), atol=1e-5, rtol=1e-5)
    assert torch.allclose(out.exp().sum(-1), torch.ones(3, 6), atol=1e-5)  # a distribution, not raw scores


def test_cached_greedy_matches_uncached_reference(members):
    lengths = [6, 2, 4, 1, 7]
    src = make_src(lengths, seed=1)
    out = tokens(greedy(Ensemble(members), src, decoding(10)))
    expected = [reference_greedy(members, src[i : i + 1, : n + 1], 10) for i, n in enumerate(lengths)]
    assert out == expected
    assert len({len(o) for o in out}) > 1  # sentences of different lengths: finished rows were dropped


def test_ensemble_of_copies_decodes_as_the_model(members):
    model, src = members[0], make_src([6, 3, 5, 2], seed=2)
    single = beam_search(model, src, decoding(10, 3, length_penalty=1.0, n_best=2))
    for ensemble in (Ensemble([model]), Ensemble([model, model])):
        hyps = beam_search(ensemble, src, decoding(10, 3, length_penalty=1.0, n_best=2))
        assert [[h.tokens for h in hs] for hs in hyps] == [[h.tokens for h in hs] for hs in single]
        for hs, ref in zip(hyps, single):
            for h, r in zip(hs, ref):
                assert h.log_prob == pytest.approx(r.log_prob, abs=1e-4)


def test_beam_scores_are_the_ensembles_log_probabilities(members):
    ensemble, src = Ensemble(members), make_src([4, 6], seed=3)
    for i, hyps in enumerate(beam_search(ensemble, src, decoding(10, 4, n_best=3))):
        for h in hyps:
            targets = torch.tensor([*h.tokens, EOS])
            tgt_in = torch.tensor([[BOS, *h.tokens]])
            log_probs = mean_log_probs(members, src[i : i + 1], tgt_in)[0]  # (T, V)
            assert h.log_prob == pytest.approx(float(log_probs.gather(1, targets[:, None]).sum()), abs=1e-4)


def test_positions_are_the_shortest_members():
    ensemble = Ensemble([random_transformer(1, V), random_transformer(2, V, max_positions=16)])
    assert ensemble.cfg.max_positions == 16
    out = tokens(greedy(ensemble, make_src([3]), decoding(100)))
    assert len(out[0]) <= 16


def test_bad_ensembles_raise(members):
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])
    with pytest.raises(CheckpointError, match="no checkpoint given"):
        Translator.from_checkpoints([])
    other = Transformer(ModelConfig(src_vocab_size=V, tgt_vocab_size=V + 1, d_model=32, n_heads=2))
    with pytest.raises(ValueError, match="share one vocabulary"):
        Ensemble([members[0], other])
    with pytest.raises(ValueError, match="one model"):
        Ensemble(members)(make_src([3]), torch.tensor([[BOS]]), need_weights=True)
