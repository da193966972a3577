"""The frozen Decoding value: how one request is decoded, built and checked once where it enters (config, CLI, HTTP).

It is hashable: the server batches requests whose Decoding is equal, and `decode_alone` says which may share a
batch with nobody. Standard library only, so that a process without torch (the CTranslate2 worker) can read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nanomt.core.settings import check_bounds, setting

# Scores of a finished hypothesis (length_penalty below): GNMT's ((5 + len) / 6)^alpha, len^alpha, or the sum alone.
LENGTH_PENALTIES = ("gnmt", "average", "none")
MAX_TOKENS = 4096  # source tokens a decoding batch holds (a config's decode.max_tokens; the batch, not the search)
# What a request (a stranger) may ask for beyond the value's own bounds: a beam at most this wide, and a
# temperature or repetition penalty within these factors (float32 logits divided by 1e-40 were inf: a 500).
MAX_REQUEST_BEAM = 16
FACTORS = {"ge": 1e-3, "le": 1e3}

# Why a setting is not taken at a front door (nanomt.core.settings.DOORS), said once for the settings it applies to.
SEARCH_ONLY = "the export searches as nanomt does; CTranslate2's sampling is not nanomt's draw, so it is refused"
ONE_COMMAND = "a command's or a request's choice: a checkpoint's default decoding searches"
LIMITS = "what a request may change stays within the server's limits: a stranger cannot lengthen the work"
MODEL_SCORE = "how the model's hypotheses are scored: its config's, not one command's"
RULES = {  # the rules across fields; a request that breaks one is a 422 of this type (nanomt.serve.schemas)
    "n_best_within_beam": "n_best at most beam_size",
    "beam_with_sampling": "beam_size 1 (or none) with sampling",
    "glossary_with_sampling": "no glossary with sampling",
}


class DecodingError(ValueError):
    """Settings that break a rule across fields (`rule`: a key of RULES)."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class Sampling:
    """Ancestral sampling instead of search: temperature, top-k (0: off), nucleus top-p (1: off), seed."""

    temperature: float = setting(
        1.0,
        help="divide the logits by this before drawing: below 1 is closer to greedy, above 1 more varied",
        metavar="T",
        gt=0,
        cap=FACTORS,
        absent={"config": ONE_COMMAND, "ct2": SEARCH_ONLY},
    )
    top_k: int = setting(
        0,
        help="draw from the k likeliest tokens only (0: all)",
        flag="--sampling-topk",
        metavar="K",
        ge=0,
        absent={"config": ONE_COMMAND, "ct2": SEARCH_ONLY},
    )
    top_p: float = setting(
        1.0,
        help="nucleus sampling: draw from the likeliest tokens that hold this probability (1: all)",
        flag="--sampling-topp",
        metavar="P",
        gt=0,
        le=1,
        absent={"config": ONE_COMMAND, "ct2": SEARCH_ONLY},
    )
    seed: int | None = setting(
        None,
        help="random seed, for samples a rerun repeats (default: a fresh draw every time)",
        ge=0,
        lt=2**64,
        absent={"config": ONE_COMMAND, "ct2": SEARCH_ONLY},
    )

    def __post_init__(self):
        check_bounds(self)


