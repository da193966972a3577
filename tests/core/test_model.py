"""nanomt.core.model against references: PyTorch's own modules with copied weights, and the paper's formulas."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import KEPT, TIED_VOCAB, decoding, random_src, tied_pair, tokens

from nanomt.core.config import EOS_ID, PAD_ID, ModelConfig
from nanomt.core.model import (
    CrossAttention,
    DecoderLayer,
    Encoded,
    EncoderLayer,
    LayerNorm,
    SelfAttention,
    Transformer,
    attention,
    causal_mask,
    dropout,
    layer_norm,
    padding_mask,
    prune_output,
    sinusoidal_table,
)
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.training.train import label_smoothed_loss

PAD = 0
ATOL = 1e-5
RTOL = 1e-5
# nn.TransformerEncoderLayer/DecoderLayer take "relu"/"gelu" by name and anything else as a callable.
REF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": F.silu}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def tiny_cfg(**overrides) -> ModelConfig:
    """A model small enough to run dozens of times in a few seconds on a CPU."""
    kwargs = dict(
        src_vocab_size=23,
        tgt_vocab_size=19,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=64,
        dropout=0.0,
        max_positions=40,
        pad_id=PAD,
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def randomize_(module: nn.Module) -> nn.Module:
    """Perturb every parameter (biases and LayerNorm gains included) so that a mis-copied one shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


def make_model(**overrides) -> Transformer:
    return randomize_(Transformer(tiny_cfg(**overrides))).eval()


def random_ids(vocab_size: int, lengths: list[int], total: int | None = None) -> torch.Tensor:
    """(B, max length) ids in 1..vocab_size-1, right-padded with PAD after each sentence's length."""
    total = max(lengths) if total is None else total
    ids = torch.randint(1, vocab_size, (len(lengths), total))
    for row, length in enumerate(lengths):
        ids[row, length:] = PAD
    return ids


def key_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """Our (B, 1, 1, S) True = may attend -> nn.MultiheadAttention's (B, S) True = ignore."""
    return ~mask[:, 0, 0, :]


def copy_params(ref: nn.Module, ours: nn.Module) -> None:
    """Copy weight and bias of a Linear or LayerNorm."""
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)


def copy_self_attention(ref: nn.MultiheadAttention, ours: SelfAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv.weight)  # both stacked [q; k; v]
        ref.in_proj_bias.copy_(ours.qkv.bias)
    copy_params(ref.out_proj, ours.out)


def copy_cross_attention(ref: nn.MultiheadAttention, ours: CrossAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q.weight, ours.kv.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q.bias, ours.kv.bias]))
    copy_params(ref.out_proj, ours.out)


def ref_encoder_layer(cfg: ModelConfig) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=REF_ACTIVATIONS[cfg.activation],
        layer_norm_eps=cfg.layer_norm_eps,
        batch_first=True,
        norm_first=cfg.norm_first,
    )


def ref_decoder_layer(cfg: ModelConfig) -> nn.TransformerDecoderLayer:
    return nn.TransformerDecoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=REF_ACTIVATIONS[cfg.activation],
        layer_norm_eps=cfg.layer_norm_eps,
        batch_first=True,
        norm_first=cfg.norm_first,
    )


def copy_encoder_layer(ref: nn.TransformerEncoderLayer, ours: EncoderLayer) -> None:
    copy_self_attention(ref.self_attn, ours.self_attn)
    copy_params(ref.linear1, ours.ffn.w1)
    copy_params(ref.linear2, ours.ffn.w2)
    copy_params(ref.norm1, ours.norm1)
    copy_params(ref.norm2, ours.norm2)


def copy_decoder_layer(ref: nn.TransformerDecoderLayer, ours: DecoderLayer) -> None:
    copy_self_attention(ref.self_attn, ours.self_attn)
    copy_cross_attention(ref.multihead_attn, ours.cross_attn)
    copy_params(ref.linear1, ours.ffn.w1)
    copy_params(ref.linear2, ours.ffn.w2)
    copy_params(ref.norm1, ours.norm1)
    copy_params(ref.norm2, ours.norm2)
    copy_params(ref.norm3, ours.norm3)


def ref_transformer(model: Transformer) -> nn.Transformer:
    """nn.Transformer with our weights; final stack norms only where ours has them (pre-norm)."""
    cfg = model.cfg
    d, eps = cfg.d_model, cfg.layer_norm_eps
    encoder = nn.TransformerEncoder(
        ref_encoder_layer(cfg),
        cfg.n_encoder_layers,
        norm=nn.LayerNorm(d, eps=eps) if cfg.norm_first else None,
        enable_nested_tensor=False,
    )
    decoder = nn.TransformerDecoder(
        ref_decoder_layer(cfg),
        cfg.n_decoder_layers,
        norm=nn.LayerNorm(d, eps=eps) if cfg.norm_first else None,
    )
    # nn.Transformer re-initializes every matrix it holds, so the weights are copied after it is built.
    ref = nn.Transformer(d, cfg.n_heads, custom_encoder=encoder, custom_decoder=decoder, batch_first=True)
    for ref_layer, layer in zip(ref.encoder.layers, model.encoder, strict=True):
        copy_encoder_layer(ref_layer, layer)
    for ref_layer, layer in zip(ref.decoder.layers, model.decoder, strict=True):
        copy_decoder_layer(ref_layer, layer)
    if cfg.norm_first:
        copy_params(ref.encoder.norm, model.encoder_norm)
        copy_params(ref.decoder.norm, model.decoder_norm)
    return ref.eval()


