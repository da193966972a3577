"""Token-budget batches: sentences sorted by length and cut so that each padded batch fits a budget (training and
translation both batch this way)."""

from __future__ import annotations

import numpy as np


def bucket(n: int, per_octave: int = 8, minimum: int = 8) -> int:
    """n rounded up to one of `per_octave` sizes in each octave (multiples of `minimum`): at most 1/per_octave
    padding added, and a bounded number of distinct shapes for a compiled step (`per_octave` a doubling)."""
    if n <= minimum:
        return minimum
    step = max(minimum, 1 << max(0, (n - 1).bit_length() - 1 - (per_octave.bit_length() - 1)))
    return -(-n // step) * step


def make_batches(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    packed: bool = False,
) -> list[np.ndarray]:
    """Length-bucketed batches of sentence indices, each padded to at most max_tokens (seq + EOS/BOS).

    packed: the budget counts real tokens (max(src, tgt) + 1 a sentence), as rows without padding hold them.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    src_lens = np.asarray(src_lens, dtype=np.int64)
    tgt_lens = np.asarray(tgt_lens, dtype=np.int64)
    n = len(tgt_lens)
    rng = np.random.default_rng((seed, epoch))
    # Sort by tgt length, then src length; a random last key shuffles sentences of equal lengths.
    tie_break = rng.random(n) if shuffle else np.arange(n)
    order = np.lexsort((tie_break, src_lens, tgt_lens))
    # +1: every row carries one extra token (EOS on src and tgt_out, BOS on tgt_in).
    width = (np.maximum(src_lens, tgt_lens) + 1)[order]
    min_width = tgt_lens[order] + 1
    batches = []
    start = 0
    while start < n:
        # Widths from `start` on are >= min_width[start] (tgt is sorted), which bounds how many rows fit.
        window = width[start : start + max_tokens // min_width[start] + 1]
        if packed:
            padded = np.cumsum(window)
        else:
            padded = np.arange(1, len(window) + 1) * np.maximum.accumulate(window)  # nondecreasing
        count = max(1, int(np.searchsorted(padded, max_tokens, side="right")))  # >= 1: oversize alone
        batches.append(order[start : start + count])
        start += count
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches
