"""Frozen dataclass configs, YAML load/save, and `section.key=value` overrides; unknown keys are errors."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml

from nanomt.core.decoding import MAX_TOKENS, Decoding
from nanomt.core.languages import TOKEN_CODE
from nanomt.core.settings import check_bounds, fields_at, setting

ACTIVATIONS = ("relu", "gelu", "swish")
POSITIONALS = ("sinusoidal", "learned")
# The sinusoids' order along d_model: 3.5's sin/cos pairs, or every sine before every cosine (Marian's table).
SINUSOIDAL_LAYOUTS = ("interleaved", "halves")
# Special token ids of the vocabularies nanomt trains (its SentencePiece models reserve them). A model's own ids
# are its ModelConfig's (an imported Marian model has others): everything that builds batches or scores reads those.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# A checkpoint directory holds its config file and tokenizer directory, or its run does (above checkpoints/step_N).
RUN_CONFIG, RUN_TOKENIZER = "config.yaml", "tokenizer"
# What a run started from another's weights (train.init_from) may set in `model`: dropout changes training alone.
FINE_TUNABLE = ("dropout", "attention_dropout", "activation_dropout")
# The data keys that made the tokenizer: with train.init_from, the tokenizer is the other run's.
TOKENIZER_KEYS = ("tokenizer", "vocab_size", "shared_vocab", "character_coverage", "tokenizer_sentences")


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""


class SpecialIds(NamedTuple):
    """A model's padding, decoder-start and end-of-sentence ids, as batches are built with them."""

    pad: int
    bos: int
    eos: int


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the Transformer (defaults: the paper's base model)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_positions: int = 1024
    positional: str = "sinusoidal"
    norm_first: bool = True
    activation: str = "relu"
    share_embeddings: bool = False
    tie_output: bool = False
    pad_id: int = 0
    layer_norm_eps: float = 1e-5
    # None: Xavier-uniform matrices and N(0, d_model^-1/2) embeddings; a number: N(0, init_std) for both
    # (BERT/Marian's 0.02 makes Adam's steps larger relative to the weights).
    init_std: float | None = None
    # Score only the target ids that occur in the training targets (`Transformer.set_output_vocab`): with a
    # vocabulary shared by both languages, training skips the source-only rows of the output projection.
    restrict_output: bool = False
    # Sines at even dimensions and cosines at odd ones (3.5), or sines in the first half and cosines in the second.
    sinusoidal_layout: str = "interleaved"
    # A learned bias added to the output logits (Marian's final_logits_bias).
    output_bias: bool = False
    # The decoder's first input and the id that ends a sentence on both sides (Marian starts from its pad id).
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    # Embedding and output matrices get rows up to a multiple of this (never scored): on a GPU, a vocabulary such
    # as opus-mt's 58,101 makes the output matmul miss the tensor cores' multiples of 8 (fairseq pads to 8 too).
    vocab_multiple: int = 1

    def __post_init__(self):
        for name in (
            "src_vocab_size",
            "tgt_vocab_size",
            "d_model",
            "n_heads",
            "d_ff",
            "max_positions",
            "vocab_multiple",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model ({self.d_model}) must be even for positional='sinusoidal'")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.sinusoidal_layout not in SINUSOIDAL_LAYOUTS:
            raise ValueError(f"sinusoidal_layout must be one of {SINUSOIDAL_LAYOUTS}, got {self.sinusoidal_layout!r}")
        if self.sinusoidal_layout != "interleaved" and self.positional != "sinusoidal":
            raise ValueError(f"sinusoidal_layout={self.sinusoidal_layout!r} needs positional='sinusoidal'")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, "
                f"got {self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std}")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id ({self.pad_id}) must be a valid token id in both vocabularies")
        if not 0 <= self.bos_id < self.tgt_vocab_size:
            raise ValueError(f"bos_id ({self.bos_id}) must be a valid token id in the target vocabulary")
        if not 0 <= self.eos_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"eos_id ({self.eos_id}) must be a valid token id in both vocabularies")
        if self.eos_id in (self.pad_id, self.bos_id):
            raise ValueError(f"eos_id ({self.eos_id}) must differ from pad_id and bos_id")
        if self.output_bias and self.restrict_output:
            # The restricted output projects onto the kept rows of the weight alone.
            raise ValueError("output_bias needs restrict_output: false")

    @property
    def special_ids(self) -> SpecialIds:
        return SpecialIds(self.pad_id, self.bos_id, self.eos_id)