@dataclass(frozen=True)
class Decoding:
    """Search or sampling, its limits, and the rules on the scores (repetition guards, a glossary's terms).

    Each field is described once (nanomt.core.settings.setting): the config's decode section, the flags of
    `nanomt translate` and `evaluate`, the request schema and the CTranslate2 export are generated from it.
    """

    beam_size: int = setting(
        5, help="beam width; 1 is greedy decoding", flag="--beam", ge=1, cap={"le": MAX_REQUEST_BEAM}, ct2="nanomt"
    )
    n_best: int = setting(
        1,
        help="the k best translations of each sentence, best first (nanomt translate prints "
        "'index<TAB>score<TAB>text' lines); at most beam_size",
        metavar="K",
        ge=1,
        absent={
            "config": "how many translations a command prints, not how the model decodes",
            "request": "/translate answers one translation a text (LibreTranslate's alternatives asks for more)",
            "ct2": "the export gives each sentence's best translation",
        },
    )
    length_penalty: float = setting(
        1.0, help="alpha of the length penalty", metavar="ALPHA", absent={"request": MODEL_SCORE}, ct2="nanomt"
    )
    length_penalty_kind: str = setting(
        "gnmt",
        help="gnmt: log p / ((5 + len) / 6)^alpha (Wu et al., 2016); average: log p / len^alpha; none: log p "
        "(len counts EOS)",
        choices=LENGTH_PENALTIES,
        absent={"flag": MODEL_SCORE, "request": MODEL_SCORE},
        ct2="nanomt",
    )
    # With a length penalty: end a sentence's search once beam_size hypotheses are finished (fairseq), or go on
    # while its best live beam, scored at its current length, beats the worst of them (Hugging Face's default).
    early_stopping: bool = setting(
        True,
        help="with a length-dependent score, true ends a sentence's beam search once beam_size hypotheses are "
        "finished (fairseq); false goes on while its best live beam, scored at its current length, beats the worst "
        "of them (Hugging Face's default)",
        absent={"flag": MODEL_SCORE, "request": MODEL_SCORE},
        ct2="nanomt",
    )
    # A sentence's budget of generated tokens, EOS included: int(max_len_a * source tokens + max_len_b).
    max_len_a: float = setting(
        1.2,
        help="a translation has at most int(max_len_a * source tokens + max_len_b) tokens, EOS included (and at "
        "most the model's positions)",
        metavar="A",
        ge=0,
        absent={"request": LIMITS},
        ct2="nanomt",
    )
    max_len_b: int = setting(10, help="see max_len_a", metavar="B", absent={"request": LIMITS}, ct2="nanomt")
    min_len: int = setting(
        0,
        help="EOS is blocked until this many tokens are generated",
        metavar="N",
        ge=0,
        absent={"request": LIMITS},
        ct2="min_decoding_length",
    )
    no_repeat_ngram_size: int = setting(
        0,
        help="a repetition guard: no n-gram of this size twice in a translation (its decoder input, BOS included), "
        "as transformers' and CTranslate2's option of that name; 0: off",
        metavar="N",
        ge=0,
        ct2="no_repeat_ngram_size",
    )
    repetition_penalty: float = setting(
        1.0,
        help="a repetition guard (CTRL, Keskar et al., 2019): the scores of tokens already in the translation are "
        "divided by it where positive and multiplied by it where negative, as transformers' and CTranslate2's "
        "option; > 1 discourages repeats; 1: off",
        metavar="P",
        gt=0,
        cap=FACTORS,
        ct2="repetition_penalty",
    )
    sampling: Sampling | None = setting(
        None,
        help="sample each translation from the model's distribution instead of searching (as fairseq's "
        "--sampling), with Sampling's settings",
        absent={
            "config": ONE_COMMAND,
            "request": "a request samples when it gives a Sampling setting (temperature, top_k or top_p)",
            "ct2": SEARCH_ONLY,
        },
    )
    # (source term, target term) pairs: a source term found in a sentence makes its target term appear
    glossary: tuple[tuple[str, str], ...] = setting(
        (),
        help="'source term<TAB>target term' pairs: a term found in a sentence puts its target term in the translation",
        metavar="FILE",
        read="nanomt.decoding.glossary:read_glossary",
        absent={
            "config": "a request's terms, or a server's --glossary: a checkpoint decodes any text",
            "ct2": "a glossary needs lexically constrained search, which CTranslate2 does not have",
        },
    )
    # Decode each batch over its vocabulary shortlist (nanomt.decoding.shortlist: the target pieces its source
    # pieces are seen translated into, and the most frequent): faster, at a BLEU cost; off: the whole output.
    shortlist: bool = setting(
        False,
        help="decode each batch over the checkpoint's vocabulary shortlist (shortlist.json beside its weights, "
        "built by nanomt shortlist): faster, at a small BLEU cost; off: the whole output",
        ct2="use_vmap",
    )
    # A multilingual model's target language: its token (>>fra<<) starts every source row (Marian's multilingual
    # opus-mt models, Johnson et al. 2017). A model of one target language takes none.
    target_lang: str | None = setting(
        None,
        help="the language a multilingual model translates into, by its code (fra, as its >>fra<< token); "
        "required by such a model, refused by any other",
        metavar="CODE",
        absent={
            "config": "a multilingual model has no one target: each command or route names it",
            "request": "a request's target language (LibreTranslate's target) picks the model and its code",
            "ct2": "the export's translator takes the sentences as given: start each with its >>code<< token",
        },
    )
    # Keep each generated token's log-probability and the entropy of the distribution it was chosen from in the
    # hypotheses (greedy, sampling and beam search; what a confidence is estimated from). Off: nothing is kept.
    token_scores: bool = setting(
        False,
        help="keep each generated token's log-probability and entropy (what a confidence is estimated from)",
        absent={
            door: "set by asking for a confidence (--confidence, confidence: true)"
            for door in ("config", "flag", "request", "ct2")
        },
    )

    def __post_init__(self):
        check_bounds(self)
        if self.n_best > self.beam_size:
            raise DecodingError(
                f"n_best must be in [1, beam_size={self.beam_size}], got {self.n_best}", "n_best_within_beam"
            )
        if self.sampling is not None and (self.beam_size, self.n_best) != (1, 1):
            raise DecodingError("sampling draws one translation: beam_size and n_best must be 1", "beam_with_sampling")
        if self.sampling is not None and self.glossary:
            raise DecodingError("a glossary needs beam search, not sampling", "glossary_with_sampling")

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

    def penalty(self, length: int) -> float:
        """What a finished hypothesis' log-prob is divided by (its score); `length` counts its tokens, EOS included."""
        alpha, kind = self.length_penalty, self.length_penalty_kind
        if kind == "gnmt":  # Wu et al. (2016), eq. 14
            return ((5 + length) / 6) ** alpha
        if kind == "average":
            return length**alpha
        return 1.0


def batch_decoding(decoding: Decoding, k: int) -> Decoding:
    """The decoding of a request's k-th batch: a seed moves on by k, or every batch would draw the same numbers."""
    s = decoding.sampling
    if s is None or s.seed is None or k == 0:
        return decoding
    return dataclasses.replace(decoding, sampling=dataclasses.replace(s, seed=s.seed + k))
