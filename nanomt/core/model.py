"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), from scratch.

Shapes: B batch, S source length, T target length, D d_model, H heads, K head dim (D / H), V vocabulary.
Masks are boolean with scaled_dot_product_attention's convention: True = may attend.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from nanomt.core.config import ModelConfig

# CUDA's flash kernel over packed sequences given by cumulative lengths (PyTorch >= 2.10): None until first asked
# for (importing it loads torch's compiler, 1.2 s of every command's start-up), False where this PyTorch lacks it.
varlen_attn = None


def varlen_kernel():
    """torch.nn.attention.varlen.varlen_attn, imported on first use; None where this PyTorch has none."""
    global varlen_attn
    if varlen_attn is None:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:  # pragma: no cover - older PyTorch: packed batches take the block-diagonal mask
            varlen_attn = False
    return varlen_attn or None


# ---------------------------------------------------------------------------------------------------------
# Masks and positions: pure functions.
# ---------------------------------------------------------------------------------------------------------


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, 1, 1, S) key mask, True on real tokens."""
    mask = ids != pad_id
    # A sentence that is all padding may attend to its first position, so softmax never sees an empty row. An
    # assignment, not |=: the ONNX export traces this, and ONNX has no in-place `or` on a view.
    mask[:, 0] = mask[:, 0] | ~mask.any(dim=1)
    return mask[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(t_query: int, t_key: int, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) mask letting query i (the last Tq of Tk positions) see keys 0..Tk-Tq+i."""
    offset = t_key - t_query
    return torch.ones(t_query, t_key, dtype=torch.bool, device=device).tril(diagonal=offset)


class SegmentMask(NamedTuple):
    """Attention within packed rows: a token sees only its own sentence's tokens (the earlier ones where causal).

    Kept as data rather than a (B, 1, Tq, Tk) tensor, so that on CUDA the varlen flash kernel can take the
    cumulative lengths instead; everywhere else `dense()` is the block-diagonal boolean mask.
    """

    q: Tensor  # (B, Tq) sentence ids of the queries' row positions: 1, 1, 2, 2, 2, ..., 0 on padding
    k: Tensor  # (B, Tk) the keys'
    causal: bool = False
    cu_q: Tensor | None = None  # (N + 1,) int32: sentence starts over the flattened rows (each row's padding one)
    cu_k: Tensor | None = None  # (N + 1,) int32
    max_q: int = 0  # the longest of those query / key sequences
    max_k: int = 0

    def dense(self) -> Tensor:
        """(B, 1, Tq, Tk) boolean; a padding query (id 0) sees the whole row, so no softmax row is empty (its
        output is never used and gets no gradient)."""
        mask = (self.q[:, :, None] == self.k[:, None, :]) | (self.q == 0)[:, :, None]  # (B, Tq, Tk)
        if self.causal:  # a sentence's tokens are contiguous: the row's causal mask is each sentence's
            mask = mask & causal_mask(self.q.size(1), self.k.size(1), device=self.q.device)
        return mask[:, None]  # (B, 1, Tq, Tk)


class Packing(NamedTuple):
    """Sentences concatenated into rows (no padding between them): each token's sentence and position in it.

    Row r of src holds the sources of the same sentences, in the same order, as row r of tgt holds their targets;
    sentence ids count from 1 in each row, 0 is the padding at a row's end.
    """

    src_segments: Tensor  # (B, S) long
    tgt_segments: Tensor  # (B, T) long
    src_positions: Tensor  # (B, S) long: 0, 1, ... restarting at each sentence (3.5: positions are per sentence)
    tgt_positions: Tensor  # (B, T) long
    cu_src: Tensor | None = None  # (N + 1,) int32 for the varlen kernel: sentence starts, each row's padding one
    cu_tgt: Tensor | None = None
    max_src: int = 0
    max_tgt: int = 0

    def encoder_mask(self) -> SegmentMask:
        return SegmentMask(
            self.src_segments, self.src_segments, False, self.cu_src, self.cu_src, self.max_src, self.max_src
        )

    def decoder_mask(self) -> SegmentMask:
        return SegmentMask(
            self.tgt_segments, self.tgt_segments, True, self.cu_tgt, self.cu_tgt, self.max_tgt, self.max_tgt
        )

    def cross_mask(self) -> SegmentMask:
        return SegmentMask(
            self.tgt_segments, self.src_segments, False, self.cu_tgt, self.cu_src, self.max_tgt, self.max_src
        )

    def map(self, fn) -> Packing:
        """The same packing with `fn` applied to each tensor (to a device, into pinned memory)."""
        return Packing(*(fn(x) if isinstance(x, Tensor) else x for x in self))


