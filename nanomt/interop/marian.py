"""A Hugging Face Marian directory, as `save_pretrained` writes it, as a nanomt run directory (no transformers)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from nanomt.core.checkpoint import TOKENIZER, model_state, write_checkpoint_dir
from nanomt.core.config import Config, DataConfig, DecodeConfig, ModelConfig
from nanomt.core.model import Transformer, sinusoidal_table
from nanomt.core.tokenizer import TABLE_SPECIALS, Tokenizer

# MarianConfig's and GenerationConfig's defaults, for keys a config.json leaves out (older versions of
# transformers write only the values that differ from them).
MARIAN_DEFAULTS = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_layers": 12,
    "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "d_model": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "init_std": 0.02,
    "decoder_start_token_id": 58100,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
GENERATION_DEFAULTS = {
    "num_beams": 1,
    "length_penalty": 1.0,
    "early_stopping": False,
    "max_length": 20,
    "max_new_tokens": None,
    "min_length": 0,
    "bad_words_ids": None,
}
# Keys of the BART-style configs older conversions wrote, at the only values whose model this import builds.
ARCHITECTURE_FLAGS = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "static_position_embeddings": True,
    "add_bias_logits": False,
    "layernorm_embedding": False,
}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


class MarianImportError(ValueError):
    """A Marian directory that nanomt cannot map: a missing file, another architecture, an unsupported field."""


def import_marian(hf_dir: str | Path, out: str | Path) -> Path:
    """Write the run directory `out` (config.yaml, tokenizer/, model.safetensors) of a Marian directory."""
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise MarianImportError(f"{hf_dir}: not a directory")
    hf = {**MARIAN_DEFAULTS, **GENERATION_DEFAULTS, **_read_json(hf_dir / "config.json")}
    generation = hf_dir / "generation_config.json"
    if generation.is_file():  # newer versions of transformers keep decoding settings apart
        hf.update({k: v for k, v in _read_json(generation).items() if k in GENERATION_DEFAULTS})
    data = DataConfig(shared_vocab=hf["share_encoder_decoder_embeddings"])
    cfg = Config(model=model_config(hf), data=data, decode=decode_config(hf))
    tokenizer = read_tokenizer(hf_dir, cfg.model)
    model = Transformer(cfg.model)
    load_marian_weights(model, read_marian_weights(hf_dir))
    tokenizer.save(out / TOKENIZER)
    return write_checkpoint_dir(out, cfg, out / TOKENIZER, model_state(model))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise MarianImportError(f"{path.parent}: no {path.name}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MarianImportError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise MarianImportError(f"{path}: not a JSON object")
    return data


def _same(hf: dict, a: str, b: str) -> Any:
    """The value of two fields nanomt has one of; different values are an error naming both."""
    if hf[a] != hf[b]:
        raise MarianImportError(f"config.json: {a} ({hf[a]}) != {b} ({hf[b]}); nanomt has one value for both")
    return hf[a]


def model_config(hf: dict) -> ModelConfig:
    """nanomt's ModelConfig of a Marian config.json (with defaults filled in); what does not map is an error."""
    if hf.get("model_type") != "marian":
        raise MarianImportError(f"config.json: model_type is {hf.get('model_type')!r}, not 'marian'")
    architectures = hf.get("architectures") or ["MarianMTModel"]
    if "MarianMTModel" not in architectures:
        raise MarianImportError(f"config.json: architectures is {architectures}, not MarianMTModel")
    for key, supported in ARCHITECTURE_FLAGS.items():
        if key in hf and hf[key] != supported:
            raise MarianImportError(f"config.json: {key}: {json.dumps(hf[key])} is not supported (only {supported})")
    if not hf["scale_embedding"]:  # nanomt always scales embeddings by sqrt(d_model) (3.4)
        raise MarianImportError("config.json: scale_embedding: false is not supported")
    if hf["activation_function"] not in ACTIVATIONS:
        raise MarianImportError(
            f"config.json: activation_function {hf['activation_function']!r} is not one of {sorted(ACTIVATIONS)}"
        )
    if not isinstance(hf["eos_token_id"], int):
        raise MarianImportError(f"config.json: eos_token_id {hf['eos_token_id']!r} is not a single id")
    shared = hf["share_encoder_decoder_embeddings"]
    try:
        return ModelConfig(
            src_vocab_size=hf["vocab_size"],
            tgt_vocab_size=hf["vocab_size"] if shared else hf["decoder_vocab_size"] or hf["vocab_size"],
            d_model=hf["d_model"],
            n_heads=_same(hf, "encoder_attention_heads", "decoder_attention_heads"),
            n_encoder_layers=hf["encoder_layers"],
            n_decoder_layers=hf["decoder_layers"],
            d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
            dropout=hf["dropout"],
            attention_dropout=hf["attention_dropout"],
            activation_dropout=hf["activation_dropout"],
            max_positions=hf["max_position_embeddings"],
            positional="sinusoidal",
            norm_first=False,
            activation=ACTIVATIONS[hf["activation_function"]],
            share_embeddings=shared,
            tie_output=hf["tie_word_embeddings"],
            pad_id=hf["pad_token_id"],
            init_std=hf["init_std"],
            sinusoidal_layout="halves",
            output_bias=True,
            bos_id=hf["decoder_start_token_id"],
            eos_id=hf["eos_token_id"],
            vocab_multiple=8,  # opus-mt's 58,101 ids: matrices of 58,104 rows fit a GPU's tensor cores
        )
    except (ValueError, TypeError) as e:
        raise MarianImportError(f"config.json: {e}") from None


