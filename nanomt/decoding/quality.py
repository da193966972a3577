"""What a translation's confidence is estimated from: each target token's log-probability and the entropy of the
distribution it was chosen from (kept by the search itself, Decoding.token_scores; or, for a search that keeps none,
read back by one teacher-forced pass of the model), the length ratio and the unknown source pieces. Also each target
word's probability (Bergamot's basic quality estimate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nanomt.core.batches import make_batches
from nanomt.core.config import ModelConfig
from nanomt.core.model import Transformer
from nanomt.decoding.steps import Hypothesis, entropy

# The names and order of the features a confidence is estimated from; a calibration file names the ones it uses.
FEATURES = ("mean_log_prob", "min_log_prob", "mean_entropy", "length_ratio", "unknown_source")
# A token the model does not score (a glossary term's piece outside a restricted output) has log-prob -inf: floored,
# so that a sentence's features stay finite.
LOG_PROB_FLOOR = -20.0
DOUBTFUL = 0.5  # a word whose probability is below this is listed as doubtful
READ_BATCH_TOKENS = 4000  # padded tokens a side a read-back batch holds


@dataclass(frozen=True)
class TokenScores:
    """One decoded row's scores: per target token (EOS last, where it was generated) its log-prob and the entropy
    of the distribution it was chosen from; the row's source pieces (EOS not counted) and how many are unknown."""

    log_probs: np.ndarray  # (T + 1,) or (T,)
    entropies: np.ndarray  # same
    src_len: int
    unknown: int

    @classmethod
    def of(cls, hyp: Hypothesis, src: list[int], unk_id: int) -> TokenScores | None:
        """What a search kept in `hyp` (Decoding.token_scores), with its source ids (EOS last); None if nothing."""
        if not hyp.token_log_probs:
            return None
        lps = np.maximum(np.asarray(hyp.token_log_probs, dtype=np.float64), LOG_PROB_FLOOR)
        return cls(lps, np.asarray(hyp.entropies, dtype=np.float64), len(src) - 1, unknown_pieces(src, unk_id))

    @classmethod
    def join(cls, parts: Sequence[TokenScores]) -> TokenScores:
        """A sentence decoded in pieces: its rows' tokens and source pieces, in order."""
        if len(parts) == 1:
            return parts[0]
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return cls(cat("log_probs"), cat("entropies"), sum(p.src_len for p in parts), sum(p.unknown for p in parts))

    def features(self) -> dict[str, float]:
        """The sentence's FEATURES."""
        # length_ratio: target over source tokens, EOS on both
        return {
            "mean_log_prob": self.mean_log_prob,
            "min_log_prob": float(self.log_probs.min()),
            "mean_entropy": float(self.entropies.mean()),
            "length_ratio": math.log(len(self.log_probs) / (self.src_len + 1)),
            "unknown_source": self.unknown / max(self.src_len, 1),
        }

    @property
    def mean_log_prob(self) -> float:
        """The raw score: the mean log-probability of the translation's tokens."""
        return float(self.log_probs.mean())


def unknown_pieces(src: list[int], unk_id: int) -> int:
    """How many of a row's source pieces (ids with EOS last) the vocabulary lacks."""
    return sum(1 for x in src[:-1] if x == unk_id)


def teacher_forced(src_ids: list[list[int]], tgt_ids: list[list[int]], cfg: ModelConfig) -> tuple[Tensor, ...]:
    """(source ids with EOS, translation ids without BOS/EOS) pairs as padded tensors: src (B, S), the decoder's
    input BOS + translation (B, T + 1), and what each position predicts, translation + EOS (B, T + 1)."""
    src = torch.full((len(src_ids), max(map(len, src_ids))), cfg.pad_id, dtype=torch.long)  # (B, S)
    tgt_out = torch.full((len(tgt_ids), 1 + max(map(len, tgt_ids))), cfg.pad_id, dtype=torch.long)  # (B, T + 1)
    tgt_in = tgt_out.clone()
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        src[row, : len(s)] = torch.tensor(s)
        tgt_in[row, : len(t) + 1] = torch.tensor([cfg.bos_id, *t])  # position i predicts target token i
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, cfg.eos_id])
    return src, tgt_in, tgt_out


def read_back(model: Transformer, src: list[list[int]], tgt: list[list[int]], unk_id: int) -> list[TokenScores]:
    """Each (source ids with EOS, translation ids without BOS/EOS) pair read back by the model, teacher-forced, with
    EOS scored after the translation; in batches by length (make_batches, READ_BATCH_TOKENS padded a side)."""
    out: list[TokenScores | None] = [None] * len(src)
    src_lens, tgt_lens = [len(s) - 1 for s in src], [len(t) for t in tgt]  # make_batches adds EOS/BOS itself
    for batch in make_batches(src_lens, tgt_lens, READ_BATCH_TOKENS, 0, 0, shuffle=False) if src else []:
        for j, r in zip(batch, _read_batch(model, [src[j] for j in batch], [tgt[j] for j in batch], unk_id)):
            out[j] = r
    return out


@torch.inference_mode()
def _read_batch(
    model: Transformer, src_ids: list[list[int]], tgt_ids: list[list[int]], unk_id: int
) -> list[TokenScores]:
    device = next(model.parameters()).device
    src, tgt_in, tgt = (x.to(device) for x in teacher_forced(src_ids, tgt_ids, model.cfg))
    restricted = getattr(model, "pruned", False)  # a prune_output copy scores its K kept ids only
    logits = model(src, tgt_in, restricted=restricted)
    log_probs = logits.float().log_softmax(-1)  # (B, T + 1, V or K)
    entropies = entropy(log_probs).cpu().numpy()  # (B, T + 1)
    positions = model.output_targets(tgt) if restricted else tgt
    picked = log_probs.gather(-1, positions.unsqueeze(-1)).squeeze(-1)  # (B, T + 1)
    if restricted:  # an id the pruned output does not score maps to padding's position: not its probability
        picked = picked.masked_fill(~model.output_mask[tgt], float("-inf"))
    picked = picked.clamp(min=LOG_PROB_FLOOR).cpu().numpy()
    out = []
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids)):
        n = len(t) + 1  # target tokens with EOS
        lps, ents = picked[row, :n].astype(np.float64), entropies[row, :n].astype(np.float64)
        out.append(TokenScores(lps, ents, len(s) - 1, unknown_pieces(s, unk_id)))
    return out


def word_probabilities(pieces: list[str], log_probs: np.ndarray) -> list[tuple[list[int], float]]:
    """Each target word (the pieces from one that starts with "▁" to the next) with its probability: the product of
    its pieces' probabilities. Returns (the word's piece positions, probability) in order; EOS is no word."""
    words: list[tuple[list[int], float]] = []
    for k, piece in enumerate(pieces):
        if not words or piece.startswith("▁"):
            words.append(([k], float(log_probs[k])))
        else:
            positions, total = words[-1]
            words[-1] = ([*positions, k], total + float(log_probs[k]))
    return [(positions, math.exp(total)) for positions, total in words]
