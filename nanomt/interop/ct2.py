"""Export to CTranslate2, and decoding with the export by nanomt's rules (the same outputs as nanomt's Translator).

This module never imports torch, nor a nanomt module that does (nanomt.core.decoding is standard library only):
CTranslate2 in a process that has imported torch ran ~2.5x slower (two OpenMP runtimes), so the checkpoint is read
with safetensors' numpy loader and PyYAML, and a torch-free process may load this file on its own
(benchmarks/ct2_convert.py does).
The `nanomt export ct2` command converts in its own (torch) process: only translation speed would suffer there.

What CTranslate2 expresses, and how nanomt's options map onto it:
- pre- and post-norm, relu/gelu/swish, learned or sinusoidal positions (either layout: the table itself is
  exported), shared embeddings and tied output (copies), layer_norm_eps, the output bias, bos_id/eos_id
  (the decoder's start and end tokens), Marian's id tables (the vocabulary lists follow the ids).
- restrict_output: an output bias of -inf on the ids the model does not score, as nanomt's logits have it.
- Decoding (`Ct2Translator`): a setting whose field in nanomt.core.decoding names a CTranslate2 option (its `ct2`)
  is passed as it is: min_len (min_decoding_length), no_repeat_ngram_size, repetition_penalty, shortlist (use_vmap:
  the export writes the checkpoint's shortlist as CTranslate2's vocabulary map); one CTranslate2 lacks (its field
  says why) is refused unless it is at its default. max_len_a/b per sentence (sentences grouped by their budget,
  CTranslate2's max_decoding_length counts the same generated tokens, EOS included).
  Beam search: CTranslate2 scores log_prob / n^alpha with n the tokens before EOS; nanomt's "gnmt" and
  "average" count EOS in the length, so CTranslate2 searches with a length penalty too small to change a
  float32 score (it still stops once beam_size hypotheses are finished, fairseq's rule, as nanomt with
  early_stopping) and the beam_size hypotheses it returns are rescored by nanomt's formula. "none" (or
  alpha 0) needs no rescoring. early_stopping: false with a length penalty (Hugging Face's rule) has no
  CTranslate2 counterpart and is refused.
  A forced prefix is CTranslate2's target_prefix. CTranslate2 applies the repetition guards to the logits, nanomt
  (as transformers) to the scores the search ranks, the logits in greedy decoding and the log-probs in beam search,
  so greedy agrees and beam search may not. A glossary (lexically constrained search) and sampling are refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import sentencepiece as spm
import yaml
from safetensors.numpy import load_file

from nanomt.core.decoding import MAX_TOKENS, Decoding

CONFIG, TOKENIZER, WEIGHTS = "config.yaml", "tokenizer", "model.safetensors"
# The run's config.yaml, kept next to CTranslate2's files: the decoding settings and special ids travel with it.
EXPORTED_CONFIG = "nanomt.yaml"
INSTALL_HINT = "pip install 'nanomt[export]'"
# Small enough that x / n**TINY_PENALTY == x in float32 for any length n < 10**6, and not 0: CTranslate2
# stops early on a zero penalty (once its best beam ends), on a nonzero one after beam_size hypotheses.
TINY_PENALTY = 1e-9
MODEL_DEFAULTS = {
    "norm_first": True,
    "activation": "relu",
    "positional": "sinusoidal",
    "sinusoidal_layout": "interleaved",
    "share_embeddings": False,
    "tie_output": False,
    "restrict_output": False,
    "output_bias": False,
    "layer_norm_eps": 1e-5,
    "pad_id": 0,
    "bos_id": 2,
    "eos_id": 3,
}


class Ct2ExportError(ValueError):
    """A checkpoint or setting that CTranslate2 cannot express."""


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ImportError(f"exporting to CTranslate2 needs the ctranslate2 package: {INSTALL_HINT}") from None
    return ctranslate2


# ---------------------------------------------------------------------------------------------------------
# Reading a run directory without torch.
# ---------------------------------------------------------------------------------------------------------


def run_files(run: Path) -> tuple[Path, Path]:
    """config.yaml and tokenizer/ of a checkpoint: in it, or in the run dir above checkpoints/step_N."""
    for root in (run, run.parent.parent):
        if (root / CONFIG).is_file() and (root / TOKENIZER).is_dir():
            return root / CONFIG, root / TOKENIZER
    raise Ct2ExportError(f"{run}: not a nanomt checkpoint (needs {CONFIG}, {TOKENIZER}/ and {WEIGHTS})")


def sentencepiece_models(tokenizer_dir: Path) -> tuple[spm.SentencePieceProcessor, spm.SentencePieceProcessor]:
    """Source and target SentencePiece processors (one shared spm.model, or src.model + tgt.model)."""
    shared = tokenizer_dir / "spm.model"
    paths = (shared, shared) if shared.is_file() else (tokenizer_dir / "src.model", tokenizer_dir / "tgt.model")
    return tuple(spm.SentencePieceProcessor(model_file=str(p)) for p in paths)


def _id_table(path: Path) -> list[str] | None:
    """The pieces of an id table (Marian's vocab.json), in id order; None if there is none."""
    if not path.is_file():
        return None
    ids = json.loads(path.read_text(encoding="utf-8"))
    pieces = [""] * len(ids)
    for piece, i in ids.items():
        pieces[i] = piece
    return pieces


def vocabularies(tokenizer_dir: Path) -> tuple[list[str], list[str]]:
    """The piece of every source and target id, as nanomt numbers them (SentencePiece's ids or an id table)."""
    src_sp, tgt_sp = sentencepiece_models(tokenizer_dir)
    src_table = _id_table(tokenizer_dir / "vocab.json")
    if src_table is not None:
        return src_table, _id_table(tokenizer_dir / "target_vocab.json") or src_table
    return tuple([sp.id_to_piece(i) for i in range(sp.get_piece_size())] for sp in (src_sp, tgt_sp))


def sinusoidal_table(n_positions: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
    """nanomt.core.model.sinusoidal_table in numpy: sin/cos pairs (3.5), or every sine before every cosine."""
    position = np.arange(n_positions, dtype=np.float64)[:, None]
    inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-np.log(10000.0) / d_model))
    sin, cos = np.sin(position * inv_freq), np.cos(position * inv_freq)
    if layout == "halves":
        return np.concatenate([sin, cos], axis=1).astype(np.float32)
    table = np.zeros((n_positions, d_model))
    table[:, 0::2], table[:, 1::2] = sin, cos
    return table.astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# The converter.