def expected_num_parameters(cfg: ModelConfig) -> int:
    """The parameter count from the architecture, each shared matrix counted once."""
    d, f = cfg.d_model, cfg.d_ff
    attn = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    encoder = cfg.n_encoder_layers * (attn + ffn + 2 * 2 * d)
    decoder = cfg.n_decoder_layers * (2 * attn + ffn + 3 * 2 * d)
    embeddings = cfg.src_vocab_size * d + (0 if cfg.share_embeddings else cfg.tgt_vocab_size * d)
    output = 0 if cfg.tie_output else cfg.tgt_vocab_size * d
    positions = 2 * cfg.max_positions * d if cfg.positional == "learned" else 0
    final_norms = 2 * 2 * d if cfg.norm_first else 0
    return encoder + decoder + embeddings + output + positions + final_norms


def reference_attention(q, k, v, mask):
    """softmax(Q K^T / sqrt(K)) V computed in float64 straight from the formula."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return (weights @ v.double()).float(), weights.float()


# ---------------------------------------------------------------------------------------------------------
# Masks, positions, LayerNorm.
# ---------------------------------------------------------------------------------------------------------


def test_padding_mask_and_causal_mask():
    """Pure mask functions: True = may attend; an all-padding row may attend to its first position."""
    ids = torch.tensor([[5, 3, PAD], [PAD, PAD, PAD]])
    expected = torch.tensor([[True, True, False], [True, False, False]])
    assert torch.equal(padding_mask(ids, PAD), expected[:, None, None, :])
    assert torch.equal(ids, torch.tensor([[5, 3, PAD], [PAD, PAD, PAD]]))  # the input is not modified
    square = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3, 3), square)
    # Two new queries after two cached positions: the last query sees every key.
    assert torch.equal(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool))


def test_sinusoidal_table_matches_formula():
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    d = 16
    table = sinusoidal_table(50, d)
    assert table.shape == (50, d) and table.dtype == torch.float32
    assert table[0, 0].item() == 0.0
    assert table[0, 1].item() == 1.0
    assert table[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-7)
    assert table[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-7)
    for pos, i in [(7, 3), (23, 1), (49, 7), (10, 5)]:
        angle = pos / 10000 ** (2 * i / d)
        assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embedding_scales_tokens_and_adds_positions():
    """3.4/3.5: tokens * sqrt(d_model) + PE at positions start..start+T-1; the table is not in state_dict."""
    model = make_model()
    d = model.cfg.d_model
    table = sinusoidal_table(model.cfg.max_positions, d)
    close(model.src_embed.table, table)
    ids = random_ids(model.cfg.tgt_vocab_size, [5, 5])
    expected = model.tgt_embed.tokens.weight[ids] * math.sqrt(d) + table[3:8]
    close(model.tgt_embed(ids, start=3), expected)
    assert "src_embed.table" in dict(model.named_buffers())
    assert not any("table" in key for key in model.state_dict())
    learned = make_model(positional="learned")
    assert "src_embed.positions.weight" in learned.state_dict()
    expected = learned.src_embed.tokens.weight[ids] * math.sqrt(d) + learned.src_embed.positions.weight[:5]
    close(learned.src_embed(ids), expected)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_too_long_sequence_raises(positional):
    """More positions than max_positions is a ValueError that names the limit, not an index error."""
    model = make_model(positional=positional)
    n = model.cfg.max_positions
    src = random_ids(model.cfg.src_vocab_size, [5])
    model(src, random_ids(model.cfg.tgt_vocab_size, [n]))  # exactly max_positions is fine
    with pytest.raises(ValueError, match="max_positions"):
        model(random_ids(model.cfg.src_vocab_size, [n + 1]), random_ids(model.cfg.tgt_vocab_size, [3]))
    with pytest.raises(ValueError, match="max_positions"):
        model(src, random_ids(model.cfg.tgt_vocab_size, [n + 1]))
    enc = model.encode(src)
    cache = model.decode(random_ids(model.cfg.tgt_vocab_size, [n]), enc, model.init_cache(enc)).cache
    with pytest.raises(ValueError, match="max_positions"):
        model.decode(random_ids(model.cfg.tgt_vocab_size, [1]), enc, cache)


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_layer_norm_matches_torch(eps):
    """Our LayerNorm equals nn.LayerNorm, forward and backward, with non-trivial gain and bias."""
    ours = LayerNorm(48, eps)
    with torch.no_grad():
        ours.weight.copy_(1.0 + torch.randn(48))
        ours.bias.copy_(torch.randn(48))
    ref = nn.LayerNorm(48, eps=eps)
    copy_params(ref, ours)
    x = (torch.randn(3, 5, 48) * 4 + 2).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    y, y_ref = ours(x), ref(x_ref)
    close(y, y_ref)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    close(x.grad, x_ref.grad)
    close(ours.weight.grad, ref.weight.grad)
    close(ours.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("eps", [1e-5, 1e-3])
def test_explicit_layer_norm_formula_matches_torch(eps):
    """The explicit formula (the readable path) equals nn.LayerNorm, forward and backward."""
    w, b = (1.0 + torch.randn(48)).requires_grad_(), torch.randn(48).requires_grad_()
    x = (torch.randn(3, 5, 48) * 4 + 2).requires_grad_()
    y = layer_norm(x, w, b, eps, fused=False)
    y_ref = torch.nn.functional.layer_norm(x, (48,), w, b, eps)
    close(y, y_ref)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), g)
    grads_ref = torch.autograd.grad(y_ref, (x, w, b), g)
    for a, r in zip(grads, grads_ref):
        close(a, r)


# ---------------------------------------------------------------------------------------------------------
# Attention.
# ---------------------------------------------------------------------------------------------------------

ATTENTION_CASES = ["none", "padding", "causal", "causal_rectangular", "padding_and_causal"]


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_fused_and_explicit_match_formula(case):
    """The fused (SDPA) and explicit paths of attention() agree with each other and with the formula."""
    b, h, k_dim = 2, 3, 8
    t_q, t_k = (3, 7) if case == "causal_rectangular" else (6, 6)
    q, k, v = torch.randn(b, h, t_q, k_dim), torch.randn(b, h, t_k, k_dim), torch.randn(b, h, t_k, k_dim)
    mask = padding_mask(random_ids(10, [t_k, 4]), PAD) if "padding" in case else None
    is_causal = "causal" in case
    expected_mask = mask
    if is_causal:
        causal = causal_mask(t_q, t_k)
        expected_mask = causal if mask is None else mask & causal
    fused, none = attention(q, k, v, mask, is_causal)
    explicit, weights = attention(q, k, v, mask, is_causal, need_weights=True)
    assert none is None
    ref_out, ref_weights = reference_attention(q, k, v, expected_mask)
    close(fused, explicit)
    close(fused, ref_out)
    close(weights, ref_weights)


def test_attention_is_causal_equals_explicit_causal_mask():
    """is_causal=True gives exactly the weights of a lower-triangular mask: zero above the diagonal."""
    q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
    out, weights = attention(q, k, v, is_causal=True, need_weights=True)
    out_mask, weights_mask = attention(q, k, v, mask=torch.ones(5, 5, dtype=torch.bool).tril(), need_weights=True)
    close(out, out_mask)
    close(weights, weights_mask)
    assert torch.all(weights.triu(diagonal=1) == 0)
    close(weights.sum(-1), torch.ones(2, 2, 5))


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "padding_and_causal"])
def test_self_attention_matches_multihead_attention(masking):
    """SelfAttention equals nn.MultiheadAttention with copied weights: outputs, per-head and mean weights."""
    cfg = tiny_cfg()
    ours = randomize_(SelfAttention(cfg))
    ref = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, batch_first=True)
    copy_self_attention(ref, ours)
    x = torch.randn(3, 7, cfg.d_model)
    mask = padding_mask(random_ids(10, [7, 4, 2]), PAD) if "padding" in masking else None
    is_causal = "causal" in masking
    ref_kwargs = {
        "key_padding_mask": None if mask is None else key_padding_mask(mask),
        "attn_mask": ~causal_mask(7, 7) if is_causal else None,
    }
    ref_out, ref_weights = ref(x, x, x, need_weights=True, average_attn_weights=False, **ref_kwargs)
    _, ref_mean = ref(x, x, x, need_weights=True, **ref_kwargs)
    ref_fast, _ = ref(x, x, x, need_weights=False, **ref_kwargs)

    out, none, (k, v) = ours(x, mask, is_causal)
    out_w, weights, _ = ours(x, mask, is_causal, need_weights=True)
    assert none is None
    assert k.shape == v.shape == (3, cfg.n_heads, 7, cfg.d_model // cfg.n_heads)
    close(out, ref_fast)
    close(out, ref_out)
    close(out_w, ref_out)
    close(weights, ref_weights)
    close(weights.mean(dim=1), ref_mean)


@pytest.mark.parametrize("padded", [False, True])
def test_cross_attention_matches_multihead_attention(padded):
    """CrossAttention (q = first D rows, kv = last 2D rows of in_proj) equals nn.MultiheadAttention."""
    cfg = tiny_cfg()
    ours = randomize_(CrossAttention(cfg))
    ref = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, batch_first=True)
    copy_cross_attention(ref, ours)
    x, memory = torch.randn(3, 5, cfg.d_model), torch.randn(3, 8, cfg.d_model)
    mask = padding_mask(random_ids(10, [8, 3, 6] if padded else [8, 8, 8]), PAD)
    kpm = key_padding_mask(mask) if padded else None
    ref_out, ref_weights = ref(x, memory, memory, key_padding_mask=kpm, average_attn_weights=False)
    _, ref_mean = ref(x, memory, memory, key_padding_mask=kpm)

    kv = ours.memory_kv(memory)
    out, none = ours(x, kv, mask)
    out_w, weights = ours(x, kv, mask, need_weights=True)
    assert none is None
    close(out, ref_out)
    close(out_w, ref_out)
    close(weights, ref_weights)
    close(weights.mean(dim=1), ref_mean)


# ---------------------------------------------------------------------------------------------------------
# Layers and the whole model against torch.nn.
# ---------------------------------------------------------------------------------------------------------

LAYER_CASES = [(False, "relu"), (True, "relu"), (False, "gelu"), (True, "swish")]


@pytest.mark.parametrize("norm_first,activation", LAYER_CASES)
def test_encoder_layer_matches_torch(norm_first, activation):
    """EncoderLayer equals nn.TransformerEncoderLayer (batch_first, dropout 0) with copied weights."""
    cfg = tiny_cfg(norm_first=norm_first, activation=activation)
    ours = randomize_(EncoderLayer(cfg)).eval()
    ref = ref_encoder_layer(cfg).eval()
    copy_encoder_layer(ref, ours)
    x = torch.randn(3, 6, cfg.d_model)
    mask = padding_mask(random_ids(10, [6, 3, 5]), PAD)
    expected = ref(x, src_key_padding_mask=key_padding_mask(mask))
    out, none = ours(x, mask)
    out_w, weights = ours(x, mask, need_weights=True)
    assert none is None and weights.shape == (3, cfg.n_heads, 6, 6)
    close(out, expected)
    close(out_w, expected)


@pytest.mark.parametrize("norm_first,activation", LAYER_CASES)
def test_decoder_layer_matches_torch(norm_first, activation):
    """DecoderLayer equals nn.TransformerDecoderLayer with a causal mask and memory padding."""
    cfg = tiny_cfg(norm_first=norm_first, activation=activation)
    ours = randomize_(DecoderLayer(cfg)).eval()
    ref = ref_decoder_layer(cfg).eval()
    copy_decoder_layer(ref, ours)
    x, memory = torch.randn(3, 5, cfg.d_model), torch.randn(3, 7, cfg.d_model)
    src_mask = padding_mask(random_ids(10, [7, 2, 4]), PAD)
    expected = ref(
        x,
        memory,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(5),
        memory_key_padding_mask=key_padding_mask(src_mask),
    )
    cross_kv = ours.cross_attn.memory_kv(memory)
    out, _, none, _ = ours(x, cross_kv, src_mask)
    out_w, (k, v), self_w, cross_w = ours(x, cross_kv, src_mask, need_weights=True)
    assert none is None
    assert self_w.shape == (3, cfg.n_heads, 5, 5) and cross_w.shape == (3, cfg.n_heads, 5, 7)
    assert k.shape == v.shape == (3, cfg.n_heads, 5, cfg.d_model // cfg.n_heads)
    close(out, expected)
    close(out_w, expected)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_matches_torch(norm_first):
    """The whole model equals nn.Transformer between our embeddings and our output projection."""
    model = make_model(norm_first=norm_first)
    ref = ref_transformer(model)
    src = random_ids(model.cfg.src_vocab_size, [9, 4, 6])
    tgt = random_ids(model.cfg.tgt_vocab_size, [7, 7, 3])  # target padding needs no mask: it is causal
    src_kpm = src == PAD
    hidden = ref(
        model.src_embed(src),
        model.tgt_embed(tgt),
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.size(1)),
        src_key_padding_mask=src_kpm,
        memory_key_padding_mask=src_kpm,
    )
    expected = model.output(hidden)
    close(model(src, tgt), expected)
    logits, _ = model(src, tgt, need_weights=True)
    close(logits, expected)


# ---------------------------------------------------------------------------------------------------------
# Properties of the model: causality, padding, batching.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_is_causal(norm_first):
    """Changing target tokens after position t leaves the logits up to t unchanged, and changes later ones."""
    model = make_model(norm_first=norm_first)
    v = model.cfg.tgt_vocab_size
    src = random_ids(model.cfg.src_vocab_size, [7, 5])
    tgt = random_ids(v, [6, 6])
    logits = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = tgt[:, t + 1 :] % (v - 1) + 1  # a different real token everywhere after t
        new_logits = model(src, changed)
        close(new_logits[:, : t + 1], logits[:, : t + 1])
        assert not torch.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_invariance(norm_first, positional):
    """Appending padding to the source, or to the target, leaves the logits at real positions unchanged."""
    model = make_model(norm_first=norm_first, positional=positional)
    src = random_ids(model.cfg.src_vocab_size, [5, 7])
    tgt = random_ids(model.cfg.tgt_vocab_size, [4, 6])
    logits = model(src, tgt)
    src_padded = F.pad(src, (0, 4), value=PAD)
    tgt_padded = F.pad(tgt, (0, 3), value=PAD)
    close(model(src_padded, tgt), logits)
    close(model(src, tgt_padded)[:, : tgt.size(1)], logits)
    close(model(src_padded, tgt_padded)[:, : tgt.size(1)], logits)


def test_batch_independence():
    """A sentence alone gives the same logits as inside a padded batch of sentences of other lengths."""
    model = make_model()
    src_lengths, tgt_lengths = [4, 9, 6, 1], [7, 3, 5, 2]
    src = random_ids(model.cfg.src_vocab_size, src_lengths)
    tgt = random_ids(model.cfg.tgt_vocab_size, tgt_lengths)
    batch_logits = model(src, tgt)
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        alone = model(src[i : i + 1, :s], tgt[i : i + 1, :t])
        close(alone[0], batch_logits[i, :t])


def test_all_padding_source_is_finite():
    """A source sentence made only of padding gives finite logits, weights and gradients, not NaN."""
    model = make_model().train()
    src = random_ids(model.cfg.src_vocab_size, [5, 0])
    tgt = random_ids(model.cfg.tgt_vocab_size, [4, 4])
    logits = model(src, tgt)
    assert torch.isfinite(logits).all()
    F.cross_entropy(logits.flatten(0, 1), torch.randint(1, model.cfg.tgt_vocab_size, (8,))).backward()
    for name, p in model.named_parameters():
        assert torch.isfinite(p.grad).all(), name
    logits_w, weights = model(src, tgt, need_weights=True)
    assert torch.isfinite(logits_w).all()
    assert all(torch.isfinite(w).all() for ws in weights.values() for w in ws)


# ---------------------------------------------------------------------------------------------------------
# Incremental decoding.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("capacity", [0, 3, 7])  # grown from empty, grown past a preallocation, preallocated
def test_cached_decoding_matches_full_forward(norm_first, positional, capacity):
    """encode + init_cache + decode, a token at a time or in chunks, equals the teacher-forced forward."""
    model = make_model(norm_first=norm_first, positional=positional)
    src = random_ids(model.cfg.src_vocab_size, [6, 8, 3])
    tgt = random_ids(model.cfg.tgt_vocab_size, [7, 7, 7])
    full = model(src, tgt)
    enc = model.encode(src)

    cache = model.init_cache(enc, capacity)
    assert cache.length == 0
    for t in range(tgt.size(1)):
        out = model.decode(tgt[:, t : t + 1], enc, cache)
        cache = out.cache
        assert cache.length == t + 1
        b, h, room, k = cache.layers[0].self_k.shape
        assert (b, h, k) == (3, model.cfg.n_heads, model.cfg.d_model // model.cfg.n_heads)
        assert room >= t + 1 and (capacity < 7 or room == 7)  # a large enough buffer is never regrown
        close(out.logits[:, 0], full[:, t])

    # A prefix, a chunk of three after it, then single tokens; the weights path gives the same logits.
    for need_weights in (False, True):
        cache = model.init_cache(enc, capacity)
        for start, end in [(0, 2), (2, 5), (5, 6), (6, 7)]:
            out = model.decode(tgt[:, start:end], enc, cache, need_weights=need_weights)
            cache = out.cache
            assert cache.length == end
            close(out.logits, full[:, start:end])


def test_cache_index_select_reorders_rows():
    """Decoding with a reordered cache (a permutation plus a duplicate, as in beam search) reorders logits."""
    model = make_model()
    src = random_ids(model.cfg.src_vocab_size, [6, 8, 3])
    tgt = random_ids(model.cfg.tgt_vocab_size, [5, 5, 5])
    enc = model.encode(src)
    cache = model.decode(tgt[:, :4], enc, model.init_cache(enc)).cache
    index = torch.tensor([2, 0, 1, 0])
    reordered = cache.index_select(index)
    assert reordered.length == cache.length
    for layer, new_layer in zip(cache.layers, reordered.layers, strict=True):
        for name in ("self_k", "self_v", "cross_k", "cross_v"):
            assert torch.equal(getattr(new_layer, name), getattr(layer, name)[index])
    enc_reordered = Encoded(enc.memory[index], enc.src_mask[index])
    out = model.decode(tgt[index, 4:5], enc_reordered, reordered)
    expected = model.decode(tgt[:, 4:5], enc, cache).logits[index]
    close(out.logits, expected)
    assert out.cache.layers[0].self_k.size(0) == 4
    # cross=False (beams moving within their sentence) reorders self-attention K/V only.
    within = cache.index_select(torch.tensor([1, 1, 0]), cross=False)
    assert within.layers[0].cross_k is cache.layers[0].cross_k
    assert torch.equal(within.layers[0].self_v, cache.layers[0].self_v[[1, 1, 0]])


# ---------------------------------------------------------------------------------------------------------
# Attention weights are return values.
# ---------------------------------------------------------------------------------------------------------


def module_state(model: nn.Module) -> dict[str, tuple[frozenset, frozenset]]:
    return {name: (frozenset(vars(m)), frozenset(m._buffers)) for name, m in model.named_modules()}


def check_rows(weights: torch.Tensor) -> None:
    assert (weights >= 0).all()
    close(weights.sum(dim=-1), torch.ones(weights.shape[:-1]))


def test_attention_weights_are_returned_not_stored():
    """Encoder/decoder/cross weights for every layer, (B, H, Tq, Tk), rows summing to 1; no module state."""
    model = make_model()
    cfg = model.cfg
    src = random_ids(cfg.src_vocab_size, [6, 4])
    tgt = random_ids(cfg.tgt_vocab_size, [5, 5])
    before = module_state(model)
    logits, weights = model(src, tgt, need_weights=True)
    close(logits, model(src, tgt))
    assert set(weights) == {"encoder", "decoder", "cross"}
    assert len(weights["encoder"]) == cfg.n_encoder_layers
    assert len(weights["decoder"]) == len(weights["cross"]) == cfg.n_decoder_layers
    b, h, s, t = 2, cfg.n_heads, 6, 5
    for w in weights["encoder"]:
        assert w.shape == (b, h, s, s)
        check_rows(w)
        assert torch.all(w[1, :, :, 4:] == 0)  # padded source keys get no attention
    for w in weights["decoder"]:
        assert w.shape == (b, h, t, t)
        check_rows(w)
        assert torch.all(w.triu(diagonal=1) == 0)
    for w in weights["cross"]:
        assert w.shape == (b, h, t, s)
        check_rows(w)
        assert torch.all(w[1, :, :, 4:] == 0)

    enc = model.encode(src)
    assert enc.attention is None
    out = model.decode(tgt[:, :3], enc, model.init_cache(enc), need_weights=True)
    out = model.decode(tgt[:, 3:4], enc, out.cache, need_weights=True)
    assert [w.shape for w in out.self_attention] == [(b, h, 1, 4)] * cfg.n_decoder_layers
    assert [w.shape for w in out.cross_attention] == [(b, h, 1, s)] * cfg.n_decoder_layers
    for w in out.self_attention + out.cross_attention:
        check_rows(w)

    assert module_state(model) == before
    for name, m in model.named_modules():
        tensors = [key for key, value in vars(m).items() if isinstance(value, torch.Tensor)]
        assert not tensors, f"{name or 'model'} stores tensors {tensors}"


# ---------------------------------------------------------------------------------------------------------
# Parameters, gradients, config, dropout.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "share,tie,positional",
    [
        (False, False, "sinusoidal"),
        (True, True, "learned"),
        (False, True, "learned"),
        (True, False, "sinusoidal"),
    ],
)
def test_gradients_reach_every_parameter(share, tie, positional):
    """Every parameter gets a non-zero gradient; tied and shared weights are one tensor, counted once."""
    v = 19
    model = make_model(
        src_vocab_size=v, tgt_vocab_size=v, share_embeddings=share, tie_output=tie, positional=positional
    ).train()
    assert (model.src_embed.tokens.weight is model.tgt_embed.tokens.weight) == share
    assert (model.output.weight is model.tgt_embed.tokens.weight) == tie
    assert model.num_parameters() == expected_num_parameters(model.cfg)
    src = random_ids(v, [7, 5, 6])
    tgt = random_ids(v, [6, 6, 4])
    target = random_ids(v, [6, 6, 4])
    logits = model(src, tgt)
    F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_base_config_parameter_count():
    """The paper's base model with shared, tied embeddings (37k vocabulary) has about 63M parameters."""
    cfg = ModelConfig(37000, 37000, share_embeddings=True, tie_output=True)
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = Transformer(cfg)
    n = model.num_parameters()
    assert 60_000_000 < n < 66_000_000
    assert n == expected_num_parameters(cfg) == 63_084_544


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(share_embeddings=True), "share_embeddings"),
        (dict(activation="tanh"), "activation"),
        (dict(positional="rotary"), "positional"),
    ],
)
def test_model_config_validation(overrides, field):
    """Invalid combinations raise ValueError naming the field (tiny_cfg has different vocabulary sizes)."""
    with pytest.raises(ValueError, match=field):
        tiny_cfg(**overrides)


