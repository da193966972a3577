"""Translator: text in, text out (tokenizer + model + decoding), and the attention of one sentence."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from nanomt.core.batches import make_batches
from nanomt.core.checkpoint import CheckpointError, checkpoint_weights, load_checkpoint
from nanomt.core.config import Config
from nanomt.core.decoding import Decoding, batch_decoding
from nanomt.core.model import Transformer, prune_output
from nanomt.core.runtime import pick_device
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding import confident
from nanomt.decoding.alignment import Alignment, cross_attention
from nanomt.decoding.calibration import Calibration
from nanomt.decoding.confident import Confident
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.pieces import join_pieces, replace_unknowns
from nanomt.decoding.quality import teacher_forced
from nanomt.decoding.quantize import quantize_int8
from nanomt.decoding.rows import Prepared, joined, prepare, src_limit, word_starts
from nanomt.decoding.search import search
from nanomt.decoding.shortlist import Shortlist, ShortlistError, restrict
from nanomt.decoding.steps import Hypothesis, Targets

ALIGN_BATCH = 32  # sentences a teacher-forced pass reads for their alignments


@dataclass(frozen=True)
class SentenceAttention:
    """Subword tokens and attention weights of one translated sentence (per layer: (H, T, S) etc.)."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    translation: str
    encoder: list[np.ndarray]  # per layer (H, S, S)
    decoder: list[np.ndarray]  # per layer (H, T, T)
    cross: list[np.ndarray]  # per layer (H, T, S)


