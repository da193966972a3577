"""Beam search's shared per-sentence state: the beams' queries on one sentence's cross-attention keys/values, the
first step on one beam, a partly filled cache reordered with a duplicated parent, and a beam wider than a pruned
model's kept ids, each against the plain path."""

import pytest
import torch
from conftest import KEPT, TIED_VOCAB, decoding, random_src, random_transformer, tied_pair

from nanomt.core.model import Encoded, prune_output
from nanomt.decoding.beam import beam_search
from nanomt.decoding.ensemble import Ensemble

pytestmark = pytest.mark.usefixtures("one_thread")


class RowPerBeam:
    """The same model with a cache beam search cannot share: every beam gets its own rows (the plain path)."""

    def __init__(self, model):
        self.model, self.cfg = model, model.cfg
        self.pruned = getattr(model, "pruned", False)
        self.output_ids = getattr(model, "output_ids", None)
        self.rows_per_step = []

    def encode(self, src):
        return self.model.encode(src)

    def init_cache(self, enc, capacity=0):
        return Opaque(self.model.init_cache(enc, capacity))

    def decode(self, tokens, enc, cache, restricted=False):
        self.rows_per_step.append(tokens.size(0))
        kwargs = {"restricted": restricted} if restricted else {}
        out = self.model.decode(tokens, enc, cache.inner, **kwargs)
        return out._replace(cache=Opaque(out.cache))


class Opaque:
    def __init__(self, inner):
        self.inner = inner

    def index_select(self, index, cross=True):
        return Opaque(self.inner.index_select(index, cross))


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("ensemble", [False, True])
def test_shared_beams_decode_as_a_row_per_beam(k, ensemble):
    model = random_transformer(seed=4, vocab=40, layers=2)
    if ensemble:
        model = Ensemble([model, random_transformer(seed=5, vocab=40, d_model=16, layers=1)])
    src = random_src([3, 9, 1, 6, 12], seed=2, vocab=40)
    shared = beam_search(model, src, decoding(14, k, n_best=k, length_penalty=0.8))
    plain_model = RowPerBeam(model)
    plain = beam_search(plain_model, src, decoding(14, k, n_best=k, length_penalty=0.8))
    assert [[h.tokens for h in s] for s in shared] == [[h.tokens for h in s] for s in plain]
    for a, b in zip(shared, plain):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    assert plain_model.rows_per_step[0] == 5 * k  # the plain path runs its first step on k copies of BOS


def test_the_first_step_runs_one_row_a_sentence():
    model = random_transformer(seed=4, vocab=40, layers=2)
    rows = []
    decode = model.decode
    model.decode = lambda tokens, *a, **kw: rows.append(tokens.size(0)) or decode(tokens, *a, **kw)
    beam_search(model, random_src([3, 9, 1], seed=2, vocab=40), decoding(10, 4))
    assert rows[0] == 3 and rows[1] == 12


@pytest.mark.parametrize("capacity", [0, 10])
def test_a_partly_filled_cache_reordered_with_a_duplicate_continues_as_the_full_forward(capacity):
    model = random_transformer(seed=6, vocab=30, layers=2)
    src = random_src([4, 7, 2], seed=3, vocab=30)
    tgt = random_src([5, 5, 5], seed=4, vocab=30)[:, :5]  # (3, 5)
    enc = model.encode(src)
    cache = model.decode(tgt[:, :3], enc, model.init_cache(enc, capacity)).cache  # 3 of `capacity` filled
    index = torch.tensor([2, 0, 0, 1])  # a permutation with a duplicated parent
    cache = cache.index_select(index)
    enc_rows = Encoded(enc.memory[index], enc.src_mask[index])
    for t in (3, 4):
        out = model.decode(tgt[index, t : t + 1], enc_rows, cache)
        cache = out.cache
        full = model(src[index], tgt[index, : t + 1])[:, -1]
        torch.testing.assert_close(out.logits[:, 0], full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", [7, 12])
def test_a_beam_wider_than_a_pruned_model_s_kept_ids_decodes_as_the_full_model(k):
    """2k candidates from fewer than 2k kept ids (k of them at the first step): the restricted model's hypotheses."""
    restricted, _ = tied_pair(seed=3)
    restricted.set_output_vocab(KEPT)
    pruned = prune_output(restricted)
    assert 2 * k > pruned.output.weight.size(0)
    src = random_src([6, 4, 7, 2], seed=3, vocab=TIED_VOCAB)
    got = beam_search(pruned, src, decoding(8, k, n_best=k))
    ref = beam_search(restricted, src, decoding(8, k, n_best=k))
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in ref]
    for g, r in zip(sum(got, []), sum(ref, [])):
        assert g.score == pytest.approx(r.score, rel=1e-5)


@pytest.mark.parametrize("capacity", [0, 10])
def test_a_cache_reordered_without_autograd_copies_its_filled_positions_and_continues_as_the_full_forward(capacity):
    """As decoding reorders it (no autograd): the filled positions of the rows picked, room for one more, and the
    steps after it give the full forward's logits."""
    with torch.inference_mode():
        test_a_partly_filled_cache_reordered_with_a_duplicate_continues_as_the_full_forward(capacity)
        model = random_transformer(seed=6, vocab=30, layers=2)
        enc = model.encode(random_src([4, 7, 2], seed=3, vocab=30))
        tgt = random_src([5, 5, 5], seed=4, vocab=30)[:, :3]
        before = model.decode(tgt, enc, model.init_cache(enc, capacity)).cache  # 3 positions filled
        index = torch.tensor([2, 0, 0, 1])
        for old, new in zip(before.layers, before.index_select(index).layers, strict=True):
            for name in ("self_k", "self_v"):
                assert getattr(new, name).shape[2] == 4  # the 3 filled positions and one free
                assert torch.equal(getattr(new, name)[:, :, :3], getattr(old, name)[index, :, :3])