@pytest.mark.parametrize("kind", ["dropout", "attention_dropout", "activation_dropout"])
def test_dropout_only_in_train_mode(kind):
    """With dropout > 0, two forwards differ in train mode and are identical in eval mode."""
    model = make_model(**{kind: 0.3})
    src = random_ids(model.cfg.src_vocab_size, [6, 4])
    tgt = random_ids(model.cfg.tgt_vocab_size, [5, 5])
    for need_weights in (False, True):
        model.train()
        a, b = (model(src, tgt, need_weights=need_weights) for _ in range(2))
        if need_weights:
            a, b = a[0], b[0]
        assert not torch.allclose(a, b)
        model.eval()
        a, b = (model(src, tgt, need_weights=need_weights) for _ in range(2))
        if need_weights:
            a, b = a[0], b[0]
        assert torch.equal(a, b)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keeps_one_minus_p_and_preserves_the_mean(p):
    """Our CPU dropout zeroes a fraction p, scales the rest by 1/(1-p), and backpropagates through the mask."""
    torch.manual_seed(0)
    x = torch.ones(1_000_001, requires_grad=True)
    y = dropout(x, p)
    kept = (y != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 3e-3
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())
    torch.manual_seed(0)
    assert torch.equal(dropout(x, p), y)  # reproducible from the torch seed, as exact resume needs
    assert dropout(x, p, training=False) is x