def sinusoidal_table(n_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), as (n_positions, d_model)."""
    # layout="halves" puts sine i at dimension i and cosine i at d/2 + i instead: Marian's table.
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    # 10000^(-2i/d) computed in log space: exp(-2i * ln(10000) / d)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    sin, cos = torch.sin(position * inv_freq), torch.cos(position * inv_freq)  # (P, D/2) each
    if layout == "halves":
        return torch.cat([sin, cos], dim=1).float()  # (P, D)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = sin
    table[:, 1::2] = cos
    return table.float()


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout (Srivastava et al., 2014): zero each element with probability p, scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    # On a CPU the random numbers, not the arithmetic, are the cost: 16 random bits per element, two to each
    # 32-bit draw, make this ~2.5x faster than F.dropout (docs/performance.md). P(keep) = 1 - p to 1/65536.
    n = x.numel()
    bits = torch.empty((n + 1) // 2, dtype=torch.int32).random_(-(2**31), 2**31).view(torch.int16)[:n]
    keep = bits.view(x.shape) >= round(p * 65536) - 32768
    return x * keep * (1.0 / (1.0 - p))


class Dropout(nn.Module):
    """`dropout` as a module, active in train mode only."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


# ---------------------------------------------------------------------------------------------------------
# Attention.
# ---------------------------------------------------------------------------------------------------------


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, mask: SegmentMask) -> Tensor:
    """Attention over packed rows by CUDA's varlen flash kernel: (B, H, T, K) in and out, no (T, T) mask."""
    b, h, t, kd = q.shape

    def flat(x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(-1, h, kd)  # (B * T, H, K): the rows one after another

    window = (-1, 0) if mask.causal else (-1, -1)
    out = varlen_kernel()(flat(q), flat(k), flat(v), mask.cu_q, mask.cu_k, mask.max_q, mask.max_k, window_size=window)
    return out.view(b, t, h, kd).transpose(1, 2)  # (B, H, T, K)


def use_varlen(q: Tensor, mask: SegmentMask, dropout_p: float, need_weights: bool) -> bool:
    """Whether the varlen kernel can run this: CUDA, half precision, cumulative lengths given, no dropout/weights."""
    half = q.dtype in (torch.float16, torch.bfloat16)
    return (
        q.is_cuda
        and half
        and mask.cu_q is not None
        and not need_weights
        and not dropout_p
        and varlen_kernel() is not None
    )


FEW_QUERIES = 16  # up to this many queries and no gradients, CPU attention is two matmuls (see `attention`)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | SegmentMask | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """3.2.1: softmax(Q K^T / sqrt(K)) V on (B, H, T, K) tensors; the weights only when asked for."""
    if isinstance(mask, SegmentMask):  # packed rows
        if use_varlen(q, mask, dropout_p, need_weights):
            return varlen_attention(q, k, v, mask), None
        mask = mask.dense()
    if is_causal and (mask is not None or q.size(-2) != k.size(-2)):
        # SDPA's own causal mask is aligned top-left when Tq != Tk; ours aligns the last query with the
        # last key (cached decoding) and is combined with `mask` rather than replacing it.
        causal = causal_mask(q.size(-2), k.size(-2), device=q.device)
        mask, is_causal = (causal if mask is None else mask & causal), False
    # PyTorch's fused CPU kernel is ~7x slower than two matmuls in bf16 at sentence lengths (fwd+bwd, T=32;
    # docs/performance.md), and slower in float32 too for a few queries without gradients (a decoding step's one
    # position, a sentence's beams on the query axis, a short sentence): there the CPU takes the explicit path.
    cpu = q.device.type == "cpu"
    # Gradients first: under torch.compile a comparison of sizes is a guard, which recompiles a training step.
    few_queries = cpu and not torch.is_grad_enabled() and q.size(-2) <= FEW_QUERIES
    fused = not need_weights and not (cpu and q.dtype == torch.bfloat16) and not few_queries
    if fused:
        # Same numbers, no (T, S) weight matrix kept for backward.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, Tq, Tk)
    if is_causal:
        mask = causal_mask(q.size(-2), k.size(-2), device=q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    out = dropout(weights, dropout_p) @ v  # (B, H, Tq, K)
    return out, weights if need_weights else None


def write_kv(buffer: Tensor, new: Tensor, start: int) -> Tensor:
    """Write new (B, H, T, K) keys or values at positions start.. of a (B, H, capacity, K) buffer; grow if full."""
    end = start + new.size(2)
    if end > buffer.size(2):  # double the capacity: amortized O(1) copies per position
        grown = buffer.new_zeros(*buffer.shape[:2], max(end, 2 * buffer.size(2)), buffer.size(3))
        grown[:, :, :start] = buffer[:, :, :start]
        buffer = grown
    buffer[:, :, start:end] = new
    return buffer


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, H, T, K)."""
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, K)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, K) -> (B, T, D)."""
    b, h, t, k = x.shape
    return x.transpose(1, 2).reshape(b, t, h * k)  # (B, T, D)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection; optional past keys/values."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout_p = cfg.attention_dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        past: tuple[Tensor, Tensor, int] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, tuple[Tensor, Tensor]]:
        """x (B, T, D) -> output (B, T, D), weights (B, H, T, T_total) or None, keys/values (with past: buffers)."""
        # `past` is (key buffer, value buffer, positions filled): the new keys/values are written in place
        # after them, so a decoding step copies one position rather than the whole history (as torch.cat would).
        q, k, v = (split_heads(z, self.n_heads) for z in self.qkv(x).chunk(3, dim=-1))  # 3 x (B, H, T, K)
        if past is not None:
            k_buffer, v_buffer, start = past
            k_buffer, v_buffer = write_kv(k_buffer, k, start), write_kv(v_buffer, v, start)
            end = start + x.size(1)
            k, v = k_buffer[:, :, :end], v_buffer[:, :, :end]  # (B, H, T_past + T, K) views
        dropout_p = self.dropout_p if self.training else 0.0
        y, weights = attention(q, k, v, mask, is_causal, dropout_p, need_weights)
        return self.out(merge_heads(y)), weights, (k, v) if past is None else (k_buffer, v_buffer)


class CrossAttention(nn.Module):
    """Multi-head attention from the decoder to the encoder memory; keys/values computed once per sentence."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout_p = cfg.attention_dropout
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (B, S, D) -> keys, values (B, H, S, K)."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def forward(
        self, x: Tensor, kv: tuple[Tensor, Tensor], mask: Tensor, need_weights: bool = False, beams: int = 1
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) -> output (B, T, D), weights (B, H, T, S) or None.

        beams > 1: x holds one new position of `beams` consecutive rows per sentence, and kv and mask one row per
        sentence: the beams' queries share their sentence's keys and values, which are then read once, not once
        a beam (CTranslate2 does the same).
        """
        b, t, d = x.shape
        if beams > 1:
            x = x.view(b // beams, beams * t, d)  # (N, k, D): the beams on the query axis
        q = split_heads(self.q(x), self.n_heads)  # (B, H, T, K)
        dropout_p = self.dropout_p if self.training else 0.0
        y, weights = attention(q, kv[0], kv[1], mask, False, dropout_p, need_weights)
        y = merge_heads(y)
        if beams > 1:
            y = y.reshape(b, t, d)  # (B, 1, D)
            if weights is not None:
                weights = weights.transpose(1, 2).reshape(b, t, *weights.shape[1::2]).transpose(1, 2)  # (B, H, 1, S)
        return self.out(y), weights


# ---------------------------------------------------------------------------------------------------------
# Layers.
# ---------------------------------------------------------------------------------------------------------


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, fused: bool = True) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension, with nn.LayerNorm's numerics."""
    if fused:  # PyTorch's kernel of the formula below: one pass over x instead of nine (17% of a training step)
        return F.layer_norm(x, weight.shape, weight, bias, eps)
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased variance, as nn.LayerNorm
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


class LayerNorm(nn.Module):
    """Layer normalization (Ba et al., 2016) over the last dimension, with learned gain and bias."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


ACTIVATION_FNS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """3.3: FFN(x) = W2 act(W1 x + b1) + b2, applied at every position."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = ACTIVATION_FNS[cfg.activation]
        self.dropout = Dropout(cfg.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(self.act(self.w1(x))))


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in dropout + residual + LayerNorm (pre- or post-norm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = SelfAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if self.norm_first:
            h, weights, _ = self.self_attn(self.norm1(x), mask, need_weights=need_weights)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:  # 5.4: dropout on each sub-layer's output before it is added and normalized
            h, weights, _ = self.self_attn(x, mask, need_weights=need_weights)
            x = self.norm1(x + self.dropout(h))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x, weights


def select_filled(buffer: Tensor, index: Tensor, filled: int) -> Tensor:
    """Rows `index` of a (B, H, capacity, K) key or value buffer, its first `filled` positions copied into a new
    buffer with room for one more: a beam search reorders its cache every step, and copying the whole capacity
    (up to twice the filled positions, as it doubles) then growing it again took twice the time."""
    if buffer.requires_grad:  # out= records no gradient: a cache built with autograd on is copied whole
        return buffer.index_select(0, index)
    out = buffer.new_empty(index.numel(), buffer.size(1), filled + 1, buffer.size(3))  # (B', H, filled + 1, K)
    torch.index_select(buffer[:, :, :filled], 0, index, out=out[:, :, :filled])
    return out


@dataclass(frozen=True)
class LayerCache:
    """One decoder layer's keys/values: self-attention fills a step per call, cross-attention is fixed."""

    self_k: Tensor  # (B, H, capacity, K): positions < DecoderCache.length are filled
    self_v: Tensor  # (B, H, capacity, K)
    cross_k: Tensor  # (N, H, S, K): one row per sentence, N = B / DecoderCache.beams
    cross_v: Tensor  # (N, H, S, K)


@dataclass(frozen=True)
class DecoderCache:
    """The decoder's state between incremental steps: one LayerCache per layer and the positions so far."""

    # `decode` writes new positions into these buffers in place and returns a cache over the same buffers:
    # continue from a cache once, since a second continuation overwrites the first one's positions
    # (`index_select` makes an independent copy, as beam search needs).

    layers: tuple[LayerCache, ...]
    length: int
    beams: int = 1  # consecutive rows per sentence (a beam search's beams), sharing its cross-attention K/V

    def index_select(self, index: Tensor, cross: bool = True, sentences: Tensor | None = None) -> DecoderCache:
        """Keep/reorder batch rows; the cross-attention K/V follow `sentences` where given (beams > 1: one row a
        sentence), else the rows when cross (beams == 1), else stay as they are (every row keeps its source)."""
        layers = []
        for c in self.layers:
            self_kv = (select_filled(c.self_k, index, self.length), select_filled(c.self_v, index, self.length))
            pick = sentences if sentences is not None else index if cross else None
            cross_kv = (c.cross_k, c.cross_v)
            if pick is not None:  # index_select: 2.5x as fast as indexing (x[pick]) on these rows
                cross_kv = (c.cross_k.index_select(0, pick), c.cross_v.index_select(0, pick))
            layers.append(LayerCache(*self_kv, *cross_kv))
        return DecoderCache(tuple(layers), self.length, self.beams)

    def expand(self, beams: int) -> DecoderCache:
        """Each row copied to `beams` consecutive rows (a beam search after its first step), cross K/V shared."""
        if not self.layers:  # a decoder without layers keeps nothing
            return DecoderCache((), self.length, beams)
        rows = torch.arange(self.layers[0].self_k.size(0), device=self.layers[0].self_k.device)
        cache = self.index_select(rows.repeat_interleave(beams), cross=False)
        return DecoderCache(cache.layers, cache.length, beams)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, FFN; each with residual + LayerNorm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_first = cfg.norm_first
        self.self_attn = SelfAttention(cfg)
        self.cross_attn = CrossAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.norm3 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self,
        x: Tensor,
        cross_kv: tuple[Tensor, Tensor],
        src_mask: Tensor,
        past: tuple[Tensor, Tensor, int] | None = None,
        need_weights: bool = False,
        beams: int = 1,
        packed_mask: SegmentMask | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None, Tensor | None]:
        """x (B, T, D) -> (x, self keys/values (with past: the cache buffers), self weights, cross weights);
        beams: rows per sentence of cross_kv and src_mask (CrossAttention); packed_mask: packed rows' self-mask."""
        t_new = x.size(1)
        t_total = t_new + (0 if past is None else past[2])
        # No past: the fused kernel's built-in causal mask. One new token sees everything before it. Decided by an
        # `if`: under torch.compile's dynamic shapes `t_new > 1` is a SymBool, which SDPA's is_causal rejects (a graph
        # break in every decoder layer); a branch makes it a guard and a plain bool.
        is_causal = False
        if past is None and t_new > 1:
            is_causal = True
        self_mask = causal_mask(t_new, t_total, x.device) if past is not None and t_new > 1 else None
        if packed_mask is not None:  # causal within each sentence of the row
            is_causal, self_mask = False, packed_mask
        if self.norm_first:
            h, self_w, kv = self.self_attn(self.norm1(x), self_mask, is_causal, past, need_weights)
            x = x + self.dropout(h)
            h, cross_w = self.cross_attn(self.norm2(x), cross_kv, src_mask, need_weights, beams)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.norm3(x)))
        else:
            h, self_w, kv = self.self_attn(x, self_mask, is_causal, past, need_weights)
            x = self.norm1(x + self.dropout(h))
            h, cross_w = self.cross_attn(x, cross_kv, src_mask, need_weights, beams)
            x = self.norm2(x + self.dropout(h))
            x = self.norm3(x + self.dropout(self.ffn(x)))
        return x, kv, self_w, cross_w


