"""Translator: text in, text out (tokenizer + model + decoding), and the attention of one sentence."""

from __future__ import annotations

import dataclasses
import functools
import logging
import unicodedata
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
from nanomt.core.tokenizer import Tokenizer
from nanomt.decoding import calibration as calib
from nanomt.decoding.alignment import Alignment, cross_attention
from nanomt.decoding.calibration import Calibration
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.glossary import required_terms
from nanomt.decoding.pieces import cut_sentence, join_pieces, replace_unknowns
from nanomt.decoding.quality import DOUBTFUL, TokenScores, read_back, teacher_forced, word_probabilities
from nanomt.decoding.quantize import quantize_int8
from nanomt.decoding.search import search
from nanomt.decoding.shortlist import Shortlist, ShortlistError, restrict
from nanomt.decoding.steps import Hypothesis, Targets

log = logging.getLogger("nanomt")
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


@dataclass(frozen=True)
class Confident:
    """A translation with how far to trust it: its confidence (the calibrated estimate of its sentence chrF / 100;
    None when the model has no calibration), the raw score it comes from, and each word's probability."""

    translation: str
    score: float  # the search's score of the translation (length-penalized log-probability)
    confidence: float | None
    raw: float  # the mean log-probability of its tokens, EOS included
    words: tuple[tuple[str, float], ...] = ()  # (word, probability) in order
    features: dict | None = None  # what `confidence` was estimated from (None for an empty line)

    @property
    def doubtful(self) -> list[str]:
        """The words whose probability is under one half."""
        return [word for word, p in self.words if p < DOUBTFUL]


def src_limit(cfg: Config) -> int:
    """The most source tokens one decoded row holds (its EOS takes the last position): a longer sentence is cut."""
    return cfg.model.max_positions - 1


@dataclass(frozen=True)
class Prepared:
    """Sentences as the rows the model decodes: a sentence over the length limit is several rows, its pieces."""

    src: list[list[int]]  # per row, its source ids and EOS ([] for an empty line)
    prefix: list[list[int]]  # per row, its forced target prefix (a cut sentence's first piece gets the sentence's)
    phrases: list[list[list[int]]]  # per row, the glossary terms its translation must contain
    sentence_of: list[int]  # per row, the sentence it is (a piece of)
    cut: list[int]  # the sentences longer than the limit, decoded in pieces and joined: no input is ever cut off


def _rows(tokenizer: Tokenizer, cfg: Config, sentences: list[str]) -> tuple[list[str], list[list[int]], list[int]]:
    """Row texts, their source ids (EOS not yet added) and their sentences: each long sentence in pieces."""
    limit = src_limit(cfg)
    ids = tokenizer.encode_src(sentences)
    count = lambda texts: [len(x) for x in tokenizer.encode_src(texts)]  # noqa: E731
    texts, rows, owner = [], [], []
    for i, (sentence, sentence_ids) in enumerate(zip(sentences, ids)):
        pieces = [sentence] if len(sentence_ids) <= limit else cut_sentence(sentence, limit, count)
        piece_ids = [sentence_ids] if len(pieces) == 1 and pieces[0] is sentence else tokenizer.encode_src(pieces)
        # a piece of one character over the limit (a character of many byte pieces) keeps what fits
        texts += pieces
        rows += [p[:limit] for p in piece_ids]
        owner += [i] * len(pieces)
    return texts, rows, owner


def prepare(
    tokenizer: Tokenizer, cfg: Config, sentences: list[str], decoding: Decoding, prefixes: list[str] | None
) -> Prepared:
    """The rows to decode; ValueError naming what does not fit (a prefix past its sentence's length limit, a term
    the vocabulary cannot write)."""
    texts, rows, owner = _rows(tokenizer, cfg, sentences)
    cut = sorted({i for k, i in enumerate(owner) if k > 0 and owner[k - 1] == i})
    if cut:
        log.info("%d sentence(s) longer than %d tokens translated in pieces", len(cut), src_limit(cfg))
    wanted = prefix_ids(tokenizer, prefixes, len(sentences))
    targets = [wanted[i] if k == 0 or owner[k - 1] != i else [] for k, i in enumerate(owner)]
    ids = [r + [cfg.model.eos_id] if r else [] for r in rows]
    for src, prefix, i in zip(ids, targets, owner):
        budget = decoding.max_len(len(src) - 1, cfg.model.max_positions)
        if src and prefix and len(prefix) >= budget:
            raise ValueError(
                f"sentence {i + 1}: its prefix of {len(prefix)} tokens does not fit its length limit ({budget})"
            )
    return Prepared(ids, targets, phrase_ids(tokenizer, texts, decoding), owner, cut)