def test_init_std_option():
    """init_std=None keeps Xavier matrices and N(0, D^-1/2) embeddings; a number gives N(0, init_std) to both."""
    torch.manual_seed(0)
    d = 64
    xavier = Transformer(ModelConfig(2000, 2000, d_model=d, n_heads=4, d_ff=256))
    w1 = xavier.encoder[0].ffn.w1.weight
    assert abs(w1.std().item() - (2 / (d + 256)) ** 0.5) < 0.01  # Xavier-uniform: var = 2 / (fan_in + fan_out)
    assert abs(xavier.src_embed.tokens.weight.std().item() - d**-0.5) < 0.01
    small = Transformer(ModelConfig(2000, 2000, d_model=d, n_heads=4, d_ff=256, init_std=0.02))
    for p in (small.encoder[0].ffn.w1.weight, small.decoder[0].self_attn.qkv.weight, small.src_embed.tokens.weight):
        assert abs(p.std().item() - 0.02) < 0.002
    with pytest.raises(ValueError, match="init_std"):
        ModelConfig(10, 10, d_model=8, n_heads=2, init_std=0.0)


# restrict_output: the output layer scores only the target ids of the training data.


def test_logits_are_the_full_models_at_kept_ids_and_minus_inf_elsewhere():
    restricted, full = tied_pair()
    restricted.set_output_vocab(KEPT)
    kept = sorted({PAD_ID, *KEPT.tolist()})  # padding is always kept, at its own position
    assert restricted.output_ids.tolist() == kept
    src, tgt = random_src([5, 3], vocab=TIED_VOCAB), random_src([4, 6], seed=1, vocab=TIED_VOCAB)
    ref = full(src, tgt)  # (B, T, V)
    assert torch.allclose(restricted(src, tgt, restricted=True), ref[..., kept], atol=1e-5)
    out = restricted(src, tgt)
    dropped = [i for i in range(TIED_VOCAB) if i not in kept]
    assert torch.allclose(out[..., kept], ref[..., kept], atol=1e-5)
    assert torch.isneginf(out[..., dropped]).all()


