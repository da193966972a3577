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
    # Drop a token when the tokens ranked above it already reach top_p.
    drop = probs.cumsum(dim=-1) - probs >= top_p  # (R, V)
    # The most probable one always stays: a top_p below float32's range (1e-300) compares as 0, and 0 >= 0.
    drop[:, 0] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)


def with_a_choice(logits: Tensor) -> Tensor:
    """`logits` where a row that allows no id (all -inf) allows the first, greedy's pick there, instead."""
    # A forced prefix id that a restricted model does not score masks its whole row: softmax would make it nan.
    empty = logits.amax(dim=-1, keepdim=True).isneginf()  # (R, 1)
    first = torch.arange(logits.size(-1), device=logits.device) == 0  # (V,)
    return logits.masked_fill(empty & first, 0.0)


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature, finite at each row's likeliest id whatever the temperature (softmax: the same draws)."""
    finfo = torch.finfo(logits.dtype)
    # In float32 a temperature of 1e-300 would be 0 and one of 1e300 inf (-inf / inf: nan).
    t = min(max(temperature, finfo.tiny), finfo.max)
    scaled = logits / t  # (R, V)
    # A small temperature can overflow the quotient to inf (softmax: nan); the distances to the row's maximum,
    # <= 0 and 0 at the maximum, cannot. Only rows that overflowed take them: the others' draws stay bit for bit.
    shifted = (logits - logits.amax(dim=-1, keepdim=True)) / t  # (R, V)
    return torch.where(scaled.amax(dim=-1, keepdim=True).isfinite(), scaled, shifted)


def sampler(sampling: Sampling, generator: torch.Generator) -> Callable[[Tensor], Tensor]:
    """A `pick` that samples from the tempered, top-k and top-p filtered distribution."""

    def pick(logits: Tensor) -> Tensor:
        logits = tempered(with_a_choice(logits), sampling.temperature)  # (R, V)
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