# ---------------------------------------------------------------------------------------------------------
# The model.
# ---------------------------------------------------------------------------------------------------------


class Encoded(NamedTuple):
    """What the encoder hands the decoder."""

    memory: Tensor  # (B, S, D)
    src_mask: Tensor  # (B, 1, 1, S)
    attention: list[Tensor] | None = None  # per layer (B, H, S, S)


class DecoderOutput(NamedTuple):
    """Logits for the new target positions, the updated cache, and attention weights when asked for."""

    logits: Tensor  # (B, T, V)
    cache: DecoderCache | None
    self_attention: list[Tensor] | None = None  # per layer (B, H, T, T_total)
    cross_attention: list[Tensor] | None = None  # per layer (B, H, T, S)


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) (3.4) plus positional encoding (3.5), then dropout."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, tokens: nn.Embedding | None = None):
        super().__init__()
        self.scale = math.sqrt(cfg.d_model)
        self.max_positions = cfg.max_positions
        # padding_idx: the pad row learns nothing from its lookups, as in fairseq and transformers; it matters where
        # the pad id is also the decoder's first input (Marian's models start from it).
        self.tokens = tokens if tokens is not None else nn.Embedding(padded(vocab_size, cfg), cfg.d_model, cfg.pad_id)
        if cfg.positional == "learned":
            self.positions = nn.Embedding(cfg.max_positions, cfg.d_model)
        else:
            self.positions = None
            # Not persistent: a formula, not a weight; it never goes into a checkpoint.
            table = sinusoidal_table(cfg.max_positions, cfg.d_model, cfg.sinusoidal_layout)
            self.register_buffer("table", table, persistent=False)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """(B, T) ids at positions start..start+T-1, or at `positions` (B, T) (packed rows) -> (B, T, D)."""
        if positions is not None:  # per sentence: below max_positions, as binarizing caps lengths (no sync here)
            pos = self.positions(positions) if self.positions is not None else self.table[positions]  # (B, T, D)
            return self.dropout(self.tokens(ids) * self.scale + pos)
        end = start + ids.size(1)
        if end > self.max_positions:
            raise ValueError(f"sequence of {end} positions exceeds max_positions={self.max_positions}")
        if self.positions is not None:
            pos = self.positions.weight[start:end]
        else:
            pos = self.table[start:end]
        return self.dropout(self.tokens(ids) * self.scale + pos)  # (B, T, D)