def test_restricted_loss_is_cross_entropy_over_the_kept_ids_with_unscored_targets_skipped():
    restricted, full = tied_pair()
    restricted.set_output_vocab(KEPT)
    kept = restricted.output_ids.tolist()
    position = {t: i for i, t in enumerate(kept)}  # built by hand, not from output_index
    src = random_src([5, 3], vocab=TIED_VOCAB)
    tgt = torch.tensor([[7, 9, 11, EOS_ID], [20, 33, EOS_ID, PAD_ID]])  # 33 is not kept
    logits = restricted(src, tgt, restricted=True)
    got = label_smoothed_loss(logits, restricted.output_targets(tgt), 0.1, PAD_ID)
    ref_logits = full(src, tgt)[..., kept]
    # Row 0 whole; row 1 without the unscored 33 (position 1) and the padding (position 3).
    rows = torch.cat([ref_logits[0], ref_logits[1, [0, 2]]])
    target = torch.tensor([position[t] for t in (7, 9, 11, EOS_ID, 20, EOS_ID)])
    ref = F.cross_entropy(rows, target, label_smoothing=0.1, reduction="sum")
    assert math.isclose(got.item(), ref.item(), rel_tol=1e-5)


class MaskedOutput(torch.nn.Module):
    """Reference: the full model's output layer with -inf at the dropped ids, built without restrict_output."""

    def __init__(self, linear: torch.nn.Linear, keep: torch.Tensor):
        super().__init__()
        self.linear = linear
        self.dropped = torch.ones(linear.out_features, dtype=torch.bool)
        self.dropped[keep] = False

    def forward(self, h):
        return self.linear(h).masked_fill(self.dropped, float("-inf"))


