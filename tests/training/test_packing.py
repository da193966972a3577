"""Packed batches (sentences concatenated into rows): the loss and every gradient equal the padded batch's; no token
attends across a sentence boundary; positions restart per sentence; compile over bucketed shapes recompiles a bounded
number of times."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from packed_pairs import IDS, VOCAB, Pairs, loss_and_grads, model

from nanomt.core import model as model_module
from nanomt.core.batches import bucket, make_batches
from nanomt.core.model import Packing, SegmentMask, Transformer, use_varlen
from nanomt.training import train as train_module
from nanomt.training.data import collate, pack, pack_rows


@pytest.mark.parametrize(
    "kw, fused",
    [
        ({}, False),  # sinusoidal, pre-norm, the CPU's blockwise loss
        ({"positional": "learned", "norm_first": False}, True),  # learned positions, post-norm, F.cross_entropy
        ({"share_embeddings": True, "tie_output": True}, False),
    ],
)
def test_packed_and_padded_batches_give_the_same_loss_and_gradients(kw, fused):
    corpus = Pairs(23, seed=1)
    idx = np.arange(len(corpus))
    m = model(**kw)
    padded, packed = collate(corpus, idx, IDS), pack(corpus, idx, IDS, row_tokens=40)
    assert packed.src.size(0) < padded.src.size(0) and packed.src.numel() < padded.src.numel()
    assert (packed.n_src_tokens, packed.n_tgt_tokens) == (padded.n_src_tokens, padded.n_tgt_tokens)
    loss_a, grads_a = loss_and_grads(m, padded, fused)
    loss_b, grads_b = loss_and_grads(m, packed, fused)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == len(list(m.parameters()))
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


def test_packed_logits_are_each_sentences_own():
    """A packed sentence's logits are those of the sentence alone, at positions restarting from 0."""
    corpus = Pairs(9, seed=2)
    m = model().eval()
    packed = pack(corpus, np.arange(9), IDS, row_tokens=32)
    logits = m(packed.src, packed.tgt_in, packing=packed.packing)
    seg, pos = packed.packing.tgt_segments, packed.packing.tgt_positions
    for i in range(9):
        alone = collate(corpus, np.array([i]), IDS)
        want = m(alone.src, alone.tgt_in)[0]  # (T, V)
        found = False
        for r in range(seg.size(0)):
            for j in seg[r].unique().tolist():
                at = seg[r] == j
                if j and at.sum() == want.size(0) and torch.equal(packed.tgt_out[r, at], alone.tgt_out[0]):
                    assert pos[r, at].tolist() == list(range(want.size(0)))
                    torch.testing.assert_close(logits[r, at], want, rtol=1e-5, atol=1e-5)
                    found = True
        assert found, i


def test_no_attention_across_sentence_boundaries():
    """Changing one packed sentence (source and target) leaves every other sentence's logits unchanged."""
    corpus = Pairs(8, seed=3)
    m = model().eval()
    b = pack(corpus, np.arange(8), IDS, row_tokens=64)
    assert b.src.size(0) == 1  # all in one row
    seg_s, seg_t = b.packing.src_segments[0], b.packing.tgt_segments[0]
    src, tgt = b.src.clone(), b.tgt_in.clone()
    src[0, seg_s == 3] = (src[0, seg_s == 3] + 5) % (VOCAB - 3) + 3
    tgt[0, (seg_t == 3) & (b.packing.tgt_positions[0] > 0)] = 7  # keep its BOS, change its tokens
    before, after = m(b.src, b.tgt_in, packing=b.packing), m(src, tgt, packing=b.packing)
    others = (seg_t != 3) & (seg_t != 0)
    torch.testing.assert_close(after[0, others], before[0, others], rtol=0, atol=1e-6)
    assert not torch.allclose(after[0, seg_t == 3], before[0, seg_t == 3])