# ---------------------------------------------------------------------------------------------------------


def _set_linear(spec, w: dict, name: str) -> None:
    """Weight (and bias, if any) of nanomt's nn.Linear `name` into a CTranslate2 LinearSpec."""
    spec.weight = w[f"{name}.weight"]  # (out, in), as torch stores it
    if f"{name}.bias" in w:
        spec.bias = w[f"{name}.bias"]


def _set_norm(spec, w: dict, name: str) -> None:
    """Gain and bias of nanomt's LayerNorm `name` into a CTranslate2 LayerNormSpec."""
    spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]


def check_exportable(model: dict) -> None:
    """Raise Ct2ExportError for a model CTranslate2's Transformer cannot hold."""
    for side in ("encoder", "decoder"):
        if model[f"n_{side}_layers"] < 1:
            raise Ct2ExportError(f"CTranslate2's Transformer needs at least one {side} layer (n_{side}_layers: 0)")


def build_spec(model: dict, w: dict, src_vocab: list[str], tgt_vocab: list[str]):
    """A CTranslate2 TransformerSpec holding nanomt's weights (names as in nanomt.core.model)."""
    from ctranslate2.specs import common_spec, transformer_spec

    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,  # erf GELU, as torch's F.gelu
        "swish": common_spec.Activation.SWISH,
    }
    check_exportable(model)
    pre_norm = model["norm_first"]
    spec = transformer_spec.TransformerSpec.from_config(
        (model["n_encoder_layers"], model["n_decoder_layers"]),
        model["n_heads"],
        pre_norm=pre_norm,
        activation=activations[model["activation"]],
    )
    # Rows past the vocabulary only pad the matrices (vocab_multiple): CTranslate2 gets one row per id.
    src_v, tgt_v = model["src_vocab_size"], model["tgt_vocab_size"]
    src_embed = w["src_embed.tokens.weight"][:src_v]
    tgt_embed = src_embed if model["share_embeddings"] else w["tgt_embed.tokens.weight"][:tgt_v]
    output = tgt_embed if model["tie_output"] else w["output.weight"][:tgt_v]

    def positions(side: str) -> np.ndarray:
        if model["positional"] == "learned":
            return w[f"{side}_embed.positions.weight"]
        return sinusoidal_table(model["max_positions"], model["d_model"], model["sinusoidal_layout"])

    # Both sides: embeddings scaled by sqrt(d_model) (3.4), then positions; CTranslate2 does the same.
    spec.encoder.embeddings[0].weight = src_embed
    spec.encoder.position_encodings.encodings = positions("src")
    spec.decoder.embeddings.weight = tgt_embed
    spec.decoder.position_encodings.encodings = positions("tgt")
    spec.decoder.projection.weight = output
    bias = w["output.bias"][:tgt_v] if model["output_bias"] else None
    if model["restrict_output"]:
        # The ids the model does not score get -inf logits, as nanomt's `Transformer.logits` gives them.
        bias = np.where(w["output_mask"].astype(bool), 0.0, -np.inf).astype(np.float32)
    if bias is not None:
        spec.decoder.projection.bias = bias
    if pre_norm:  # the final LayerNorm of each stack
        _set_norm(spec.encoder.layer_norm, w, "encoder_norm")
        _set_norm(spec.decoder.layer_norm, w, "decoder_norm")
    for i, layer in enumerate(spec.encoder.layer):
        p = f"encoder.{i}"
        _set_linear(layer.self_attention.linear[0], w, f"{p}.self_attn.qkv")  # fused Q/K/V in both
        _set_linear(layer.self_attention.linear[1], w, f"{p}.self_attn.out")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_linear(layer.ffn.linear_0, w, f"{p}.ffn.w1")
        _set_linear(layer.ffn.linear_1, w, f"{p}.ffn.w2")
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm2")
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder.{i}"
        _set_linear(layer.self_attention.linear[0], w, f"{p}.self_attn.qkv")
        _set_linear(layer.self_attention.linear[1], w, f"{p}.self_attn.out")
        _set_norm(layer.self_attention.layer_norm, w, f"{p}.norm1")
        _set_linear(layer.attention.linear[0], w, f"{p}.cross_attn.q")
        _set_linear(layer.attention.linear[1], w, f"{p}.cross_attn.kv")  # fused K/V in both
        _set_linear(layer.attention.linear[2], w, f"{p}.cross_attn.out")
        _set_norm(layer.attention.layer_norm, w, f"{p}.norm2")
        _set_linear(layer.ffn.linear_0, w, f"{p}.ffn.w1")
        _set_linear(layer.ffn.linear_1, w, f"{p}.ffn.w2")
        _set_norm(layer.ffn.layer_norm, w, f"{p}.norm3")
    spec.config.layer_norm_epsilon = model["layer_norm_eps"]
    # nanomt's sources end with EOS; the decoder starts from bos_id and stops at eos_id.
    spec.config.add_source_eos = True
    spec.config.eos_token = tgt_vocab[model["eos_id"]]
    spec.config.bos_token = spec.config.decoder_start_token = tgt_vocab[model["bos_id"]]
    if "<unk>" in tgt_vocab:
        spec.config.unk_token = "<unk>"
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def read_model_config(config_path: Path) -> tuple[dict, dict]:
    """The model and decode sections of a config.yaml, with nanomt's defaults filled in."""
    cfg = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    return {**MODEL_DEFAULTS, **cfg["model"]}, {"max_tokens": MAX_TOKENS, **(cfg.get("decode") or {})}


