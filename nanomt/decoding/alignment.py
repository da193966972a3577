"""A translation's soft alignment to its source, from the model's cross-attention: what inline markup is placed by."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Alignment:
    """A sentence's translation and its soft alignment: weights[t, s] links target piece t to source piece s."""

    translation: str
    src_pieces: tuple[str, ...] = ()  # SentencePiece pieces ("▁" starts a word); "</s>" and the like stand for nothing
    tgt_pieces: tuple[str, ...] = ()
    weights: np.ndarray | None = None  # (T, S); None: the words align in order, by position

    def __post_init__(self):
        if self.weights is not None and np.shape(self.weights) != (len(self.tgt_pieces), len(self.src_pieces)):
            raise ValueError(
                f"alignment weights of shape {np.shape(self.weights)} do not match "
                f"{len(self.tgt_pieces)} target and {len(self.src_pieces)} source pieces"
            )


def cross_attention(layers: list[np.ndarray]) -> np.ndarray:
    """Soft alignment (T, S) from per-layer (H, T, S) cross-attention: the penultimate layer's heads, averaged."""
    # Garg et al. 2019 (Jointly Learning to Align and Translate) find the penultimate layer aligns best.
    return np.asarray(layers[-2] if len(layers) > 1 else layers[-1], dtype=np.float64).mean(0)