def test_the_decoder_mask_is_causal_within_each_sentence_and_never_across():
    seg = torch.tensor([[1, 1, 1, 2, 2, 0, 0]])
    mask = SegmentMask(seg, seg, causal=True).dense()[0, 0]
    for i in range(7):
        for j in range(7):
            if seg[0, i] == 0:  # padding sees what comes before it (never used; keeps softmax rows non-empty)
                assert mask[i, j] == (j <= i)
            else:
                assert mask[i, j] == (seg[0, i] == seg[0, j] and j <= i)
    cross = SegmentMask(torch.tensor([[1, 1, 2, 0]]), torch.tensor([[1, 2, 2, 2, 0]])).dense()[0, 0]
    assert cross.tolist() == [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_pack_rows_keep_order_and_budget_and_end_in_padding():
    rng = np.random.default_rng(0)
    s, t = rng.integers(2, 20, 100), rng.integers(2, 20, 100)
    rows = pack_rows(s, t, 48)
    assert [i for r in rows for i in r] == list(range(100))
    assert all(s[r].sum() <= 47 and t[r].sum() <= 47 for r in map(np.array, rows))
    assert pack_rows([60, 3], [2, 3], 48) == [[0], [1]]  # a longer sentence alone
    corpus = Pairs(30, seed=4)
    b = pack(corpus, np.arange(30), IDS, row_tokens=48, multiple=8)
    p = b.packing
    assert b.src.size(1) % 8 == 0 and b.tgt_in.size(1) % 8 == 0
    assert (p.src_segments[:, -1] == 0).all() and (p.tgt_segments[:, -1] == 0).all()
    assert ((b.src != IDS.pad) == (p.src_segments != 0)).all() and (
        (b.tgt_out != IDS.pad) == (p.tgt_segments != 0)
    ).all()
    # The cumulative lengths: one sequence a sentence and one a row's padding, the same count on both sides.
    assert p.cu_src[-1] == b.src.numel() and p.cu_tgt[-1] == b.tgt_in.numel() and len(p.cu_src) == len(p.cu_tgt)
    assert len(p.cu_src) - 1 == 30 + b.src.size(0) and p.max_src == int(p.cu_src.diff().max())
    assert not use_varlen(torch.zeros(1, 1, 1, 8), p.encoder_mask(), 0.0, False)  # a CPU: the dense mask


def test_packed_token_budget_counts_real_tokens():
    rng = np.random.default_rng(0)
    s, t = rng.integers(1, 40, 2000), rng.integers(1, 40, 2000)
    for packed in (False, True):
        batches = make_batches(s, t, 500, seed=0, epoch=0, packed=packed)
        assert sorted(np.concatenate(batches).tolist()) == list(range(2000))
        real = [int((np.maximum(s[b], t[b]) + 1).sum()) for b in batches]
        assert max(real) <= 500
    assert len(make_batches(s, t, 500, 0, 0, packed=True)) < len(make_batches(s, t, 500, 0, 0))


def test_packing_moves_with_the_batch():
    b = pack(Pairs(5, seed=5), np.arange(5), IDS, row_tokens=32)
    moved = b.map(lambda x: x.clone())
    assert isinstance(moved.packing, Packing) and moved.packing.max_src == b.packing.max_src
    assert all(torch.equal(x, y) for x, y in zip(moved.packing[:6], b.packing[:6], strict=True))


def test_packed_decoding_with_a_cache_is_refused():
    b = pack(Pairs(3, seed=6), np.arange(3), IDS, row_tokens=32)
    m = model().eval()
    enc = m.encode(b.src, packing=b.packing)
    with pytest.raises(ValueError, match="teacher forcing"):
        m.decode(b.tgt_in, enc, m.init_cache(m.encode(b.src)), packing=b.packing)


def compiles(m: Transformer, batches, dynamic: bool) -> int:
    """Graphs torch.compile made (a counting backend that runs them eagerly) over a forward/backward per batch."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(m, backend=backend, dynamic=dynamic)
    for b in batches:
        compiled(b.src, b.tgt_in, packing=b.packing).sum().backward()
    torch._dynamo.reset()
    return len(graphs)


@pytest.mark.slow  # torch.compile's graphs
def test_compile_over_bucketed_shapes_recompiles_within_its_bound():
    """Static shapes: one graph per bucketed shape, and bucket() bounds the shapes; dynamic (train.compile): one."""
    corpus = Pairs(400, seed=7, max_len=30)
    plan = make_batches(corpus.src_lens, corpus.tgt_lens, 200, seed=0, epoch=0)[:8]
    raw = [collate(corpus, b, IDS) for b in plan]
    buckets = [train_module.bucketed(b, IDS.pad) for b in raw]
    shapes = {(b.src.shape, b.tgt_in.shape) for b in buckets}
    assert len(shapes) < len({(b.src.shape, b.tgt_in.shape) for b in raw})
    for b, r in zip(buckets, raw, strict=True):  # grown, never cut, by at most an eighth (+ 7 under 64)
        for x, y in ((b.src, r.src), (b.tgt_in, r.tgt_in)):
            assert y.size(0) <= x.size(0) <= y.size(0) * 9 / 8 and y.size(1) <= x.size(1) <= max(
                y.size(1) * 9 / 8, y.size(1) + 7
            )
    assert all(b.src.size(1) in {bucket(n) for n in range(1, 32)} for b in buckets)
    m = model()
    assert compiles(m, buckets, dynamic=False) == len(shapes)
    assert compiles(m, raw, dynamic=True) == 1  # no graph break, no recompilation
    packed = [pack(corpus, b, IDS, row_tokens=64, width=bucket) for b in plan]
    assert {b.src.size(1) for b in packed} <= {bucket(n) for n in range(1, 65)}
    # At most one recompilation: a first batch whose source and target widths are equal is compiled with them equal
    # (PyTorch's duck sizing), and the first that differs recompiles once with both dynamic.
    assert compiles(m, packed, dynamic=True) <= 2


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
    """torch.nn.attention.varlen.varlen_attn's contract, one sequence at a time with SDPA: (N, H, K) in and out."""
    assert max_q == int(cu_q.diff().max()) and max_k == int(cu_k.diff().max()) and len(cu_q) == len(cu_k)
    out = []
    for i in range(len(cu_q) - 1):
        qs, ks, vs = (
            x[a:b].transpose(0, 1) for x, a, b in ((q, *cu_q[i : i + 2]), (k, *cu_k[i : i + 2]), (v, *cu_k[i : i + 2]))
        )
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=window_size == (-1, 0)).transpose(0, 1))
    return torch.cat(out)  # (N, H, K)


def test_the_varlen_path_gives_the_masks_numbers(monkeypatch):
    """The CUDA path's flattening and cumulative lengths, run on a CPU with a reference for the kernel: the dense
    mask's logits and gradients."""
    corpus = Pairs(17, seed=8)
    m = model()
    b = pack(corpus, np.arange(17), IDS, row_tokens=48)
    assert b.src.size(0) > 1  # several rows, each with its padding sequence
    want_loss, want_grads = loss_and_grads(m, b, fused=False)
    calls = []
    monkeypatch.setattr(model_module, "varlen_attn", lambda *a, **kw: calls.append(1) or reference_varlen(*a, **kw))
    monkeypatch.setattr(model_module, "use_varlen", lambda q, mask, p, w: mask.cu_q is not None)
    loss, grads = loss_and_grads(m, b, fused=False)
    assert len(calls) == 2 + 2 * 2
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-4, atol=1e-6, msg=name)