@dataclass(frozen=True)
class SplitConfig:
    """One split of a parallel corpus: two line-aligned files, or one TSV with two columns."""

    src: str | None = None
    tgt: str | None = None
    tsv: str | None = None


@dataclass(frozen=True)
class CorpusConfig(SplitConfig):
    """One of several training corpora (data.train as a list), with its share of every epoch."""

    # Relative: an epoch holds as many pairs as all the corpora, corpus i's share of them w_i / sum(w). A small
    # in-domain corpus with the weight of a large generic one is seen several times an epoch, the other in part.
    weight: float = 1.0
    # A multilingual model's corpus: the code of the language its targets are in. Its sources start with the
    # token >>code<< (Johnson et al., 2017; Marian's multilingual opus-mt), which asks for that language.
    tgt_lang: str | None = None

    def __post_init__(self):
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"weight must be a positive number, got {self.weight}")
        if self.tgt_lang is not None and not TOKEN_CODE.fullmatch(self.tgt_lang):
            raise ValueError(f"tgt_lang {self.tgt_lang!r}: a code of letters, digits, _ and - (as fra or pt_br)")


@dataclass(frozen=True)
class HFDataConfig:
    """A Hugging Face dataset (`datasets.load_dataset(path, name, data_files=...)`)."""

    path: str = ""
    name: str | None = None
    data_files: dict[str, str] | None = None
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str | None = None
    src_lang: str = ""
    tgt_lang: str = ""
    # Rows look like {"translation": {"de": ..., "en": ...}} (WMT, opus) or {src_key: ..., tgt_key: ...}.
    translation_field: str | None = "translation"


