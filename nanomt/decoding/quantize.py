"""int8 CPU inference: every nn.Linear an int8 x int8 -> int32 product, scaled per weight row and per input row."""

from __future__ import annotations

import copy
import functools

import torch
from torch import Tensor, nn

# Each input row is rounded to integers in [-LEVELS, LEVELS] times its own step (max |x| / LEVELS), as CTranslate2
# does: a row's numbers then never depend on the rows batched with it. 63, not 127: oneDNN's int8 kernels on CPUs
# without VNNI add pairs of u8 x s8 products in 16 bits, which saturate for codes above 127 (wrong sums, no error),
# and one code range everywhere gives every machine the same translations.
LEVELS = 63
ZERO = LEVELS + 1  # qlinear takes unsigned codes: code + ZERO lies in [1, 2 * LEVELS + 1]
WEIGHT_LEVELS = 127
# Two kernels, to the same bits: oneDNN's qlinear (weights packed once) costs ~25 us a call before any work;
# torch._int_mm (oneDNN's matmul made at each call, weights as they are) ~4 us, but reorders the weights at every
# call and runs only on CPUs with AVX512-VNNI (elsewhere it is a scalar loop). So _int_mm takes the calls of up to
# INT_MM_MAX_ROWS rows (a sentence's beams, the last sentences of a batch) into layers of up to INT_MM_MAX_WEIGHTS
# weights; qlinear the rest (benchmarks/results/int8_rows.json).
INT_MM_MAX_ROWS = 64
INT_MM_MAX_WEIGHTS = 1 << 20


@functools.cache
def has_avx512_vnni() -> bool:
    """Whether torch._int_mm runs on oneDNN here: on a CPU without AVX512-VNNI it is a scalar loop."""
    return bool(torch.cpu.get_capabilities().get("avx512_vnni", False))


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., K) float -> codes (..., K) int8 in [-LEVELS, LEVELS], and each row's max |x| (..., 1)."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)  # (..., 1); an all-zero row codes to 0
    codes = (x * (LEVELS / amax)).round_().to(torch.int8)  # (..., K); x ~ codes * amax / LEVELS
    return codes, amax


class Int8Linear(nn.Module):
    """y = x W^T + b from int8 codes: W per output channel, x per row, int32 sums (oneDNN)."""

    def __init__(self, weight_int8: Tensor, weight_scale: Tensor, bias: Tensor | None, int_mm_rows: int | None = None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)  # (N, K) int8: W ~ weight_scale * weight_int8
        self.register_buffer("weight_scale", weight_scale)  # (N,) float32
        self.register_buffer("bias", bias)  # (N,) float32 or None
        # The kernels' output scale: one code step of the input (max |x| / LEVELS) is applied after them.
        self.register_buffer("code_scale", weight_scale / LEVELS, persistent=False)  # (N,)
        self.register_buffer("weight_zero", torch.zeros_like(weight_scale, dtype=torch.long), persistent=False)
        if int_mm_rows is None:  # calls of up to this many rows go to torch._int_mm, larger ones to qlinear
            fits = has_avx512_vnni() and weight_int8.numel() <= INT_MM_MAX_WEIGHTS
            int_mm_rows = INT_MM_MAX_ROWS if fits else 0
        self.int_mm_rows = int_mm_rows
        # torch._int_mm's right operand, (K, N) contiguous (~1.3x a transposed view at 2048 x 512), and oneDNN's
        # packed weights (an opaque tensor: neither a buffer nor copyable).
        self.weight_t = weight_int8.t().contiguous() if int_mm_rows > 0 else None
        try:
            self.packed = torch.ops.onednn.qlinear_prepack(weight_int8, None)
        except (AttributeError, RuntimeError) as e:
            raise ValueError(f"int8 needs oneDNN's int8 kernels, which this torch lacks ({e})") from e

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        """Round each row of `linear`'s weight to [-127, 127] times its own scale (max |row| / 127)."""
        w = linear.weight.detach().float()  # (N, K)
        scale = w.abs().amax(dim=1).clamp_min(1e-30) / WEIGHT_LEVELS  # (N,)
        codes = torch.round(w / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8)  # (N, K)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(codes, scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N) float32."""
        codes, amax = quantize_rows(x.float())  # (..., K), (..., 1)
        # Both kernels give sum_k code * weight_int8 * code_scale, to the same bits.
        if 0 < codes.numel() <= self.int_mm_rows * self.in_features:
            y = torch._int_mm(codes.reshape(-1, self.in_features), self.weight_t) * self.code_scale  # (R, N)
            y = y.view(*x.shape[:-1], self.out_features)
        else:
            args = (self.packed, self.code_scale, self.weight_zero, None, 1.0, 0, torch.float32, "none", [], "")
            y = torch.ops.onednn.qlinear_pointwise((codes + ZERO).view(torch.uint8), 1.0, ZERO, *args)  # (..., N)
        y.mul_(amax)
        return y if self.bias is None else y.add_(self.bias)

    def __deepcopy__(self, memo: dict) -> Int8Linear:
        """A copy packs its own weights (oneDNN's packed tensor has no storage to copy)."""
        tensors = (copy.deepcopy(t, memo) for t in (self.weight_int8, self.weight_scale, self.bias))
        return Int8Linear(*tensors, self.int_mm_rows).train(self.training)

    def extra_repr(self) -> str:
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, bias={self.bias is not None}, int_mm_rows={self.int_mm_rows}"


def quantize_int8(model: nn.Module, copy_model: bool = True) -> nn.Module:
    """A copy of `model` for CPU inference with every nn.Linear an Int8Linear (the output projection too); with
    `copy_model` False, `model` itself (a model loaded for decoding alone: no second copy of its weights)."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 inference runs on the CPU only: load the model with device='cpu'")
    if type(model) is nn.Linear:
        return Int8Linear.from_float(model)
    # Embeddings, LayerNorms and attention stay float32; the matrices (~90% of the decoder's FLOPs per step)
    # become int8.
    quantized = (copy.deepcopy(model) if copy_model else model).eval()
    linears = [(name, m) for name, m in quantized.named_modules() if type(m) is nn.Linear]
    for name, linear in linears:
        parent, _, attr = name.rpartition(".")
        setattr(quantized.get_submodule(parent), attr, Int8Linear.from_float(linear))
    return quantized


def is_quantized(model: nn.Module) -> bool:
    """Whether any linear layer of `model` is an Int8Linear."""
    return any(isinstance(m, Int8Linear) for m in model.modules())
