"""Export to Hugging Face Marian: a nanomt checkpoint as the directory that `MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` load (no transformers here: the JSON and safetensors files are written directly).

What Marian expresses, and how nanomt's options map onto it:
- Post-norm layers, relu/gelu/swish, embeddings scaled by sqrt(d_model) (scale_embedding), encoder and decoder
  depths of their own, shared embeddings (share_encoder_decoder_embeddings) and a tied output (tie_word_embeddings)
  in any combination, the output bias (final_logits_bias), dropout, attention_dropout and activation_dropout, the
  pad and eos ids, and bos_id as the decoder_start_token_id. The rows past the vocabulary (vocab_multiple) are left
  out. Sinusoidal positions in the "halves" layout are Marian's table, which transformers computes (never stored).
- restrict_output: final_logits_bias is -inf at the ids the model does not score, as nanomt's logits have them.
  The Trainer's label smoothing sums the log-probs of every id, so its loss is infinite there: to fine-tune with it,
  give those ids a large finite negative bias.
- Refused, naming the option: norm_first: true (Marian has no pre-norm layers nor final LayerNorms), positional:
  learned, sinusoidal_layout: interleaved (3.5's sin/cos pairs), a layer_norm_eps other than 1e-5 (transformers'
  nn.LayerNorm default, no config field), an ensemble (a Marian directory holds one model).
- Decoding (generation_config.json, as `interop.marian.decode_config` reads it): num_beams, min_length and
  max_length (both count the decoder's start token), forced_eos_token_id null (nanomt cuts a translation at its
  budget without forcing EOS), bad_words_ids PAD and BOS (nanomt never generates them); with a beam, early_stopping
  and length_penalty. length_penalty_kind "average" is transformers' score and "none" its length_penalty 0; "gnmt"
  has no counterpart and keeps its alpha as transformers' len^alpha. max_len_a (a budget relative to the source)
  has none either: the budget is then max_positions tokens. max_tokens (nanomt's batching) is not exported.
- Tokenizer: source.spm and target.spm, vocab.json (and target_vocab.json where the two sides' ids differ) mapping
  each piece to its nanomt id, so that MarianTokenizer gives nanomt's ids. MarianTokenizer names pad, unk and eos
  "<pad>", "<unk>" and "</s>": the pieces nanomt's SentencePiece models and Marian's id tables give those ids.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanomt.core.checkpoint import check_new_dir, find_run_files, load_checkpoint
from nanomt.core.config import DecodeConfig, ModelConfig, load_config
from nanomt.core.tokenizer import SHARED_FILE, SRC_FILE, TABLE_SPECIALS, TGT_FILE, Tokenizer
from nanomt.interop.marian import layer_names

MARIAN_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which MarianEncoderLayer and MarianDecoderLayer keep
WEIGHTS = "model.safetensors"


class MarianExportError(ValueError):
    """A checkpoint or setting that Hugging Face's Marian cannot express."""


def check_exportable(m: ModelConfig) -> None:
    """Raise MarianExportError, naming the option, for a model MarianMTModel cannot hold."""
    if m.norm_first:
        raise MarianExportError("model.norm_first: true (pre-norm) has no Marian counterpart; Marian is post-norm")
    if m.positional != "sinusoidal":
        raise MarianExportError(f"model.positional: {m.positional} has no Marian counterpart; Marian's are sinusoidal")
    if m.sinusoidal_layout != "halves":
        raise MarianExportError(
            f"model.sinusoidal_layout: {m.sinusoidal_layout} is not Marian's table (halves: sines, then cosines)"
        )
    if m.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        raise MarianExportError(
            f"model.layer_norm_eps: {m.layer_norm_eps} is not Marian's {MARIAN_LAYER_NORM_EPS} (no config field)"
        )