def joined(rows: list[list[Hypothesis]], sentence_of: list[int], n: int) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses from its rows': the k-th joins every piece's k-th (or last), scores summed."""
    pieces: list[list[list[Hypothesis]]] = [[] for _ in range(n)]
    for hyps, i in zip(rows, sentence_of):
        pieces[i].append(hyps)
    out = []
    for parts in pieces:
        if len(parts) == 1:
            out.append(parts[0])
            continue
        depth = max(len(hyps) for hyps in parts)
        chosen = [[hyps[min(k, len(hyps) - 1)] for hyps in parts] for k in range(depth)]
        out.append(
            [
                Hypothesis(
                    tokens=[t for h in hs for t in h.tokens],
                    score=sum(h.score for h in hs),
                    log_prob=sum(h.log_prob for h in hs),
                    terms_missed=any(h.terms_missed for h in hs),
                )
                for hs in chosen
            ]
        )
    return out


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


def word_starts(tokenizer: Tokenizer, vocab_size: int, eos_id: int) -> torch.Tensor:
    """(V,) True where a target piece starts a word (SentencePiece's "▁"), is punctuation only, or is EOS."""
    # The tokens after which a glossary term counts as a whole word (nanomt.decoding.constrained).
    pieces = tokenizer.tgt_pieces(list(range(min(vocab_size, tokenizer.tgt_vocab_size))))
    punctuation = lambda p: bool(p) and all(unicodedata.category(c).startswith("P") for c in p)  # noqa: E731
    starts = torch.zeros(vocab_size, dtype=torch.bool)
    starts[: len(pieces)] = torch.tensor([p.startswith("▁") or punctuation(p) for p in pieces], dtype=torch.bool)
    starts[eos_id] = True
    return starts


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
        if not self._calibration_at:
            return None
        try:
            return calib.load(*self._calibration_at)
        except calib.CalibrationError as e:
            # Read at the first confidence asked for: a damaged file is no calibration, as a missing one is, rather
            # than an error in every batch that asks (once: the None is cached).
            log.warning("%s: confidence uncalibrated (run nanomt calibrate)", e)
            return None

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
        prepared = prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)
        rows = self._decode(prepared, decoding, max_tokens, progress)
        return joined(rows, prepared.sentence_of, len(sentences))

    def _decode(
        self, prepared: Prepared, decoding: Decoding, max_tokens: int | None, progress: bool = False
    ) -> list[list[Hypothesis]]:
        """Every row's hypotheses: rows batched by length within the token budget, in input order."""
        ids = prepared.src
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
        **kwargs,
    ) -> list[list[tuple[str, float]]]:
        """The n_best (translation, score) pairs of every sentence (n_best: default the decoding's). With
        `replace_unknowns`, a source piece the vocabulary lacks is copied into each translation where the attention
        puts it (CTranslate2's replace_unknowns; here also where the translation has no unknown piece for it)."""
        hyps = self.translate_hypotheses(sentences, decoding, n_best=n_best, **kwargs)
        texts = [self.tokenizer.decode_tgt([h.tokens for h in hs]) for hs in hyps]
        if replace_unknowns:
            self._restore_unknowns(sentences, hyps, texts)
        return [list(zip(ts, [h.score for h in hs])) for ts, hs in zip(texts, hyps)]

    @torch.inference_mode()
    def translate_confident(
        self,
        sentences: list[str],
        decoding: Decoding | None = None,
        max_tokens: int | None = None,
        prefixes: list[str] | None = None,
        replace_unknowns: bool = False,
        **settings,
    ) -> list[Confident]:
        """Each sentence's best translation (as `translate` gives it) with its confidence and word probabilities,
        from the token scores the search keeps (a glossary's search keeps none: its translations are read back by
        one teacher-forced pass of the model; nanomt.decoding.quality)."""
        if isinstance(self.model, Ensemble):
            raise ValueError("confidence is one model's estimate: an ensemble has none (translate with one checkpoint)")
        decoding = (decoding or self.default_decoding).replace(**settings).replace(n_best=1, token_scores=True)
        prepared = prepare(self.tokenizer, self.cfg, sentences, decoding, prefixes)
        rows = self._decode(prepared, decoding, max_tokens)
        hyps = joined(rows, prepared.sentence_of, len(sentences))
        texts = [[t] for t in self.tokenizer.decode_tgt([h[0].tokens for h in hyps])]
        if replace_unknowns:
            self._restore_unknowns(sentences, [h[:1] for h in hyps], texts)
        read = self._token_scores(prepared.src, [h[0] for h in rows])  # per row; None: an empty one
        parts: list[list[int]] = [[] for _ in sentences]
        for k, i in enumerate(prepared.sentence_of):
            parts[i].append(k)
        out = []
        for i, h in enumerate(hyps):
            best = h[0]
            if read[parts[i][0]] is None:  # an empty line's empty translation
                out.append(Confident(texts[i][0], best.score, 1.0, 0.0))
                continue
            whole = TokenScores.join([read[k] for k in parts[i]])
            words = [w for k in parts[i] for w in self._words(rows[k][0].tokens, read[k])]
            features = whole.features()
            confidence = None if self.calibration is None else float(self.calibration.predict([features])[0])
            out.append(Confident(texts[i][0], best.score, confidence, whole.mean_log_prob, tuple(words), features))
        return out

    def _token_scores(self, src: list[list[int]], best: list[Hypothesis]) -> list[TokenScores | None]:
        """Each row's token scores: the search's, else read back by the model (None for an empty row)."""
        unk = self.tokenizer.unk_id
        out = [TokenScores.of(h, s, unk) if s else None for s, h in zip(src, best)]
        todo = [k for k, (s, r) in enumerate(zip(src, out)) if s and r is None]
        for k, r in zip(todo, read_back(self.model, [src[k] for k in todo], [best[k].tokens for k in todo], unk)):
            out[k] = r
        return out

    def _words(self, tokens: list[int], read: TokenScores) -> list[tuple[str, float]]:
        """A row's target words, each with its probability (EOS is no word)."""
        words = word_probabilities(self.tokenizer.tgt_pieces(tokens), read.log_probs[: len(tokens)])
        texts = self.tokenizer.decode_tgt([[tokens[k] for k in positions] for positions, _ in words])
        return [(text.strip(), round(p, 4)) for text, (_, p) in zip(texts, words) if text.strip()]

    @torch.inference_mode()
    def _restore_unknowns(self, sentences: list[str], hyps: list[list[Hypothesis]], texts: list[list[str]]) -> None:
        """texts[i][k] rewritten in place where sentence i has pieces the vocabulary lacks (a sentence decoded in
        pieces, or by an ensemble, has no one attention and is left as it is)."""
        ids, unk = self.tokenizer.encode_src(sentences), self.tokenizer.unk_id
        todo = [i for i, s in enumerate(ids) if unk in s and len(s) <= src_limit(self.cfg)]
        if not todo or isinstance(self.model, Ensemble):
            return
        unk_piece = self.tokenizer.tgt_pieces([unk])[0]
        for i, src_pieces in zip(todo, self.tokenizer.src_piece_texts([sentences[i] for i in todo])):
            src = ids[i] + [self.cfg.model.eos_id]
            unknown = [j for j, t in enumerate(ids[i]) if t == unk]
            for k, h in enumerate(hyps[i]):
                cross = self._weights([src], [h.tokens])["cross"]  # per layer (1, H, T, S)
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
        decoding = (decoding or self.default_decoding.replace(beam_size=1)).replace(**settings)
        decoding = decoding.replace(beam_size=beam_size, n_best=1)
        prepared = prepare(self.tokenizer, self.cfg, [sentence], decoding, None)
        if prepared.cut:
            raise ValueError(f"the sentence is longer than the model's {src_limit(self.cfg)} tokens: no one attention")
        src_ids = prepared.src[0] or [self.cfg.model.eos_id]
        tgt_ids = self._decode(prepared, decoding, None)[0][0].tokens
        weights = self._weights([src_ids], [tgt_ids])
        to_np = lambda ws: [w[0].float().cpu().numpy() for w in ws]  # noqa: E731
        return SentenceAttention(
            src_tokens=self.tokenizer.src_pieces(src_ids[:-1]) + ["</s>"],
            tgt_tokens=self.tokenizer.tgt_pieces(tgt_ids) + ["</s>"],
            translation=self.tokenizer.decode_tgt([tgt_ids])[0],
            encoder=to_np(weights["encoder"]),
            decoder=to_np(weights["decoder"]),
            cross=to_np(weights["cross"]),
        )

    def _weights(self, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> dict:
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
        decoding = (decoding or self.default_decoding).replace(n_best=1)
        prepared = prepare(self.tokenizer, self.cfg, sentences, decoding, None)
        best = [
            h[0].tokens
            for h in joined(self._decode(prepared, decoding, max_tokens), prepared.sentence_of, len(sentences))
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
            cross = self._weights(src_ids, [best[i] for i in idx])["cross"]  # per layer (B, H, T, S)
            for row, i in enumerate(idx):
                t, s = len(best[i]) + 1, len(src_ids[row])
                layers = [w[row, :, :t, :s].float().cpu().numpy() for w in cross]
                src_pieces = tuple(self.tokenizer.src_pieces(src_ids[row][:-1])) + ("</s>",)
                tgt_pieces = tuple(self.tokenizer.tgt_pieces(best[i])) + ("</s>",)
                out[i] = Alignment(texts[i], src_pieces, tgt_pieces, cross_attention(layers))
        return out