def test_decoding_equals_the_full_model_with_dropped_ids_masked():
    restricted, full = tied_pair(seed=3)
    src = random_src([6, 4, 7], seed=2, vocab=TIED_VOCAB)
    free = tokens(greedy(full, src, decoding(12)))
    # Drop the tokens the unrestricted model chose, so that the restricted model has to choose others.
    chosen = {t for row in free for t in row}
    keep = torch.tensor([i for i in range(TIED_VOCAB) if i not in chosen])
    restricted.set_output_vocab(keep)
    full.output = MaskedOutput(full.output, restricted.output_ids)
    got = tokens(greedy(restricted, src, decoding(12)))
    assert got == tokens(greedy(full, src, decoding(12))) and got != free
    assert all(t not in chosen for row in got for t in row)
    beams = [[h.tokens for h in hyps] for hyps in beam_search(restricted, src, decoding(12, 3, n_best=3))]
    assert beams == [[h.tokens for h in hyps] for hyps in beam_search(full, src, decoding(12, 3, n_best=3))]


def test_pruned_copy_projects_onto_the_kept_rows_only_and_scores_as_the_model_does():
    restricted, _ = tied_pair(seed=4)
    restricted.set_output_vocab(KEPT)
    before = {k: v.clone() for k, v in restricted.state_dict().items()}
    pruned = prune_output(restricted)
    k = len(restricted.output_ids)
    assert pruned.output.weight.shape == (k, 32) and restricted.output.weight.shape == (TIED_VOCAB, 32)
    assert restricted.output.weight is restricted.tgt_embed.tokens.weight  # the original stays tied, unchanged
    assert all(torch.equal(before[n], t) for n, t in restricted.state_dict().items())
    assert torch.equal(pruned.output.weight, restricted.tgt_embed.tokens.weight[restricted.output_ids])
    src, tgt = random_src([5, 3], seed=5, vocab=TIED_VOCAB), random_src([4, 6], seed=6, vocab=TIED_VOCAB)
    with torch.inference_mode():
        ref, out = restricted(src, tgt), pruned(src, tgt)  # (B, T, V) both
        assert torch.allclose(pruned(src, tgt, restricted=True), restricted(src, tgt, restricted=True), atol=1e-5)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)) and torch.isneginf(ref).any()
    kept = restricted.output_ids
    assert torch.allclose(out[..., kept], ref[..., kept], atol=1e-5)
    unrestricted = Transformer(dataclasses.replace(restricted.cfg, restrict_output=False))
    assert prune_output(unrestricted) is unrestricted


