"""Translator: text in, text out (tokenizer + model + decoding), and the attention of one sentence."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from nanomt.checkpoint import CheckpointError, load_checkpoint
from nanomt.config import Config
from nanomt.data import make_batches
from nanomt.decode import Hypothesis, search
from nanomt.decoding import Decoding, batch_decoding
from nanomt.ensemble import Ensemble
from nanomt.glossary import required_terms
from nanomt.model import Transformer, prune_output
from nanomt.quantize import quantize_int8
from nanomt.tokenizer import Tokenizer

log = logging.getLogger("nanomt")


@dataclass(frozen=True)
class SentenceAttention:
    """Subword tokens and attention weights of one translated sentence (per layer: (H, T, S) etc.)."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    translation: str
    encoder: list[np.ndarray]  # per layer (H, S, S)
    decoder: list[np.ndarray]  # per layer (H, T, T)
    cross: list[np.ndarray]  # per layer (H, T, S)


def source_ids(tokenizer: Tokenizer, cfg: Config, sentences: list[str]) -> list[list[int]]:
    """Each sentence's ids and EOS ([] for an empty line), cut to the model's positions (a warning says so)."""
    limit = cfg.model.max_positions - 1  # the source gets an EOS
    ids = tokenizer.encode_src(sentences)
    too_long = sum(len(s) > limit for s in ids)
    if too_long:
        log.warning("%d input line(s) longer than %d tokens were truncated", too_long, limit)
    return [s[:limit] + [cfg.model.eos_id] if s else [] for s in ids]


def prepare(
    tokenizer: Tokenizer, cfg: Config, sentences: list[str], decoding: Decoding, prefixes: list[str] | None
) -> tuple[list, list, list]:
    """Per sentence: source ids (EOS included), prefix ids and glossary phrase ids; ValueError naming what does not
    fit (a prefix past its sentence's length limit, a term the vocabulary cannot write)."""
    ids = source_ids(tokenizer, cfg, sentences)
    targets = prefix_ids(tokenizer, prefixes, len(sentences))
    for i, (src, prefix) in enumerate(zip(ids, targets)):
        budget = decoding.max_len(len(src) - 1, cfg.model.max_positions)
        if src and prefix and len(prefix) >= budget:
            raise ValueError(
                f"sentence {i + 1}: its prefix of {len(prefix)} tokens does not fit its length limit ({budget})"
            )
    return ids, targets, phrase_ids(tokenizer, sentences, decoding)


def prefix_ids(tokenizer: Tokenizer, prefixes: list[str] | None, n: int) -> list[list[int]]:
    """Each sentence's forced target prefix as ids ([] for none)."""
    if prefixes is None:
        return [[] for _ in range(n)]
    if len(prefixes) != n:
        raise ValueError(f"{len(prefixes)} prefixes for {n} sentences")
    return [ids if p else [] for p, ids in zip(prefixes, tokenizer.encode_tgt([p or "" for p in prefixes]))]


def phrase_ids(tokenizer: Tokenizer, sentences: list[str], decoding: Decoding) -> list[list[list[int]]]:
    """Per sentence, the target ids of each glossary term its translation must contain."""
    if not decoding.glossary:
        return [[] for _ in sentences]
    terms = [required_terms(decoding.glossary, s) for s in sentences]
    unique = sorted({t for ts in terms for t in ts})
    ids = dict(zip(unique, tokenizer.encode_tgt(unique)))
    for term in unique:
        if not ids[term] or tokenizer.unk_id in ids[term]:
            raise ValueError(f"glossary term {term!r}: the model's vocabulary cannot write it (unknown pieces)")
    return [[ids[t] for t in ts] for ts in terms]