@dataclass(frozen=True)
class DataConfig:
    """Where the corpus is and how it is tokenized and filtered."""

    # One corpus, or a list of corpora mixed by weight (CorpusConfig), e.g. generic and in-domain data; a
    # multilingual model's corpora each name their tgt_lang, and so do its validation sets (a list, one a pair).
    train: SplitConfig | tuple[CorpusConfig, ...] = field(default_factory=SplitConfig)
    valid: SplitConfig | tuple[CorpusConfig, ...] = field(default_factory=SplitConfig)
    test: SplitConfig = field(default_factory=SplitConfig)
    hf: HFDataConfig | None = None
    tokenizer: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 8000
    shared_vocab: bool = True
    character_coverage: float = 1.0
    # Sentences longer than this many subword tokens (either side, before BOS/EOS) are dropped from training.
    max_len: int = 256
    # SentencePiece trains on at most this many sentences (a uniform sample), so memory stays bounded on big corpora.
    tokenizer_sentences: int = 2_000_000
    cache_dir: str | None = None
    # BPE-dropout (Provilkov et al., 2020): every epoch re-tokenizes the training pairs, skipping each merge
    # with this probability, so the model sees many segmentations of a word. 0 = off (one fixed tokenization).
    bpe_dropout: float = 0.0
    # Temperature sampling of the corpora (multilingual NMT, Arivazhagan et al., 2019): corpus i's share of an
    # epoch is weight_i * pairs_i^(1/T), normalized: 1 samples in proportion to size, larger T evens the
    # languages out (a small language is seen more often). None: by weight alone.
    temperature: float | None = None

    def __post_init__(self):
        if isinstance(self.train, tuple) and not self.train:
            raise ValueError("train: an empty list of corpora")
        if isinstance(self.valid, tuple) and not self.valid:
            raise ValueError("valid: an empty list of corpora")
        if self.temperature is not None and not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a positive number, got {self.temperature}")
        if self.temperature is not None and not isinstance(self.train, tuple):
            raise ValueError("temperature samples a list of corpora: give train as a list")
        self._check_languages()
        if isinstance(self.train, tuple) and self.hf is not None:
            raise ValueError("train as a list of corpora needs files, not hf")
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ValueError(f"bpe_dropout must be in [0, 1), got {self.bpe_dropout}")
        if self.max_len < 1:  # else every pair is dropped as too long, once the tokenizer is trained
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        if self.tokenizer_sentences <= 100:  # SentencePiece's own lower bound on its sample
            raise ValueError(f"tokenizer_sentences must be > 100, got {self.tokenizer_sentences}")
        if self.bpe_dropout and self.tokenizer != "bpe":
            raise ValueError(f"bpe_dropout needs tokenizer: bpe, not {self.tokenizer!r}")

    @property
    def target_languages(self) -> tuple[str, ...]:
        """A multilingual model's target-language codes (its training corpora's tgt_lang), in order; () for others."""
        corpora = self.train if isinstance(self.train, tuple) else ()
        return tuple(dict.fromkeys(c.tgt_lang for c in corpora if c.tgt_lang is not None))

    def _check_languages(self) -> None:
        """Every corpus of a multilingual model names its target language, and its validation sets too."""
        train = self.train if isinstance(self.train, tuple) else (self.train,)
        named = [getattr(c, "tgt_lang", None) is not None for c in train]
        if any(named) and not all(named):
            raise ValueError(f"train[{named.index(False)}]: a multilingual model's corpora each name their tgt_lang")
        valid = self.valid if isinstance(self.valid, tuple) else (self.valid,)
        if not any(named):
            if any(getattr(v, "tgt_lang", None) for v in valid):
                raise ValueError("valid names a tgt_lang, but no training corpus does")
            return
        if self.valid != SplitConfig():
            for i, v in enumerate(valid):
                if getattr(v, "tgt_lang", None) not in self.target_languages:
                    raise ValueError(
                        f"valid[{i}]: a multilingual model's validation sets are a list, each with a tgt_lang "
                        f"among the training corpora's ({', '.join(self.target_languages)})"
                    )


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop: schedule, batching, checkpoints, precision, device."""

    max_steps: int = 100_000
    max_epochs: int | None = None
    max_minutes: float | None = None
    max_tokens: int = 4096
    accum_steps: int = 1
    lr: float = 5e-4
    warmup_steps: int = 4000
    # "inverse_sqrt": fairseq's linear warmup to `lr` then lr*sqrt(warmup/step);
    # "noam": the paper's d_model^-0.5 * min(step^-0.5, step*warmup^-1.5), scaled by `lr`;
    # "linear": linear warmup to `lr`, then linear decay to 0 at max_steps, or when max_minutes runs out if
    # that comes first (for a fixed budget; with max_minutes the lr follows the clock, so resumes are not exact).
    # "constant": linear warmup to `lr`, then `lr` (transformers' constant_with_warmup; for fine-tuning).
    schedule: Literal["inverse_sqrt", "noam", "linear", "constant"] = "inverse_sqrt"
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    seed: int = 1
    # "auto": bf16 where the device has bf16 matrix kernels (a CUDA GPU with bf16, a CPU with AVX-512 or AMX),
    # else fp32. Without those kernels a CPU runs bf16 matmuls ~60x slower than fp32 (AVX2 only: README).
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    device: str = "auto"
    num_threads: int | None = None
    log_every: int = 50
    eval_every: int = 1000
    save_every: int = 1000
    keep_last: int = 5
    # Validation BLEU is greedy decoding of the first `valid_bleu_sentences` pairs (None: all).
    valid_bleu_sentences: int | None = None
    tensorboard: bool = False
    progress: bool = True
    # torch.compile the model for the training step (dynamic shapes): fuses a GPU's many small kernels. Off by
    # default: on a 2-core CPU the compiled step was slower than eager (docs/experiments.md).
    compile: bool = False
    # Packed batches: sentences concatenated into rows with no padding between them; attention stays within each
    # sentence (CUDA's varlen flash kernel in bf16/fp16, else a block-diagonal mask), positions restart per
    # sentence, and the loss and gradients are the padded batch's. The token budget then counts real tokens. Off
    # until a GPU measurement shows it wins (docs/performance.md).
    packed: bool = False
    # Positions in a packed row. None: the whole batch in one row where CUDA's varlen kernel runs (bf16/fp16, no
    # attention dropout: its cost is each sentence's own length), 128 elsewhere (a block-diagonal mask costs the row's).
    pack_row_tokens: int | None = None
    # A checkpoint directory (a run, checkpoints/step_N, an averaged or imported model) whose architecture,
    # tokenizer, special ids and weights this run starts from, with its own optimizer, schedule and steps. Its
    # `model` section may be left out; a key set there must match, except dropout (FINE_TUNABLE).
    init_from: str | None = None
    # Bidirectional training (Ding et al., 2021, "BiT"): the first `bidirectional_epochs` epochs train on every
    # pair in both directions (src->tgt and tgt->src, twice the sentences an epoch), the rest on src->tgt only.
    # Needs data.shared_vocab, so that both sides' ids mean the same in the encoder and the decoder.
    bidirectional_epochs: int = 0
    # When training ends, fit the confidence model (nanomt.decoding.calibration) on the whole validation set with
    # the best weights and the decode section's settings, into calibration.json beside them (where the validation
    # set has enough sentences; the weights are not touched).
    calibrate: bool = True

    def __post_init__(self):
        # 0 has a meaning for these: no steps, no warm-up, every checkpoint kept, no BLEU sentences, no clipping.
        least = {"max_tokens": 1, "accum_steps": 1, "log_every": 1, "eval_every": 1, "save_every": 1, "max_steps": 0}
        least |= {"warmup_steps": 0, "keep_last": 0, "bidirectional_epochs": 0, "valid_bleu_sentences": 0}
        least |= {"max_epochs": 1, "num_threads": 1, "weight_decay": 0, "clip_norm": 0}
        for name, bound in least.items():
            value = getattr(self, name)
            if value is not None and value < bound:
                raise ValueError(f"{name} must be >= {bound}, got {value}")
        for name in ("lr", "eps", "max_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"betas must be in [0, 1), got {self.betas}")
        if self.pack_row_tokens is not None and self.pack_row_tokens < 2:
            raise ValueError(
                f"pack_row_tokens must be >= 2 (a token and the row's padding), got {self.pack_row_tokens}"
            )


def decode_config(decoding: type[Decoding] = Decoding) -> type:
    """The decode section's dataclass: the Decoding settings a checkpoint keeps (its fields that a config takes, with
    their defaults and metadata), and the batch size of translation. Generated, so that a new Decoding setting is a
    config key without a line here."""
    hints = typing.get_type_hints(decoding)
    fields = []
    for f in fields_at(decoding, "config"):
        choices = f.metadata["choices"]
        tp = Literal[tuple(choices)] if choices else hints[f.name]  # the YAML check reads the choices from the type
        fields.append((f.name, tp, dataclasses.field(default=f.default, metadata=f.metadata)))
    batch = setting(MAX_TOKENS, help="source tokens per decoding batch", ge=1)
    fields.append(("max_tokens", int, batch))

    def __post_init__(self):
        check_bounds(self)
        decoding.from_config(self)  # the rules of a Decoding, checked where the config is read

    doc = "Decoding defaults stored with a checkpoint: a Decoding's settings (core/decoding.py), and the batch size."
    namespace = {"__post_init__": __post_init__, "__doc__": doc, "__module__": __name__}
    return dataclasses.make_dataclass("DecodeConfig", fields, frozen=True, namespace=namespace)


DecodeConfig = decode_config()


@dataclass(frozen=True)
class Config:
    """Everything a run needs; the run directory's config.yaml is this, resolved."""

    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self):
        # Options of different sections that do not combine.
        if self.model.restrict_output and self.data.bpe_dropout:
            raise ValueError(
                "model.restrict_output needs data.bpe_dropout: 0 (dropout segmentations use target ids that "
                "the plain one never does)"
            )
        if self.train.bidirectional_epochs and self.data.target_languages:
            raise ValueError("train.bidirectional_epochs with corpora that name a tgt_lang: a reversed pair would "
                             "ask for the language of its source")  # fmt: skip
        if self.train.bidirectional_epochs and not self.data.shared_vocab:
            raise ValueError(
                "train.bidirectional_epochs needs data.shared_vocab: true (the reversed pairs feed target ids "
                "to the encoder and source ids to the decoder)"
            )
        if self.train.bidirectional_epochs and self.model.restrict_output and self.train.accum_steps > 1:
            # A group of batches spanning the switch would score its reversed pairs with the narrowed output layer.
            raise ValueError("train.bidirectional_epochs with model.restrict_output needs train.accum_steps: 1")


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `where`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        # A list is read as the list type of the union, a mapping as its other types: errors name the one meant.
        kinds = [a for a in args if a is not type(None) and (typing.get_origin(a) is tuple) == isinstance(value, list)]
        for arg in kinds or [a for a in args if a is not type(None)]:
            try:
                return _check_value(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} does not fit {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(_check_value(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{where} must be a list of {len(args)} values, got {value!r}")
        return tuple(_check_value(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return {str(k): _check_value(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 5e-4 (no dot) and 1_000.5 as strings
            try:
                return float(value.replace("_", ""))
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise ConfigError(f"{where}: unsupported type {tp}")
    raise ConfigError(f"{where} must be {tp.__name__}, got {value!r}")


def _build(cls: type, values: dict, where: str) -> Any:
    """Build dataclass `cls` from a dict, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        section = where or "top level"
        raise ConfigError(f"unknown config key {unknown[0]!r} in section '{section}' (known: {sorted(names)})")
    kwargs = {k: _check_value(v, hints[k], f"{where}.{k}" if where else k) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"section '{where or 'top level'}': {e}") from None
    except ValueError as e:  # a rule within a section, or (at the top level) between sections
        raise ConfigError(f"section '{where}': {e}" if where else str(e)) from None


def to_dict(cfg: Any) -> Any:
    """A dataclass config as plain dicts/lists (tuples become lists) for YAML."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip().split("."), value


def config_from_dict(raw: dict, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a Config from nested dicts plus `section.key=value` overrides."""
    raw = to_dict(raw) if raw else {}
    if not isinstance(raw, dict):
        raise ConfigError("a config must be a mapping of sections (model, data, train, decode)")
    for item in overrides:
        path, value = _parse_override(item)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    init_from = (raw.get("train") or {}).get("init_from")
    if init_from:
        raw = _from_checkpoint(raw, init_from)
    raw.setdefault("model", {})
    model = raw["model"]
    if isinstance(model, dict) and not init_from:
        # Vocabulary sizes come from the tokenizer; until it exists, data.vocab_size stands in.
        vocab = (raw.get("data") or {}).get("vocab_size", DataConfig.vocab_size)
        model.setdefault("src_vocab_size", vocab)
        model.setdefault("tgt_vocab_size", vocab)
    return _build(Config, raw, "")


def checkpoint_root(path: str | Path) -> Path | None:
    """The directory with a checkpoint's config and tokenizer: `path`, or its run above checkpoints/step_N."""
    path = Path(path)
    for root in (path, path.parent.parent):
        if (root / RUN_CONFIG).is_file() and (root / RUN_TOKENIZER).is_dir():
            return root
    return None


def _from_checkpoint(raw: dict, init_from: Any) -> dict:
    """`raw` with the model and tokenizer settings of checkpoint `init_from`; a key contradicting them is an error."""
    where = f"train.init_from {init_from}"
    root = checkpoint_root(init_from) if isinstance(init_from, str) else None
    if root is None:
        raise ConfigError(f"{where}: not a checkpoint directory (needs {RUN_CONFIG} and {RUN_TOKENIZER}/)")
    try:
        base = load_config(root / RUN_CONFIG)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    out = dict(raw)
    for section, free in (("model", FINE_TUNABLE), ("data", ())):
        given = raw.get(section) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{section} must be a mapping, got {given!r}")
        theirs = getattr(base, section)
        hints = typing.get_type_hints(type(theirs))
        keys = [f.name for f in dataclasses.fields(theirs)] if section == "model" else TOKENIZER_KEYS
        for key in keys:
            if key in given and key not in free and key in hints:
                value = _check_value(given[key], hints[key], f"{section}.{key}")
                if value != getattr(theirs, key):
                    raise ConfigError(
                        f"{section}.{key}: {given[key]!r} contradicts {where} ({getattr(theirs, key)!r}); "
                        "leave it out or match it"
                    )
        out[section] = {**given, **{k: to_dict(getattr(theirs, k)) for k in keys if k not in free or k not in given}}
    return out


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load a YAML config file and apply overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return config_from_dict(raw or {}, overrides)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