def test_pruned_copy_decodes_as_the_model_does():
    """Greedy and beam search over the pruned copy's K scores: the model's tokens, scores and log-probs."""
    restricted, _ = tied_pair(seed=3)  # a seed whose greedy output for the last sentence is EOS at once
    restricted.set_output_vocab(KEPT)
    pruned = prune_output(restricted)
    src = random_src([6, 4, 7, 2], seed=3, vocab=TIED_VOCAB)
    for min_len in (0, 4):  # 4: EOS blocked for 4 steps, at its position among the kept ids
        got, ref = (
            tokens(greedy(pruned, src, decoding(10, min_len=min_len))),
            tokens(greedy(restricted, src, decoding(10, min_len=min_len))),
        )
        assert got == ref and min(map(len, got)) == (0 if min_len == 0 else 10)
        for kind in ("gnmt", "none"):
            got = beam_search(pruned, src, decoding(10, 3, min_len=min_len, length_penalty_kind=kind, n_best=3))
            ref = beam_search(restricted, src, decoding(10, 3, min_len=min_len, length_penalty_kind=kind, n_best=3))
            assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in ref]
            for g, r in zip(sum(got, []), sum(ref, [])):
                assert math.isclose(g.score, r.score, rel_tol=1e-5)
                assert math.isclose(g.log_prob, r.log_prob, rel_tol=1e-5)