class Translator:
    """A model with its tokenizer and decoding defaults: `translate(list_of_str) -> list_of_str`."""

    def __init__(
        self,
        model: Transformer | Ensemble,
        tokenizer: Tokenizer,
        cfg: Config,
        device: str | torch.device = "cpu",
        int8: bool = False,
        calibration: Calibration | None = None,
        copy_model: bool = True,
    ):
        """`copy_model` False: `model` is this Translator's alone (it loaded it), pruned and quantized in place."""
        model = model.to(device).eval()
        # Restricted models decode through a model that projects onto the kept ids only (model.prune_output).
        members = model.members if isinstance(model, Ensemble) else [model]
        pruned = [prune_output(m, copy_model) for m in members]
        self.model = Ensemble(pruned) if isinstance(model, Ensemble) else pruned[0]
        if int8:  # int8 linear layers: faster CPU decoding (README, Speed; benchmarks/results/speed.md)
            # A copy where a member is still the caller's (not pruned: nothing was copied yet).
            shared = copy_model and any(p is m for p, m in zip(pruned, members))
            self.model = quantize_int8(self.model, copy_model=shared)
        self.int8 = int8
        if calibration is not None:
            self.calibration = calibration
        self._calibration_at: tuple[Path, Path] | None = None  # where from_checkpoint's calibration is read
        self.directory: Path | None = None  # the checkpoint directory it was loaded from (its shortlist.json)
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.device = torch.device(device)

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, device: str | torch.device = "cpu", int8: bool = False, calibrated: bool = True
    ) -> Translator:
        """Load any checkpoint directory (a run dir, checkpoints/step_N, or an averaged one), with its calibration
        unless `calibrated` is False (what `nanomt calibrate` replaces is not read)."""
        device = pick_device(device, "device")  # a DeviceError naming a device this machine lacks
        model, cfg, tokenizer = load_checkpoint(path, device)
        weights = checkpoint_weights(path, quiet=True)  # load_checkpoint has said which file it read
        translator = cls(model, tokenizer, cfg, device, int8, copy_model=False)
        translator.directory = weights.parent
        if calibrated:  # read (and its weights' hash checked) when a confidence is first asked for, not at start-up
            translator._calibration_at = (weights.parent, weights)
        return translator

    @classmethod
    def from_checkpoints(
        cls, paths: list[str | Path], device: str | torch.device = "cpu", int8: bool = False
    ) -> Translator:
        """One checkpoint, or an ensemble of several that share a tokenizer (decoding defaults from the first)."""
        if not paths:
            raise CheckpointError("no checkpoint given")
        device = pick_device(device, "device")
        if len(paths) == 1:
            return cls.from_checkpoint(paths[0], device, int8)
        loaded = [load_checkpoint(path, device) for path in paths]
        _, cfg, tokenizer = loaded[0]
        for path, (_, _, other) in zip(paths[1:], loaded[1:]):
            if other.fingerprint() != tokenizer.fingerprint():
                raise CheckpointError(f"{path}: its tokenizer differs from {paths[0]}'s (an ensemble shares one)")
        ensemble = Ensemble([model for model, _, _ in loaded])
        # Its positions are its shortest member's: longer sentences are decoded in pieces that fit every member.
        return cls(ensemble, tokenizer, dataclasses.replace(cfg, model=ensemble.cfg), device, int8, copy_model=False)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """The source tokens of each text, EOS not counted (what the length limit, src_limit, applies to)."""
        return [len(ids) for ids in self.tokenizer.encode_src(texts)]

    def _max_len(self, src_len: int) -> int:
        return self.default_decoding.max_len(src_len, self.cfg.model.max_positions)

    @functools.cached_property
    def word_start(self) -> torch.Tensor:
        """(V,) the target ids after which a glossary term is a whole word (word_starts)."""
        return word_starts(self.tokenizer, self.cfg.model.tgt_vocab_size, self.cfg.model.eos_id)

    @functools.cached_property
    def calibration(self) -> Calibration | None:
        """Features -> confidence (nanomt.decoding.calibration); None: raw scores only (nanomt calibrate fits one)."""
        return confident.load_calibration(*self._calibration_at) if self._calibration_at else None

    @functools.cached_property
    def shortlist(self) -> Shortlist:
        """The checkpoint's vocabulary shortlist (ShortlistError, a ValueError, where it has none)."""
        if isinstance(self.model, Ensemble) or self.directory is None:
            raise ShortlistError("a shortlist is one checkpoint's: load the Translator with from_checkpoint")
        return Shortlist.load(self.directory, self.tokenizer.fingerprint())

    def _shortlisted(self, src: list[list[int]], targets: Targets) -> Transformer:
        """The model restricted to a batch's shortlist, with its specials and forced ids (prefixes, terms)."""
        forced = [t for p in targets.prefixes for t in p] + [t for ps in targets.phrases for p in ps for t in p]
        specials = [self.cfg.model.eos_id, self.tokenizer.unk_id]
        return restrict(self.model, self.shortlist.allowed(src, specials + forced))

    @property
    def default_decoding(self) -> Decoding:
        """The checkpoint's decoding settings (its config's decode section): what a request changes."""
        return Decoding.from_config(self.cfg.decode)

    def decoding(self, decoding: Decoding | None = None, **settings) -> Decoding:
        """What a call decodes with: `decoding` (default: the checkpoint's) with `settings` changed, Decoding's fields
        by name (Decoding.replace: None leaves one as it is), as transformers' generate(generation_config, **kwargs)
        takes them. Every method of the Translator that decodes takes its settings here, and nowhere else."""
        return (decoding or self.default_decoding).replace(**settings)

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
        decoding = self.decoding(decoding, **settings)
        prepared = prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)
        rows = self.decode_rows(prepared, decoding, max_tokens, progress)
        return joined(rows, prepared.sentence_of, len(sentences))

    def decode_rows(
        self, prepared: Prepared, decoding: Decoding, max_tokens: int | None, progress: bool = False
    ) -> list[list[Hypothesis]]:
        """Every row's hypotheses: rows batched by length within the token budget, in input order."""
        ids = prepared.src
        lens = np.array([len(s) for s in ids])
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in ids]
        todo = np.flatnonzero(lens > 0)  # empty lines translate to empty lines
        budget = self.cfg.decode.max_tokens if max_tokens is None else max_tokens  # 0 is refused, not the default
        batches = make_batches(lens[todo], lens[todo], budget, 0, 0, shuffle=False)
        bar = tqdm(total=len(todo), disable=not progress, unit="sent", dynamic_ncols=True)
        for k, batch in enumerate(batches):
            idx = todo[batch]
            width = int(lens[idx].max())
            src = torch.full((len(idx), width), self.cfg.model.pad_id, dtype=torch.long)
            for row, i in enumerate(idx):
                src[row, : lens[i]] = torch.tensor(ids[i])
            chosen = batch_decoding(decoding, k)
            phrases = [prepared.phrases[i] for i in idx]
            word_start = self.word_start if any(phrases) else None
            targets = Targets([prepared.prefix[i] for i in idx], phrases, word_start)
            model = self._shortlisted([ids[i] for i in idx], targets) if chosen.shortlist else self.model
            hyps = search(model, src.to(self.device), chosen, targets)
            for i, h in zip(idx, hyps):
                results[i] = h
            bar.update(len(idx))
        bar.close()
        return results

    def check(self, sentences: list[str], decoding: Decoding, prefixes: list[str] | None = None) -> None:
        """Raise ValueError, naming the problem, for inputs `translate` refuses (a server checks before queueing)."""
        prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)
        if decoding.shortlist:
            self.shortlist  # noqa: B018  (loaded now, or its error)

    def translate(self, sentences: list[str], decoding: Decoding | None = None, **kwargs) -> list[str]:
        """One translation per input sentence, in order."""
        hyps = self.translate_hypotheses(sentences, decoding, **kwargs)
        return self.tokenizer.decode_tgt([h[0].tokens for h in hyps])

    def translate_n_best(
        self,
        sentences: list[str],
        n_best: int | None = None,
        decoding: Decoding | None = None,
        replace_unknowns: bool = False,
        max_tokens: int | None = None,
        progress: bool = False,
        prefixes: list[str] | None = None,
        **settings,
    ) -> list[list[tuple[str, float]]]:
        """The n_best (translation, score) pairs of every sentence (n_best: default the decoding's). With
        `replace_unknowns`, a source piece the vocabulary lacks is copied into each translation where the attention
        puts it (CTranslate2's replace_unknowns; here also where the translation has no unknown piece for it)."""
        decoding = self.decoding(decoding, n_best=n_best, **settings)
        hyps = self.translate_hypotheses(sentences, decoding, max_tokens, progress, prefixes)
        texts = [self.tokenizer.decode_tgt([h.tokens for h in hs]) for hs in hyps]
        if replace_unknowns:
            self.restore_unknowns(sentences, hyps, texts, decoding)
        return [list(zip(ts, [h.score for h in hs])) for ts, hs in zip(texts, hyps)]

    def translate_confident(
        self,
        sentences: list[str],
        decoding: Decoding | None = None,
        max_tokens: int | None = None,
        prefixes: list[str] | None = None,
        replace_unknowns: bool = False,
        **settings,
    ) -> list[Confident]:
        """Each sentence's best translation (as `translate` gives it) with its confidence and word probabilities
        (nanomt.decoding.confident)."""
        decoding = self.decoding(decoding, **settings)
        return confident.translate_confident(self, sentences, decoding, max_tokens, prefixes, replace_unknowns)

    @torch.inference_mode()
    def restore_unknowns(
        self, sentences: list[str], hyps: list[list[Hypothesis]], texts: list[list[str]], decoding: Decoding
    ) -> None:
        """texts[i][k] rewritten in place where sentence i has pieces the vocabulary lacks (a sentence decoded in
        pieces, or by an ensemble, has no one attention and is left as it is)."""
        leads, texts_only = self.tokenizer.split_language(sentences, decoding.target_lang)
        ids = [lead + ids for lead, ids in zip(leads, self.tokenizer.encode_src(texts_only))]
        unk = self.tokenizer.unk_id
        todo = [i for i, s in enumerate(ids) if unk in s and len(s) <= src_limit(self.cfg)]
        if not todo or isinstance(self.model, Ensemble):
            return
        unk_piece = self.tokenizer.tgt_pieces([unk])[0]
        for i, pieces in zip(todo, self.tokenizer.src_piece_texts([texts_only[i] for i in todo])):
            src, src_pieces = ids[i] + [self.cfg.model.eos_id], self.tokenizer.src_pieces(leads[i]) + pieces
            unknown = [j for j, t in enumerate(ids[i]) if t == unk]
            for k, h in enumerate(hyps[i]):
                cross = self.weights([src], [h.tokens])["cross"]  # per layer (1, H, T, S)
                weights = cross_attention([w[0].float().cpu().numpy() for w in cross])
                tgt_pieces = self.tokenizer.tgt_pieces(h.tokens) + ["</s>"]
                out = replace_unknowns([*src_pieces, "</s>"], tgt_pieces, weights, unknown, unk_piece)
                texts[i][k] = join_pieces(out)

    @torch.inference_mode()
    def attention(
        self, sentence: str, beam_size: int | None = None, decoding: Decoding | None = None, **settings
    ) -> SentenceAttention:
        """Translate one sentence (`decoding`, default the checkpoint's at beam 1, with `settings` changed) and return
        every layer's and head's attention weights for it."""
        decoding = self.decoding(decoding or self.default_decoding.replace(beam_size=1), **settings)
        decoding = decoding.replace(beam_size=beam_size, n_best=1)
        prepared = prepare(self.tokenizer, self.cfg, [sentence], decoding, None)
        if prepared.cut:
            raise ValueError(f"the sentence is longer than the model's {src_limit(self.cfg)} tokens: no one attention")
        src_ids = prepared.src[0] or [self.cfg.model.eos_id]
        tgt_ids = self.decode_rows(prepared, decoding, None)[0][0].tokens
        weights = self.weights([src_ids], [tgt_ids])
        to_np = lambda ws: [w[0].float().cpu().numpy() for w in ws]  # noqa: E731
        return SentenceAttention(
            src_tokens=self.tokenizer.src_pieces(src_ids[:-1]) + ["</s>"],
            tgt_tokens=self.tokenizer.tgt_pieces(tgt_ids) + ["</s>"],
            translation=self.tokenizer.decode_tgt([tgt_ids])[0],
            encoder=to_np(weights["encoder"]),
            decoder=to_np(weights["decoder"]),
            cross=to_np(weights["cross"]),
        )

    def weights(self, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> dict:
        """Every attention's weights of the model reading each (source, translation) pair, teacher-forced: per kind
        ("encoder", "decoder", "cross") a list over layers of (B, H, T or S, S) tensors, rows and columns padded."""
        src, tgt_in, _ = teacher_forced(src_ids, tgt_ids, self.cfg.model)
        _, weights = self.model(src.to(self.device), tgt_in.to(self.device), need_weights=True)
        return weights

    @torch.inference_mode()
    def alignments(
        self, sentences: list[str], decoding: Decoding | None = None, max_tokens: int | None = None
    ) -> list[Alignment]:
        """Each sentence's best translation with its soft alignment to the source (the penultimate layer's cross-
        attention, heads averaged): what markup puts inline tags back by. A sentence decoded in pieces, and every
        sentence of an ensemble (no one attention), gets none: its words then align by position."""
        decoding = self.decoding(decoding, n_best=1)
        prepared = prepare(self.tokenizer, self.cfg, sentences, decoding, None)
        best = [
            h[0].tokens
            for h in joined(self.decode_rows(prepared, decoding, max_tokens), prepared.sentence_of, len(sentences))
        ]
        texts = self.tokenizer.decode_tgt(best)
        out = [Alignment(text) for text in texts]
        row_of = {i: k for k, i in reversed(list(enumerate(prepared.sentence_of)))}
        whole = [i for i in range(len(sentences)) if i not in prepared.cut and prepared.src[row_of[i]]]
        if isinstance(self.model, Ensemble):
            return out
        for chunk in range(0, len(whole), ALIGN_BATCH):
            idx = whole[chunk : chunk + ALIGN_BATCH]
            src_ids = [prepared.src[row_of[i]] for i in idx]
            cross = self.weights(src_ids, [best[i] for i in idx])["cross"]  # per layer (B, H, T, S)
            for row, i in enumerate(idx):
                t, s, lead = len(best[i]) + 1, len(src_ids[row]), prepared.lead[row_of[i]]  # a language token
                layers = [w[row, :, :t, lead:s].float().cpu().numpy() for w in cross]  # aligns to no word
                src_pieces = tuple(self.tokenizer.src_pieces(src_ids[row][lead:-1])) + ("</s>",)
                tgt_pieces = tuple(self.tokenizer.tgt_pieces(best[i])) + ("</s>",)
                out[i] = Alignment(texts[i], src_pieces, tgt_pieces, cross_attention(layers))
        return out