class Translator:
    """A model with its tokenizer and decoding defaults: `translate(list_of_str) -> list_of_str`."""

    def __init__(
        self,
        model: Transformer | Ensemble,
        tokenizer: Tokenizer,
        cfg: Config,
        device: str | torch.device = "cpu",
        int8: bool = False,
    ):
        model = model.to(device).eval()
        # Restricted models decode through a copy that projects onto the kept ids only (model.prune_output).
        self.model = (
            Ensemble([prune_output(m) for m in model.members]) if isinstance(model, Ensemble) else prune_output(model)
        )
        if int8:  # int8 linear layers: faster CPU decoding (README, Speed; benchmarks/results/speed.md)
            self.model = quantize_int8(self.model)
        self.int8 = int8
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.device = torch.device(device)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "cpu", int8: bool = False) -> Translator:
        """Load any checkpoint directory (a run dir, checkpoints/step_N, or an averaged one)."""
        model, cfg, tokenizer = load_checkpoint(path, device)
        return cls(model, tokenizer, cfg, device, int8)

    @classmethod
    def from_checkpoints(
        cls, paths: list[str | Path], device: str | torch.device = "cpu", int8: bool = False
    ) -> Translator:
        """One checkpoint, or an ensemble of several that share a tokenizer (decoding defaults from the first)."""
        if not paths:
            raise CheckpointError("no checkpoint given")
        if len(paths) == 1:
            return cls.from_checkpoint(paths[0], device, int8)
        loaded = [load_checkpoint(path, device) for path in paths]
        _, cfg, tokenizer = loaded[0]
        for path, (_, _, other) in zip(paths[1:], loaded[1:]):
            if other.fingerprint() != tokenizer.fingerprint():
                raise CheckpointError(f"{path}: its tokenizer differs from {paths[0]}'s (an ensemble shares one)")
        ensemble = Ensemble([model for model, _, _ in loaded])
        # Its positions are its shortest member's: source lines are truncated to fit every member.
        return cls(ensemble, tokenizer, dataclasses.replace(cfg, model=ensemble.cfg), device, int8)

    def _encode(self, sentences: list[str]) -> list[list[int]]:
        return source_ids(self.tokenizer, self.cfg, sentences)

    def _max_len(self, src_len: int) -> int:
        return self.default_decoding.max_len(src_len, self.cfg.model.max_positions)

    @property
    def default_decoding(self) -> Decoding:
        """The checkpoint's decoding settings (its config's decode section): what a request changes."""
        return Decoding.from_config(self.cfg.decode)

    @torch.inference_mode()
    def translate_hypotheses(
        self,
        sentences: list[str],
        decoding: Decoding | None = None,
        max_tokens: int | None = None,
        progress: bool = False,
        prefixes: list[str] | None = None,
        **settings,
    ) -> list[list[Hypothesis]]:
        """n_best hypotheses (token ids and scores) per sentence, in input order.

        `decoding` (default: the checkpoint's) with `settings` changed, e.g. beam_size=4, n_best=2, sampling={...}
        (Decoding's fields; None leaves one as it is); `prefixes`: per sentence, text the translation starts with.
        """
        decoding = (decoding or self.default_decoding).replace(**settings)
        ids, targets, phrases = prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)
        lens = np.array([len(s) for s in ids])
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in ids]
        todo = np.flatnonzero(lens > 0)  # empty lines translate to empty lines
        batches = make_batches(lens[todo], lens[todo], max_tokens or self.cfg.decode.max_tokens, 0, 0, shuffle=False)
        bar = tqdm(total=len(todo), disable=not progress, unit="sent", dynamic_ncols=True)
        for k, batch in enumerate(batches):
            idx = todo[batch]
            width = int(lens[idx].max())
            src = torch.full((len(idx), width), self.cfg.model.pad_id, dtype=torch.long)
            for row, i in enumerate(idx):
                src[row, : lens[i]] = torch.tensor(ids[i])
            chosen = batch_decoding(decoding, k)
            hyps = search(self.model, src.to(self.device), chosen, [targets[i] for i in idx], [phrases[i] for i in idx])
            for i, h in zip(idx, hyps):
                results[i] = h
            bar.update(len(idx))
        bar.close()
        return results

    def check(self, sentences: list[str], decoding: Decoding, prefixes: list[str] | None = None) -> None:
        """Raise ValueError, naming the problem, for inputs `translate` refuses (a server checks before queueing)."""
        prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)

    def translate(self, sentences: list[str], decoding: Decoding | None = None, **kwargs) -> list[str]:
        """One translation per input sentence, in order."""
        hyps = self.translate_hypotheses(sentences, decoding, **kwargs)
        return self.tokenizer.decode_tgt([h[0].tokens for h in hyps])

    def translate_n_best(
        self, sentences: list[str], n_best: int | None = None, decoding: Decoding | None = None, **kwargs
    ):
        """The n_best (translation, score) pairs of every sentence (n_best: default the decoding's)."""
        hyps = self.translate_hypotheses(sentences, decoding, n_best=n_best, **kwargs)
        return [list(zip(self.tokenizer.decode_tgt([h.tokens for h in hs]), [h.score for h in hs])) for hs in hyps]

    @torch.inference_mode()
    def attention(self, sentence: str, beam_size: int = 1) -> SentenceAttention:
        """Translate one sentence and return every layer's and head's attention weights for it."""
        src_ids = self._encode([sentence])[0] or [self.cfg.model.eos_id]
        tgt_ids = self.translate_hypotheses([sentence], beam_size=beam_size)[0][0].tokens
        src = torch.tensor([src_ids], device=self.device)
        tgt_in = torch.tensor([[self.cfg.model.bos_id] + tgt_ids], device=self.device)  # row i predicts tgt token i
        _, weights = self.model(src, tgt_in, need_weights=True)
        to_np = lambda ws: [w[0].float().cpu().numpy() for w in ws]  # noqa: E731
        return SentenceAttention(
            src_tokens=self.tokenizer.src_pieces(src_ids[:-1]) + ["</s>"],
            tgt_tokens=self.tokenizer.tgt_pieces(tgt_ids) + ["</s>"],
            translation=self.tokenizer.decode_tgt([tgt_ids])[0],
            encoder=to_np(weights["encoder"]),
            decoder=to_np(weights["decoder"]),
            cross=to_np(weights["cross"]),
        )
