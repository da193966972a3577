"""The frozen Decoding value: how one request is decoded, built and checked once where it enters (config, CLI, HTTP).

It is hashable: the server batches requests whose Decoding is equal, and `decode_alone` says which may share a
batch with nobody. Standard library only, so that a process without torch (the CTranslate2 worker) can read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Scores of a finished hypothesis (nanomt.decoding.search): GNMT's ((5 + len) / 6)^alpha, len^alpha, or the sum alone.
LENGTH_PENALTIES = ("gnmt", "average", "none")


@dataclass(frozen=True)
class Sampling:
    """Ancestral sampling instead of search: temperature, top-k (0: off), nucleus top-p (1: off), seed."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None  # None: a fresh draw every time

    def __post_init__(self):
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")


@dataclass(frozen=True)
class Decoding:
    """Search or sampling, its limits, and the rules on the scores (repetition guards, a glossary's terms)."""

    beam_size: int = 5
    n_best: int = 1
    length_penalty: float = 1.0
    length_penalty_kind: str = "gnmt"
    # With a length penalty: end a sentence's search once beam_size hypotheses are finished (fairseq), or go on
    # while its best live beam, scored at its current length, beats the worst of them (Hugging Face's default).
    early_stopping: bool = True
    # A sentence's budget of generated tokens, EOS included: int(max_len_a * source tokens + max_len_b).
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 0  # EOS is blocked until this many tokens are generated
    no_repeat_ngram_size: int = 0  # no n-gram of this size twice in a translation (0: off)
    repetition_penalty: float = 1.0  # scores of tokens already generated: divided (if > 0) or multiplied by it
    sampling: Sampling | None = None
    # (source term, target term) pairs: a source term found in a sentence makes its target term appear
    glossary: tuple[tuple[str, str], ...] = ()
    # Decode each batch over its vocabulary shortlist (nanomt.decoding.shortlist: the target pieces its source
    # pieces are seen translated into, and the most frequent): faster, at a BLEU cost; off: the whole output.
    shortlist: bool = False
    # Keep each generated token's log-probability and the entropy of the distribution it was chosen from in the
    # hypotheses (greedy, sampling and beam search; what a confidence is estimated from). Off: nothing is kept.
    token_scores: bool = False

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"n_best must be in [1, beam_size={self.beam_size}], got {self.n_best}")
        if self.length_penalty_kind not in LENGTH_PENALTIES:
            raise ValueError(f"length_penalty_kind must be one of {LENGTH_PENALTIES}, got {self.length_penalty_kind!r}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a number, got {self.length_penalty}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if not (self.max_len_a >= 0 and math.isfinite(self.max_len_a)):
            raise ValueError(f"max_len_a must be >= 0, got {self.max_len_a}")
        if self.no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0, got {self.no_repeat_ngram_size}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.sampling is not None and (self.beam_size, self.n_best) != (1, 1):
            raise ValueError("sampling draws one translation: beam_size and n_best must be 1")
        if self.sampling is not None and self.glossary:
            raise ValueError("a glossary needs beam search, not sampling")

    @classmethod
    def from_config(cls, decode) -> Decoding:
        """The defaults a checkpoint's decode section (DecodeConfig, or its dict) gives: the fields both have."""
        get = decode.get if isinstance(decode, dict) else lambda name, default: getattr(decode, name, default)
        missing = object()
        values = {f.name: get(f.name, missing) for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if v is not missing})

    def replace(self, **changes) -> Decoding:
        """This decoding with the given settings changed; None leaves one as it is; `sampling` may be a dict."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown decoding setting(s) {unknown}")
        if isinstance(changes.get("sampling"), dict):
            given = changes["sampling"]
            known = [f.name for f in dataclasses.fields(Sampling)]
            if set(given) - set(known):
                raise ValueError(f"unknown sampling setting(s) {sorted(set(given) - set(known))}; known: {known}")
            changes["sampling"] = Sampling(**given)
        if changes.get("sampling") is not None:  # one draw: a search's beam and n-best do not apply
            changes.setdefault("beam_size", 1)
            changes.setdefault("n_best", 1)
        return dataclasses.replace(self, **changes)

    @property
    def decode_alone(self) -> bool:
        """A seeded sample repeats only in a batch of its own (a sentence's draw depends on its batch mates)."""
        return self.sampling is not None and self.sampling.seed is not None

    def max_len(self, src_len: int, max_positions: int) -> int:
        """Generated tokens (EOS included) allowed for `src_len` source tokens: at least 1, at most the positions."""
        return max(1, min(int(self.max_len_a * src_len + self.max_len_b), max_positions))


def batch_decoding(decoding: Decoding, k: int) -> Decoding:
    """The decoding of a request's k-th batch: a seed moves on by k, or every batch would draw the same numbers."""
    s = decoding.sampling
    if s is None or s.seed is None or k == 0:
        return decoding
    return dataclasses.replace(decoding, sampling=dataclasses.replace(s, seed=s.seed + k))