def decode_config(hf: dict) -> DecodeConfig:
    """Decoding defaults of a Marian config: beam size, Hugging Face's length penalty and stopping rule, lengths."""
    if hf["early_stopping"] not in (True, False):
        raise MarianImportError(f"config.json: early_stopping {hf['early_stopping']!r} is not supported")
    never = [[hf["pad_token_id"]], [hf["decoder_start_token_id"]]]
    if hf["bad_words_ids"] not in (None, [], never[:1], never, never[::-1]):
        # nanomt never generates the pad id and the decoder's start token, and bans nothing else.
        raise MarianImportError(
            f"config.json: bad_words_ids {hf['bad_words_ids']} other than [[pad_token_id], [decoder_start_token_id]]"
        )
    # max_length counts the decoder's start token; a translation cut there keeps its last token where
    # Hugging Face's forced_eos_token_id would replace it with EOS.
    max_len = hf["max_new_tokens"] or hf["max_length"] - 1
    return DecodeConfig(
        beam_size=hf["num_beams"],
        length_penalty=float(hf["length_penalty"]),
        length_penalty_kind="average",  # log p / len^alpha, len counting EOS: Hugging Face's score
        max_len_a=0.0,
        max_len_b=max_len,
        min_len=max(0, hf["min_length"] - 1),  # min_length counts the start token as well
        early_stopping=hf["early_stopping"],
    )


def read_tokenizer(hf_dir: Path, cfg: ModelConfig) -> Tokenizer:
    """The two SentencePiece models and the id table(s) of vocab.json (and target_vocab.json)."""
    for name in TOKENIZER_FILES:
        if not (hf_dir / name).is_file():
            raise MarianImportError(f"{hf_dir}: no {name}")
    options = _read_json(hf_dir / "tokenizer_config.json") if (hf_dir / "tokenizer_config.json").is_file() else {}
    for kind, piece in TABLE_SPECIALS.items():
        token = options.get(f"{kind}_token", piece)
        if (token.get("content") if isinstance(token, dict) else token) != piece:
            raise MarianImportError(f"tokenizer_config.json: {kind}_token {token!r} is not supported (only {piece!r})")
    tgt_vocab = _read_json(hf_dir / "target_vocab.json") if options.get("separate_vocabs") else None
    try:
        tokenizer = Tokenizer(
            (hf_dir / "source.spm").read_bytes(),
            (hf_dir / "target.spm").read_bytes(),
            _read_json(hf_dir / "vocab.json"),
            tgt_vocab,
        )
    except (ValueError, RuntimeError) as e:
        raise MarianImportError(f"{hf_dir}: tokenizer: {e}") from None
    fields = {
        "vocab_size": (tokenizer.src_vocab_size, cfg.src_vocab_size),
        "decoder_vocab_size": (tokenizer.tgt_vocab_size, cfg.tgt_vocab_size),
        "pad_token_id": (tokenizer.pad_id, cfg.pad_id),
        "eos_token_id": (tokenizer.eos_id, cfg.eos_id),
    }
    for field, (theirs, ours) in fields.items():
        if theirs != ours:
            raise MarianImportError(f"config.json: {field} is {ours}, the tokenizer's vocabulary has {theirs}")
    return tokenizer


def read_marian_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin (tensors only), with names relative to the MarianModel."""
    path = next((hf_dir / name for name in WEIGHT_FILES if (hf_dir / name).is_file()), None)
    if path is None:
        raise MarianImportError(f"{hf_dir}: no {' or '.join(WEIGHT_FILES)}")
    try:
        state = load_file(str(path)) if path.suffix == ".safetensors" else _load_bin(path)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise MarianImportError(f"{path}: cannot read weights: {e}") from None
    return {name.removeprefix("model."): tensor.float() for name, tensor in state.items()}


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickles arbitrary objects
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise MarianImportError(f"{path}: not a state dict of tensors")
    return state


def layer_names(i: int, prefix: str) -> dict[str, tuple[str, ...]]:
    """nanomt's name -> the Marian tensors it is made of (concatenated along dim 0), for layer i of a stack."""
    ours, theirs = f"{prefix}.{i}", f"{prefix}.layers.{i}"
    names = {}
    for part in ("weight", "bias"):
        qkv = tuple(f"{theirs}.self_attn.{p}_proj.{part}" for p in "qkv")
        names |= {
            f"{ours}.self_attn.qkv.{part}": qkv,  # one fused projection: q, k, v stacked, as chunk(3) splits it
            f"{ours}.self_attn.out.{part}": (f"{theirs}.self_attn.out_proj.{part}",),
            f"{ours}.ffn.w1.{part}": (f"{theirs}.fc1.{part}",),
            f"{ours}.ffn.w2.{part}": (f"{theirs}.fc2.{part}",),
            f"{ours}.norm1.{part}": (f"{theirs}.self_attn_layer_norm.{part}",),
        }
        if prefix == "encoder":
            names[f"{ours}.norm2.{part}"] = (f"{theirs}.final_layer_norm.{part}",)
        else:
            names |= {
                f"{ours}.cross_attn.q.{part}": (f"{theirs}.encoder_attn.q_proj.{part}",),
                f"{ours}.cross_attn.kv.{part}": tuple(f"{theirs}.encoder_attn.{p}_proj.{part}" for p in "kv"),
                f"{ours}.cross_attn.out.{part}": (f"{theirs}.encoder_attn.out_proj.{part}",),
                f"{ours}.norm2.{part}": (f"{theirs}.encoder_attn_layer_norm.{part}",),
                f"{ours}.norm3.{part}": (f"{theirs}.final_layer_norm.{part}",),
            }
    return names