class SkipInit(TorchFunctionMode):
    """Within it, torch.nn.init's functions and Tensor.uniform_ leave their tensor as it is: PyTorch's layers
    initialize themselves in their constructors, which a model whose weights are loaded next need not pay for
    (0.05 s of a translation's start-up for the Multi30k model). A mode, not a patch: it holds in this thread only."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func is torch.Tensor.uniform_:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


class Transformer(nn.Module):
    """Encoder-decoder Transformer: `model(src, tgt)` gives next-token logits (B, T, V) for every position."""

    def __init__(self, cfg: ModelConfig, init: bool = True):
        """`init=False` draws no weights (the layers' matrices are left as allocated): for a model whose weights
        are all loaded next (the checkpoint loader checks that none is missing)."""
        super().__init__()
        self.cfg = cfg
        with contextlib.nullcontext() if init else SkipInit():
            self.src_embed = Embedding(cfg, cfg.src_vocab_size)
            shared = self.src_embed.tokens if cfg.share_embeddings else None
            self.tgt_embed = Embedding(cfg, cfg.tgt_vocab_size, tokens=shared)
            self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
            self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
            # Pre-norm leaves the residual stream unnormalized, so each stack ends with a LayerNorm.
            self.encoder_norm = LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
            self.decoder_norm = LayerNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.norm_first else nn.Identity()
            self.output = nn.Linear(cfg.d_model, padded(cfg.tgt_vocab_size, cfg), bias=cfg.output_bias)
        if init:
            self.reset_parameters()
        if cfg.tie_output:  # 3.4: the pre-softmax projection shares the target embedding matrix
            self.output.weight = self.tgt_embed.tokens.weight
        if cfg.output_bias:  # Marian's final_logits_bias: a constant of the model (a buffer in transformers)
            self.output.bias.requires_grad_(False)
        if not cfg.restrict_output:
            self.output_mask = None  # every target id is scored
        else:
            # Which target ids the output scores, saved with the weights (all until `set_output_vocab`); the
            # kept ids (K,) and each id's position among them (V,) are derived from it.
            v = cfg.tgt_vocab_size
            self.register_buffer("output_mask", torch.ones(v, dtype=torch.bool))
            self.register_buffer("output_ids", torch.arange(v), persistent=False)
            self.register_buffer("output_index", torch.arange(v), persistent=False)
            self.register_load_state_dict_post_hook(_derive_output_vocab)

    def reset_parameters(self) -> None:
        """Xavier-uniform matrices, zero biases, N(0, D^-1/2) embeddings (scaled by sqrt(D)); or N(0, init_std)."""
        std = self.cfg.init_std
        # Fused Q/K/V and K/V projections are initialized as the separate D x D matrices they stand for.
        fused = {m.qkv for m in self.modules() if isinstance(m, SelfAttention)}
        fused |= {m.kv for m in self.modules() if isinstance(m, CrossAttention)}
        for module in self.modules():
            if isinstance(module, nn.Linear):
                w = module.weight.data
                for chunk in w.split(self.cfg.d_model, dim=0) if module in fused else (w,):
                    nn.init.xavier_uniform_(chunk) if std is None else nn.init.normal_(chunk, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=self.cfg.d_model**-0.5 if std is None else std)

    @torch.no_grad()
    def set_output_vocab(self, ids: Tensor) -> None:
        """Score only these target ids, and pad_id: the position that `output_targets` gives ids never scored."""
        if self.output_mask is None:
            raise ValueError("set_output_vocab needs a model built with restrict_output=True")
        mask = torch.zeros_like(self.output_mask)
        mask[ids.to(mask.device, torch.long)] = True
        mask[self.cfg.pad_id] = True
        self.output_mask.copy_(mask)
        _derive_output_vocab(self)

    @property
    def pruned(self) -> bool:
        """Whether the output projection holds only the kept rows (a `prune_output` copy for decoding)."""
        return self.output_mask is not None and self.output.out_features != padded(self.cfg.tgt_vocab_size, self.cfg)

    def output_targets(self, tgt: Tensor) -> Tensor:
        """Target ids -> their positions in `logits(..., restricted=True)`; unscored ids become `output_pad`."""
        return tgt if self.output_mask is None else self.output_index[tgt]

    @property
    def output_pad(self) -> int:
        """The position of padding in `output_targets`: the loss skips it."""
        return self.cfg.pad_id if self.output_mask is None else int(self.output_index[self.cfg.pad_id])

    def logits(self, h: Tensor, restricted: bool = False) -> Tensor:
        """h (B, T, D) -> logits (B, T, V), -inf at ids the output does not score; restricted: (B, T, K) only."""
        v = self.cfg.tgt_vocab_size
        if self.output_mask is None:
            return self.output(h)[..., :v]  # (B, T, V): the rows past V only pad the matmul (vocab_multiple)
        if not self.pruned:  # the whole (tied) projection, as trained and saved
            if restricted:  # training: the K kept rows of the projection, a smaller matmul and softmax
                return F.linear(h, self.output.weight[self.output_ids])  # (B, T, K)
            return self.output(h)[..., :v].masked_fill(~self.output_mask, float("-inf"))  # (B, T, V)
        kept = self.output(h)  # a `prune_output` copy for decoding: the projection is the kept rows  # (B, T, K)
        if restricted:
            return kept
        # Decoding picks ids, not positions among the kept ones: the K scores go to their ids in a row of -inf.
        return kept.new_full((*kept.shape[:-1], v), float("-inf")).index_copy_(-1, self.output_ids, kept)  # (B, T, V)

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters())

    def encode(self, src: Tensor, need_weights: bool = False, packing: Packing | None = None) -> Encoded:
        """src (B, S) ids -> memory (B, S, D) and the source padding mask (packed rows: their SegmentMask)."""
        if packing is None:
            src_mask, x = padding_mask(src, self.cfg.pad_id), self.src_embed(src)
        else:
            src_mask, x = packing.encoder_mask(), self.src_embed(src, positions=packing.src_positions)
        weights = [] if need_weights else None
        for layer in self.encoder:
            x, w = layer(x, src_mask, need_weights)
            if need_weights:
                weights.append(w)
        return Encoded(self.encoder_norm(x), src_mask, weights)

    def init_cache(self, enc: Encoded, capacity: int = 0) -> DecoderCache:
        """An empty cache with room for `capacity` target positions (grown if exceeded) and the cross-attention K/V."""
        b, _, d = enc.memory.shape
        h = self.cfg.n_heads
        capacity = min(capacity, self.cfg.max_positions)
        layers = tuple(
            LayerCache(
                # Zeros, not new_empty: unfilled positions are never attended to, but index_select copies them
                # and uninitialized memory may hold NaNs that make equality checks fail.
                enc.memory.new_zeros(b, h, capacity, d // h),  # (B, H, capacity, K)
                enc.memory.new_zeros(b, h, capacity, d // h),
                # Contiguous: every decoding step reads them, and the explicit attention path's matmuls would copy
                # a strided view each time (a teacher-forced forward reads them once, as they are).
                *(kv.contiguous() for kv in layer.cross_attn.memory_kv(enc.memory)),
            )
            for layer in self.decoder
        )
        return DecoderCache(layers, 0)

    def decode(
        self,
        tgt: Tensor,
        enc: Encoded,
        cache: DecoderCache | None = None,
        need_weights: bool = False,
        restricted: bool = False,
        packing: Packing | None = None,
    ) -> DecoderOutput:
        """tgt (B, T) ids -> logits (B, T, V) (see `logits`). With a cache, tgt holds only the tokens after it.
        With `packing` (teacher forcing only), rows of concatenated sentences, as `encode` was given."""
        start = 0 if cache is None else cache.length
        self_mask, src_mask = None, enc.src_mask
        if packing is None:
            x = self.tgt_embed(tgt, start)
        else:
            if cache is not None:
                raise ValueError("packed rows are for teacher forcing: decode them without a cache")
            x = self.tgt_embed(tgt, positions=packing.tgt_positions)
            self_mask, src_mask = packing.decoder_mask(), packing.cross_mask()
        new_layers = []
        self_ws, cross_ws = ([], []) if need_weights else (None, None)
        for i, layer in enumerate(self.decoder):
            if cache is None:
                past, cross_kv = None, layer.cross_attn.memory_kv(enc.memory)
            else:
                c = cache.layers[i]
                past, cross_kv = (c.self_k, c.self_v, start), (c.cross_k, c.cross_v)
            beams = 1 if cache is None else cache.beams
            x, (k, v), self_w, cross_w = layer(x, cross_kv, src_mask, past, need_weights, beams, self_mask)
            if cache is not None:
                new_layers.append(LayerCache(k, v, *cross_kv))
            if need_weights:
                self_ws.append(self_w)
                cross_ws.append(cross_w)
        logits = self.logits(self.decoder_norm(x), restricted)  # (B, T, V), or (B, T, K) restricted
        new_cache = None if cache is None else DecoderCache(tuple(new_layers), start + tgt.size(1), cache.beams)
        return DecoderOutput(logits, new_cache, self_ws, cross_ws)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        need_weights: bool = False,
        restricted: bool = False,
        packing: Packing | None = None,
    ):
        """Teacher-forced logits (B, T, V); with need_weights, also a dict of per-layer attention weights.
        With `packing`, src and tgt are rows of concatenated sentences (training/data.py's `pack`)."""
        enc = self.encode(src, need_weights, packing)
        out = self.decode(tgt, enc, need_weights=need_weights, restricted=restricted, packing=packing)
        if not need_weights:
            return out.logits
        return out.logits, {
            "encoder": enc.attention,
            "decoder": out.self_attention,
            "cross": out.cross_attention,
        }


def padded(vocab_size: int, cfg: ModelConfig) -> int:
    """Rows of an embedding or output matrix for `vocab_size` ids: rounded up to a multiple of `vocab_multiple`."""
    return -(-vocab_size // cfg.vocab_multiple) * cfg.vocab_multiple


@torch.no_grad()
def prune_output(model: Transformer, copy_model: bool = True) -> Transformer:
    """For decoding: a model whose output projection holds only the kept rows (K, D); other models as they are.
    A copy unless `copy_model` is False (a model loaded for decoding alone, pruned in place)."""
    # Training needs the whole tied matrix (the embedding's gradient); decoding only the kept rows, and a
    # smaller matmul at every step. A copy by default, so that the model it came from stays trainable and saveable.
    if model.output_mask is None or bool(model.output_mask.all()):
        return model
    pruned = copy.deepcopy(model) if copy_model else model
    rows = pruned.output.weight[pruned.output_ids].clone()  # (K, D)
    pruned.output = nn.Linear(rows.size(1), rows.size(0), bias=False, device=rows.device, dtype=rows.dtype)
    pruned.output.weight = nn.Parameter(rows, requires_grad=False)  # untied: the embedding keeps all V rows
    return pruned


@torch.no_grad()
def _derive_output_vocab(model: Transformer, _incompatible_keys=None) -> None:
    """Recompute the kept ids and each id's position from `output_mask` (after loading or setting it)."""
    ids = model.output_mask.nonzero().squeeze(1)  # (K,)
    index = torch.zeros_like(model.output_index)
    index[ids] = torch.arange(len(ids), device=ids.device)
    unscored = ~model.output_mask
    # Unscored ids -> padding's position, which the loss skips (a copy: CUDA refuses a write from a view of itself).
    index[unscored] = index[model.cfg.pad_id].clone()
    model.output_ids, model.output_index = ids, index