def export_marian(run: str | Path | Sequence[str | Path], out: str | Path) -> Path:
    """Write a Hugging Face Marian directory (config, generation config, weights, tokenizer) for a checkpoint."""
    runs = [run] if isinstance(run, str | Path) else list(run)
    if len(runs) != 1:
        raise MarianExportError(f"a Marian directory holds one model, not an ensemble of {len(runs)} checkpoints")
    run, out = Path(runs[0]), Path(out)
    config_path, tokenizer_dir = find_run_files(run)
    cfg = load_config(config_path)
    check_exportable(cfg.model)
    check_new_dir(out, error=MarianExportError)
    model, cfg, _ = load_checkpoint(run)
    weights = marian_weights(model.state_dict(), cfg.model)
    files = tokenizer_files(tokenizer_dir, cfg.model)
    files["config.json"] = _json(marian_config(cfg.model, weights["final_logits_bias"].dtype))
    files["generation_config.json"] = _json(generation_config(cfg.model, cfg.decode))
    return _write_dir(out, files, weights)


def marian_config(m: ModelConfig, dtype: torch.dtype) -> dict:
    """config.json: MarianConfig's fields for the model (all of them, so that no version's default applies)."""
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": m.src_vocab_size,
        "decoder_vocab_size": m.tgt_vocab_size,
        "d_model": m.d_model,
        "encoder_layers": m.n_encoder_layers,
        "decoder_layers": m.n_decoder_layers,
        "encoder_attention_heads": m.n_heads,
        "decoder_attention_heads": m.n_heads,
        "encoder_ffn_dim": m.d_ff,
        "decoder_ffn_dim": m.d_ff,
        "activation_function": m.activation,  # transformers' "gelu" is the erf GELU, as torch's F.gelu
        "max_position_embeddings": m.max_positions,
        "scale_embedding": True,  # 3.4: embeddings times sqrt(d_model)
        "share_encoder_decoder_embeddings": m.share_embeddings,
        "tie_word_embeddings": m.tie_output,
        "dropout": m.dropout,
        "attention_dropout": m.attention_dropout,
        "activation_dropout": m.activation_dropout,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "init_std": m.init_std if m.init_std is not None else 0.02,  # only a new model's initialization
        "pad_token_id": m.pad_id,
        "eos_token_id": m.eos_id,
        "bos_token_id": None,
        "decoder_start_token_id": m.bos_id,
        "forced_eos_token_id": None,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def generation_config(m: ModelConfig, d: DecodeConfig) -> dict:
    """generation_config.json: the run's decoding defaults, as `interop.marian.decode_config` reads them back."""
    budget = max(1, min(d.max_len_b, m.max_positions)) if d.max_len_a == 0 else m.max_positions
    gen = {
        "decoder_start_token_id": m.bos_id,
        "eos_token_id": m.eos_id,
        "pad_token_id": m.pad_id,
        "forced_eos_token_id": None,
        "bad_words_ids": [[i] for i in sorted({m.pad_id, m.bos_id})],
        "num_beams": d.beam_size,
        "max_length": budget + 1,  # + the decoder's start token
        "min_length": d.min_len + 1 if d.min_len else 0,
    }
    if d.beam_size > 1:  # beam search's own settings; transformers warns of them beside greedy decoding
        gen["length_penalty"] = 0.0 if d.length_penalty_kind == "none" else d.length_penalty
        gen["early_stopping"] = d.early_stopping
    return gen


