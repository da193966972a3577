"""Ancestral sampling (temperature, top-k, nucleus top-p): one draw a sentence from a generator of its own, never
torch's global RNG, so that a seed gives one output for one batch (a sentence's draw depends on its batch mates)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.model import Transformer
from nanomt.decoding.steps import Hypothesis, Targets, check_src, generate


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus sampling (Holtzman et al., 2020): keep the fewest most probable tokens with mass >= top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (R, V)
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p; the most probable one always stays.
    drop = probs.cumsum(dim=-1) - probs >= top_p  # (R, V)
    return logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)


def sampler(sampling: Sampling, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
    """A `pick` that samples from the tempered, top-k and top-p filtered distribution."""

    def pick(logits: Tensor) -> Tensor:
        logits = logits / sampling.temperature  # (R, V)
        if 0 < sampling.top_k < logits.size(-1):
            kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]  # (R, 1)
            logits = logits.masked_fill(logits < kth, -math.inf)
        if sampling.top_p < 1.0:
            logits = top_p_filter(logits, sampling.top_p)
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (R,)

    return pick


@torch.inference_mode()
def sample(
    model: Transformer, src: Tensor, decoding: Decoding, targets: Targets | None = None
) -> list[list[Hypothesis]]:
    """One draw a sentence from `decoding.sampling` (plain ancestral sampling where None), scores 0."""
    check_src(src)
    if src.size(0) == 0:
        return []
    sampling = decoding.sampling or Sampling()
    generator = torch.Generator(device=src.device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    # Over all V ids, -inf where a restricted model does not score: the draws a seed gives stay what they were.
    return generate(model, src, decoding, targets or Targets(), sampler(sampling, generator), kept_only=False)