def test_set_output_vocab_needs_a_restricted_model():
    _, full = tied_pair()
    with pytest.raises(ValueError, match="restrict_output"):
        full.set_output_vocab(KEPT)


# vocab_multiple: embedding and output matrices padded with rows that are never scored.


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # separate embeddings, untied output
        {"share_embeddings": True, "tie_output": True, "output_bias": True},
        {"share_embeddings": True, "tie_output": True, "restrict_output": True},
    ],
)
def test_padded_vocabulary_scores_as_the_unpadded_model(overrides):
    """V=13 padded to 16 rows: logits (B, T, 13), loss and gradients of the same model without the padding rows."""
    src_v = tgt_v = 13
    plain = Transformer(tiny_cfg(src_vocab_size=src_v, tgt_vocab_size=tgt_v, **overrides))
    pad = Transformer(dataclasses.replace(plain.cfg, vocab_multiple=8))
    assert pad.src_embed.tokens.weight.shape[0] == pad.output.weight.shape[0] == 16
    with torch.no_grad():
        for name, p in pad.named_parameters():
            q = plain.get_parameter(name)
            p.normal_()  # the padding rows hold noise: it must not reach any output
            p[tuple(slice(0, n) for n in q.shape)] = q
    if plain.cfg.restrict_output:
        plain.set_output_vocab(torch.tensor([3, 5, 7, 11]))
        pad.set_output_vocab(torch.tensor([3, 5, 7, 11]))
    src, tgt = random_src([5, 3], vocab=src_v), random_src([4, 6], seed=1, vocab=tgt_v)
    for restricted in (False, True) if plain.cfg.restrict_output else (False,):
        ref, out = plain(src, tgt, restricted=restricted), pad(src, tgt, restricted=restricted)
        assert out.shape == ref.shape
        assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
        close(out[torch.isfinite(ref)], ref[torch.isfinite(ref)])
    loss = {}
    for name, m in (("plain", plain), ("pad", pad)):
        m.zero_grad()
        restricted = m.cfg.restrict_output
        logits = m(src, tgt, restricted=restricted)
        loss[name] = label_smoothed_loss(logits, m.output_targets(tgt), 0.1, PAD_ID)
        loss[name].backward()
    close(loss["pad"], loss["plain"])
    for name, p in plain.named_parameters():
        g = pad.get_parameter(name).grad
        if not p.requires_grad:  # the output bias: a constant of the model
            assert g is None and p.grad is None
            continue
        close(g[tuple(slice(0, n) for n in p.shape)], p.grad)
    assert tokens(greedy(pad, src, decoding(8))) == tokens(greedy(plain, src, decoding(8)))
    beams = [[h.tokens for h in hyps] for hyps in beam_search(pad, src, decoding(8, 3, n_best=3))]
    assert beams == [[h.tokens for h in hyps] for hyps in beam_search(plain, src, decoding(8, 3, n_best=3))]