def _embedding(state: dict[str, torch.Tensor], *names: str) -> tuple[str, ...]:
    """The first of these tensor names that the checkpoint holds (tied tensors are saved under one name)."""
    for name in names:
        if name in state:
            return (name,)
    raise MarianImportError(f"weights: none of {', '.join(names)}")


@torch.no_grad()
def load_marian_weights(model: Transformer, state: dict[str, torch.Tensor]) -> None:
    """Copy a MarianModel's tensors into `model`; a tensor missing, left over or of another shape is an error."""
    cfg = model.cfg
    if cfg.share_embeddings:
        names = {"src_embed.tokens.weight": _embedding(state, "shared.weight", "encoder.embed_tokens.weight")}
    else:
        names = {
            "src_embed.tokens.weight": _embedding(state, "encoder.embed_tokens.weight"),
            "tgt_embed.tokens.weight": _embedding(state, "decoder.embed_tokens.weight"),
        }
    if not cfg.tie_output:
        names["output.weight"] = _embedding(state, "lm_head.weight")
    for i in range(cfg.n_encoder_layers):
        names |= layer_names(i, "encoder")
    for i in range(cfg.n_decoder_layers):
        names |= layer_names(i, "decoder")
    # Copies of the embeddings read, which Hugging Face ties to them when it loads the model.
    ignored = {"shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    own = model.state_dict()
    used = set()
    for ours, theirs in names.items():
        missing = [n for n in theirs if n not in state]
        if missing:
            raise MarianImportError(f"weights: no {missing[0]}")
        tensor = torch.cat([state[n] for n in theirs]) if len(theirs) > 1 else state[theirs[0]]
        shape = _unpadded(ours, own[ours].shape, cfg)
        if tensor.shape != shape:
            raise MarianImportError(
                f"weights: {theirs[0]} has shape {tuple(tensor.shape)}, config.json implies {tuple(shape)}"
            )
        own[ours].zero_()  # the rows past the vocabulary (vocab_multiple) are never scored: zeros, not noise
        own[ours][: shape[0]].copy_(tensor)
        used.update(theirs)
    bias = state.get("final_logits_bias", torch.zeros(1, cfg.tgt_vocab_size))  # absent: zeros, as Marian starts
    if bias.shape != (1, cfg.tgt_vocab_size):
        raise MarianImportError(f"weights: final_logits_bias has shape {tuple(bias.shape)}")
    own["output.bias"].zero_()
    own["output.bias"][: cfg.tgt_vocab_size].copy_(bias[0])
    for side in ("encoder", "decoder"):
        table = state.get(f"{side}.embed_positions.weight")
        if table is not None and not _is_marian_table(table, cfg):
            raise MarianImportError(f"weights: {side}.embed_positions.weight is not Marian's sinusoid table")
    ignored |= {"final_logits_bias", "encoder.embed_positions.weight", "decoder.embed_positions.weight"}
    left = sorted(set(state) - used - ignored)
    if left:
        raise MarianImportError(f"weights: {left[0]} has no place in the model ({len(left)} unused tensors)")


def _unpadded(name: str, shape: torch.Size, cfg: ModelConfig) -> torch.Size:
    """A nanomt tensor's shape without the rows that pad its vocabulary to `vocab_multiple`."""
    if name == "src_embed.tokens.weight":
        return torch.Size((cfg.src_vocab_size, *shape[1:]))
    if name in ("tgt_embed.tokens.weight", "output.weight"):
        return torch.Size((cfg.tgt_vocab_size, *shape[1:]))
    return shape


def _is_marian_table(table: torch.Tensor, cfg: ModelConfig) -> bool:
    """Whether a saved position table is the one nanomt computes (sines in the first half, cosines in the second)."""
    ours = sinusoidal_table(cfg.max_positions, cfg.d_model, cfg.sinusoidal_layout)
    return table.shape == ours.shape and math.isclose(float((table - ours).abs().max()), 0.0, abs_tol=1e-4)
