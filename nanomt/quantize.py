"""int8 CPU inference: every nn.Linear gets int8 weights and dynamically quantized int8 activations."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from nanomt.model import Transformer


def quantize_int8(model: Transformer) -> Transformer:
    """A copy of `model` for CPU inference with int8 linear layers (weights per channel, activations per batch)."""
    # Activations get one scale per tensor, computed on the fly: a sentence's numbers then depend slightly on
    # the sentences batched with it, which float32 decoding does not do.
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("int8 inference runs on the CPU only: load the model with device='cpu'")
    # Embeddings, LayerNorms and attention stay float32; the matrices (~90% of the decoder's FLOPs per step,
    # the output projection included) become int8 x int8 -> int32 through FBGEMM. torch.ao's eager-mode API
    # is deprecated in favour of torchao, which needs torch.compile on a CPU; this one runs as it is.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(torch\.ao\.quantization|quantize_per_).*deprecated")
        try:
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError as e:
            raise ValueError(f"int8 needs torch.ao.quantization, which this torch lacks ({e})") from e

        # Per-channel: one weight scale per output row rather than one per matrix (a rare large weight in one
        # row then costs that row's precision only).
        quantized = copy.deepcopy(model).eval()
        quantize_dynamic(quantized, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    return quantized


def is_quantized(model: nn.Module) -> bool:
    """Whether any linear layer of `model` is a dynamically quantized one."""
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