VMAP = "vmap.txt"  # the vocabulary map's name in a CTranslate2 model directory


def export_ct2(run: str | Path, out: str | Path, quantization: str | None = None) -> Path:
    """Write a CTranslate2 model directory (plus tokenizer/ and nanomt.yaml) for a nanomt checkpoint."""
    # quantization: CTranslate2's (int8, int8_float16, float16, ...) for the stored weights; None keeps
    # float32, from which CTranslate2 still quantizes at load time (Translator(compute_type=...)).
    _ctranslate2()  # fail early, with the install hint
    run, out = Path(run), Path(out)
    config_path, tokenizer_dir = run_files(run)
    weights_path = run / WEIGHTS
    if not weights_path.is_file():
        raise Ct2ExportError(f"{run}: no {WEIGHTS}")
    model, _ = read_model_config(config_path)
    check_exportable(model)
    src_vocab, tgt_vocab = vocabularies(tokenizer_dir)
    if (len(src_vocab), len(tgt_vocab)) != (model["src_vocab_size"], model["tgt_vocab_size"]):
        raise Ct2ExportError(f"{run}: the tokenizer's vocabularies do not match the model's sizes")
    weights = load_file(str(weights_path))
    spec = build_spec(model, weights, src_vocab, tgt_vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    shutil.copytree(tokenizer_dir, out / TOKENIZER, dirs_exist_ok=True)
    shutil.copyfile(config_path, out / EXPORTED_CONFIG)
    write_vmap(weights_path.parent, tokenizer_dir, out, src_vocab, tgt_vocab)
    return out


def write_vmap(run: Path, tokenizer_dir: Path, out: Path, src_vocab: list[str], tgt_vocab: list[str]) -> Path | None:
    """The checkpoint's vocabulary shortlist (`nanomt shortlist`), if it has one, as CTranslate2's vocabulary map:
    a line per source piece, `piece<TAB>target pieces`, and one with an empty key for the pieces every batch allows.
    CTranslate2 reads it from the model directory when asked to (translate_batch(use_vmap=True))."""
    from nanomt.core.tokenizer import Tokenizer
    from nanomt.decoding.shortlist import SHORTLIST, Shortlist  # torch, at export time only

    if not (run / SHORTLIST).is_file():
        return None
    shortlist = Shortlist.load(run, Tokenizer.load(tokenizer_dir).fingerprint())
    lines = [f"\t{' '.join(tgt_vocab[t] for t in shortlist.frequent)}"]
    lines += [f"{src_vocab[s]}\t{' '.join(tgt_vocab[t] for t in ts)}" for s, ts in sorted(shortlist.table.items())]
    path = out / VMAP
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# Decoding with the export as nanomt decodes.
# ---------------------------------------------------------------------------------------------------------


class Ct2Translator:
    """A CTranslate2 export (`export_ct2`) decoded with nanomt's rules: its translations are nanomt's."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", compute_type: str = "default", **kwargs):
        """kwargs go to ctranslate2.Translator (intra_threads, inter_threads, ...)."""
        ctranslate2 = _ctranslate2()
        model_dir = Path(model_dir)
        self.model, self.decode = read_model_config(model_dir / EXPORTED_CONFIG)
        self.translator = ctranslate2.Translator(str(model_dir), device=device, compute_type=compute_type, **kwargs)
        tokenizer_dir = model_dir / TOKENIZER
        self.src_sp, self.tgt_sp = sentencepiece_models(tokenizer_dir)
        self.tables = (tokenizer_dir / "vocab.json").is_file()
        self.src_vocab, self.tgt_vocab = vocabularies(tokenizer_dir)
        self.src_ids = {p: i for i, p in enumerate(self.src_vocab)}
        self.tgt_ids = {p: i for i, p in enumerate(self.tgt_vocab)}
        # The source gets an EOS, so it may hold one token less than the model's positions.
        self.max_src_tokens = self.model["max_positions"] - 1

    @property
    def decoding(self):
        """The export's decoding settings (nanomt.core.decoding.Decoding), from its config's decode section."""
        return Decoding.from_config(self.decode)

    def max_len(self, src_len: int) -> int:
        """nanomt.Translator's generation budget (tokens, EOS included) for a source of src_len tokens."""
        return self.decoding.max_len(src_len, self.model["max_positions"])

    def search_options(self, d: Decoding) -> dict:
        """translate_batch's options for nanomt's decoding `d` (see the module docstring): each setting with a
        CTranslate2 option of its own passed as it is, the search's own mapped here, the others refused."""
        options = {"beam_size": d.beam_size, "max_input_length": 0}
        options.update(max_batch_size=self.decode["max_tokens"], batch_type="tokens")
        for f in dataclasses.fields(d):
            option, value = f.metadata["ct2"], getattr(d, f.name)
            if option is None and value != f.default:
                raise Ct2ExportError(f"{f.name}: {f.metadata['absent']['ct2']}")
            if option not in (None, "nanomt"):
                options[option] = value
        if d.beam_size == 1 or d.length_penalty_kind == "none" or d.length_penalty == 0:
            return {**options, "length_penalty": 0.0}
        if not d.early_stopping:
            raise Ct2ExportError(
                "decode.early_stopping: false with a length penalty (Hugging Face's stopping rule) has no "
                "CTranslate2 counterpart; use early_stopping: true or length_penalty_kind: none"
            )
        return {**options, "length_penalty": TINY_PENALTY, "num_hypotheses": d.beam_size, "return_scores": True}

    def translate_ids(
        self,
        src: list[list[int]],
        beam_size: int | None = None,
        length_penalty: float | None = None,
        prefixes: list[list[int]] | None = None,
    ) -> list[list[int]]:
        """Source ids (no EOS) -> target ids (no BOS/EOS), as nanomt's Translator decodes them with the export's
        decoding (its beam size and length penalty changed where given); each translation starts with its prefix
        ids, where given (CTranslate2's target_prefix)."""
        d = self.decoding.replace(beam_size=beam_size, length_penalty=length_penalty)
        options = self.search_options(d)
        src = [s[: self.max_src_tokens] for s in src]
        todo = [i for i, s in enumerate(src) if s]  # empty lines translate to empty lines
        budgets = {i: self.max_len(len(src[i])) for i in todo}
        results: list[list[int]] = [[] for _ in src]
        if d.beam_size == 1:
            # Greedy tokens do not depend on the budget: one call with the largest, each output cut to its own.
            groups = {max(budgets.values(), default=1): todo}
        else:  # CTranslate2 takes one max_decoding_length a call, and beam search depends on it
            groups = defaultdict(list)
            for i in todo:
                groups[budgets[i]].append(i)
        for max_len, idx in groups.items():
            tokens = [[self.src_vocab[t] for t in src[i]] for i in idx]
            if prefixes is not None:
                options["target_prefix"] = [[self.tgt_vocab[t] for t in prefixes[i]] for i in idx]
            outs = self.translator.translate_batch(tokens, max_decoding_length=max_len, **options)
            for i, out in zip(idx, outs):
                best = out.hypotheses[0][: budgets[i]]
                if options.get("return_scores"):
                    best = self.rescore(out.hypotheses, out.scores, max_len, d)
                results[i] = [self.tgt_ids[p] for p in best]
        return results

    @staticmethod
    def rescore(hypotheses: list[list[str]], scores: list[float], max_len: int, d: Decoding) -> list[str]:
        """The best hypothesis by nanomt's length penalty (scores are the plain log-probs here): the one nanomt would
        pick; a hypothesis of `max_len` tokens was cut there, without an EOS."""
        best, best_score = hypotheses[0], -math.inf
        for hyp, log_prob in zip(hypotheses, scores):
            # Fewer than max_len tokens: it ended with EOS, which nanomt counts; max_len: cut without one.
            length = len(hyp) + 1 if len(hyp) < max_len else max_len
            score = log_prob / d.penalty(length)
            if score > best_score:
                best, best_score = hyp, score
        return best

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Source sentences -> ids (no EOS), as nanomt's tokenizer gives them."""
        if not self.tables:
            return self.src_sp.encode(sentences)
        unk = self.src_ids.get("<unk>", 1)
        out = []
        for text in sentences:
            end = text.find("<<") if text.startswith(">>") else -1  # a language tag such as >>fra<< is one piece
            tag, rest = ([text[: end + 2]], text[end + 2 :]) if end != -1 else ([], text)
            out.append([self.src_ids.get(p, unk) for p in tag + self.src_sp.encode(rest, out_type=str)])
        return out

    def decode_ids(self, ids: list[list[int]]) -> list[str]:
        """Target ids -> text."""
        if not self.tables:
            return self.tgt_sp.decode(ids)
        special = {self.model["pad_id"], self.model["eos_id"], self.tgt_ids.get("<unk>")}  # skipped, as nanomt's
        pieces = [[self.tgt_vocab[i] for i in s if i not in special] for s in ids]
        return [self.tgt_sp.decode_pieces(p).replace("\u2581", " ").strip() for p in pieces]

    def translate(self, sentences: list[str], beam_size: int | None = None, **kwargs) -> list[str]:
        """One translation per sentence, nanomt's for the same checkpoint and settings."""
        return self.decode_ids(self.translate_ids(self.encode(sentences), beam_size, **kwargs))
