"""The rules every search shares (nanomt.decoding.steps), held by greedy, beam search and sampling alike: outputs
independent of the batch and its padding, the length budget (max_len, a function of the source length, the
decoder's positions), min_len, PAD and BOS never generated, a model that ends first, the train mode left alone, and
bad arguments refused."""

from __future__ import annotations

import math

import pytest
import search_models
from conftest import decoding, max_len_fn, tokens
from search_models import BOS, EOS, LENGTHS, PAD, A, B, TableModel, make_src, table_src

from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample
from nanomt.decoding.steps import Hypothesis

model = search_models.model  # the tiny random Transformer, a fixture of this module too

pytestmark = pytest.mark.usefixtures("one_thread")


def test_output_independent_of_batch_and_padding(model):
    src = make_src(LENGTHS, extra_pad=3)
    batch_greedy = tokens(greedy(model, src, decoding(10)))
    batch_beam = beam_search(model, src, decoding(10, 3, n_best=3))
    for i, n in enumerate(LENGTHS):
        alone = src[i : i + 1, : n + 1]
        assert batch_greedy[i] == tokens(greedy(model, alone, decoding(10)))[0]
        beam_alone = beam_search(model, alone, decoding(10, 3, n_best=3))[0]
        assert [h.tokens for h in batch_beam[i]] == [h.tokens for h in beam_alone]
        assert [h.score for h in batch_beam[i]] == pytest.approx([h.score for h in beam_alone], abs=1e-4)


@pytest.mark.parametrize("max_len", [1, 3, 7])
def test_max_len_bounds_output(model, max_len):
    src = make_src(LENGTHS)
    outputs = [
        tokens(greedy(model, src, decoding(max_len))),
        [h[0].tokens for h in beam_search(model, src, decoding(max_len, 3))],
        tokens(sample(model, src, decoding(max_len, seed=0))),
    ]
    for out in outputs:
        assert all(len(o) <= max_len for o in out)
        assert any(len(o) == max_len for o in out)


def test_train_mode_left_alone(model):
    src = make_src(LENGTHS[:2])
    try:
        model.train()
        tokens(greedy(model, src, decoding(4)))
        beam_search(model, src, decoding(4, 2))
        assert model.training
    finally:
        model.eval()
    tokens(greedy(model, src, decoding(4)))
    assert not model.training


def test_bad_arguments_raise(model):
    src = make_src(LENGTHS[:2])
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, decoding(5, 2, n_best=3))
    with pytest.raises(ValueError, match="length_penalty_kind"):
        beam_search(model, src, decoding(5, 2, length_penalty_kind="wu"))
    with pytest.raises(ValueError, match="max_len_a"):
        decoding(max_len_fn(-1.0, 5))
    assert all(len(o) <= 1 for o in tokens(greedy(model, src, decoding(0))))  # a budget is at least one token
    with pytest.raises(ValueError, match="top_p"):
        tokens(sample(model, src, decoding(5, top_p=0.0)))
    assert tokens(greedy(model, src[:0], decoding(5))) == [] and beam_search(model, src[:0], decoding(5, 2)) == []


# ---------------------------------------------------------------------------------------------------------
# On a stand-in model whose next-token distribution is a table (search_models.TableModel).
# ---------------------------------------------------------------------------------------------------------


FLAT = {EOS: 0.7, A: 0.2, B: 0.1}


def test_model_that_ends_first_gives_empty_output():
    stub = TableModel({}, default=FLAT)
    src = table_src([2, 4])
    assert tokens(greedy(stub, src, decoding(5))) == [[], []]
    assert tokens(sample(stub, src, decoding(5, top_k=1, seed=0))) == [[], []]
    for (h,) in beam_search(stub, src, decoding(5, 3)):
        assert isinstance(h, Hypothesis) and h.tokens == []
        assert h.score == h.log_prob == pytest.approx(math.log(0.7))  # length 1: the GNMT penalty is 1


def test_min_len_forces_tokens():
    stub = TableModel({}, default=FLAT)
    src = table_src([2, 4])
    assert tokens(greedy(stub, src, decoding(10, min_len=3))) == [[A, A, A], [A, A, A]]
    for (h,) in beam_search(stub, src, decoding(10, 3, min_len=3)):
        assert h.tokens == [A, A, A]
        assert h.log_prob == pytest.approx(3 * math.log(0.2) + math.log(0.7))
    for seed in range(5):
        assert all(len(o) >= 3 for o in tokens(sample(stub, src, decoding(10, min_len=3, seed=seed))))


def test_min_len_above_max_len_cuts_at_max_len():
    stub = TableModel({}, default=FLAT)
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(2, min_len=5))) == [[A, A]]
    (h,) = beam_search(stub, src, decoding(2, 2, min_len=5))[0]
    assert h.tokens == [A, A]
    assert h.log_prob == pytest.approx(2 * math.log(0.2))  # no EOS: the hypothesis was cut


def test_max_len_function_of_source_length_and_finished_rows_dropped():
    src = table_src([1, 3, 6])
    limit = max_len_fn(1.0, 2)  # 3, 5, 8 tokens
    stub = TableModel({}, default={A: 1.0})
    assert [len(o) for o in tokens(greedy(stub, src, decoding(limit)))] == [3, 5, 8]
    assert stub.rows_per_step == [3, 3, 3, 2, 2, 1, 1, 1]
    stub = TableModel({}, default={A: 1.0})
    assert [h[0].tokens for h in beam_search(stub, src, decoding(limit, 2))] == [[A] * 3, [A] * 5, [A] * 8]
    assert stub.rows_per_step == [6, 6, 6, 4, 4, 2, 2, 2]
    assert [len(o) for o in tokens(sample(stub, src, decoding(max_len_fn(0.5, 1), seed=0)))] == [1, 2, 4]


def test_pad_and_bos_never_generated():
    stub = TableModel({}, default={PAD: 0.5, BOS: 0.3, A: 0.15, EOS: 0.05})
    src = table_src([2])
    assert tokens(greedy(stub, src, decoding(3))) == [[A, A, A]]
    assert tokens(sample(stub, src, decoding(3, top_k=1, seed=0))) == [[A, A, A]]
    for h in beam_search(stub, src, decoding(3, 3, n_best=3))[0]:
        assert set(h.tokens) <= {A}
        # Banned tokens are masked, not renormalized away: log-probs stay the model's own.
        assert h.log_prob == pytest.approx(len(h.tokens) * math.log(0.15) + (len(h.tokens) < 3) * math.log(0.05))


def test_max_len_capped_at_decoder_positions():
    stub = TableModel({}, default={A: 1.0}, max_positions=5)
    assert tokens(greedy(stub, table_src([2]), decoding(100))) == [[A] * 5]