@torch.no_grad()
def marian_weights(state: dict[str, torch.Tensor], m: ModelConfig) -> dict[str, torch.Tensor]:
    """MarianMTModel's tensors, named and laid out as its `save_pretrained` writes them."""
    src_v, tgt_v = m.src_vocab_size, m.tgt_vocab_size
    src = state["src_embed.tokens.weight"][:src_v]  # the rows past the vocabulary only pad the matrices
    tgt = state["tgt_embed.tokens.weight"][:tgt_v]
    out = {}
    if m.share_embeddings:
        out["model.shared.weight"] = src
        if not m.tie_output:  # transformers then ties nothing, and loads each copy
            out |= {"model.encoder.embed_tokens.weight": src, "model.decoder.embed_tokens.weight": src}
    else:
        out |= {"model.encoder.embed_tokens.weight": src, "model.decoder.embed_tokens.weight": tgt}
    if not m.tie_output:
        out["lm_head.weight"] = state["output.weight"][:tgt_v]
    bias = state["output.bias"][:tgt_v] if m.output_bias else torch.zeros(tgt_v, dtype=src.dtype)
    if m.restrict_output:  # the ids the model does not score: -inf logits, as nanomt's Transformer.logits
        bias = bias.masked_fill(~state["output_mask"], float("-inf"))
    out["final_logits_bias"] = bias[None]  # (1, V)
    for prefix, n_layers in (("encoder", m.n_encoder_layers), ("decoder", m.n_decoder_layers)):
        for i in range(n_layers):
            for ours, theirs in layer_names(i, prefix).items():
                # A fused projection (Q/K/V, K/V) splits back into Marian's separate ones along dim 0.
                for name, part in zip(theirs, state[ours].chunk(len(theirs))):
                    out[f"model.{name}"] = part
    # Own, contiguous storage each: safetensors refuses tensors that share memory.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in out.items()}


def _id_table(pieces: list[str]) -> dict[str, int]:
    return {piece: i for i, piece in enumerate(pieces)}


def tokenizer_files(tokenizer_dir: Path, m: ModelConfig) -> dict[str, bytes]:
    """source.spm, target.spm, vocab.json (+ target_vocab.json) and tokenizer_config.json of a nanomt tokenizer."""
    tokenizer = Tokenizer.load(tokenizer_dir)
    src = _id_table(tokenizer.src_pieces(list(range(tokenizer.src_vocab_size))))
    tgt = _id_table(tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size))))
    ids = {"pad": m.pad_id, "unk": None, "eos": m.eos_id}
    for side, table in (("source", src), ("target", tgt)):
        for kind, piece in TABLE_SPECIALS.items():
            if piece not in table or ids[kind] not in (None, table[piece]):
                found = f"at id {table[piece]}" if piece in table else "nowhere"
                where = "" if ids[kind] is None else f" at model.{kind}_id {ids[kind]}"
                raise MarianExportError(
                    f"tokenizer: the {side} vocabulary has {piece!r} {found}; MarianTokenizer needs it{where}"
                )
    shared = tokenizer_dir / SHARED_FILE
    src_spm, tgt_spm = (shared, shared) if shared.is_file() else (tokenizer_dir / SRC_FILE, tokenizer_dir / TGT_FILE)
    separate = src != tgt
    files = {"source.spm": src_spm.read_bytes(), "target.spm": tgt_spm.read_bytes(), "vocab.json": _json(src)}
    if separate:
        files["target_vocab.json"] = _json(tgt)
    files["tokenizer_config.json"] = _json(tokenizer_config(src, separate, m.max_positions))
    return files


def tokenizer_config(src: dict[str, int], separate: bool, max_positions: int) -> dict:
    """tokenizer_config.json as `MarianTokenizer.save_pretrained` writes it."""
    special = sorted((src[piece], piece) for piece in TABLE_SPECIALS.values())
    added = {
        str(i): {
            "content": piece,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, piece in special
    }
    return {
        "added_tokens_decoder": added,
        "eos_token": TABLE_SPECIALS["eos"],
        "model_max_length": max_positions,  # source tokens, EOS included
        "pad_token": TABLE_SPECIALS["pad"],
        "separate_vocabs": separate,
        "source_lang": None,
        "sp_model_kwargs": {},
        "target_lang": None,
        "tokenizer_class": "MarianTokenizer",
        "unk_token": TABLE_SPECIALS["unk"],
    }


def _json(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _write_dir(out: Path, files: dict[str, bytes], weights: dict[str, torch.Tensor]) -> Path:
    """Write the files into a temporary directory renamed into place: a failed export leaves nothing at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / WEIGHTS).touch()  # safetensors writes its file 0600; this one gets the umask's mode, as the others
        mode = stat.S_IMODE((tmp / WEIGHTS).stat().st_mode)
        save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})  # transformers checks the format
        os.chmod(tmp / WEIGHTS, mode)
        if out.is_dir():  # an empty directory, checked before
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
