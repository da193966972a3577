"""Before the first step: the run directory (config.yaml, the tokenizer) and the data training reads (the binarized
train and valid sets, made by rank 0 once and read by every rank), as one TrainData."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from nanomt.core import checkpoint as ckpt
from nanomt.core.config import Config, SplitConfig, load_config, save_config, to_dict
from nanomt.core.runtime import Runtime
from nanomt.core.tokenizer import Tokenizer, train_tokenizer
from nanomt.training.data import (
    Corpus,
    CorpusText,
    binarize,
    both_directions,
    check_split,
    corpora,
    corpus_texts,
    output_ids,
    read_pairs,
    split_pairs,
)
from nanomt.training.errors import TrainingError
from nanomt.training.ranks import main_rank_first

log = logging.getLogger("nanomt")


def has_split(cfg: Config, name: str) -> bool:
    """Whether the config names data for a split."""
    return cfg.data.hf is not None or getattr(cfg.data, name) != SplitConfig()


def check_run_dir(run_dir: Path) -> None:
    """A --run-dir is new, or one that training made: a model made otherwise (imported, averaged) is never touched."""
    if run_dir.exists() and not run_dir.is_dir():
        raise TrainingError(f"--run-dir {run_dir} is not a directory")
    if (run_dir / ckpt.CHECKPOINTS).is_dir():  # made by train at the start of the run
        return
    # A tokenizer alone is no model: one put there beforehand is the run's vocabulary (run_tokenizer loads it).
    found = [name for name in (ckpt.CONFIG, ckpt.WEIGHTS) if (run_dir / name).exists()]
    if found:
        raise TrainingError(
            f"{run_dir} holds a model that was not trained there ({found[0]}: an imported or averaged checkpoint?); "
            f"nothing was written. To fine-tune it: train.init_from={run_dir} (--init-from) and another --run-dir"
        )


def init_tokenizer(init_from: Path, run_dir: Path) -> Tokenizer:
    """The tokenizer of checkpoint `init_from`, after checking it is the one its weights were trained with."""
    tokenizer_dir = ckpt.find_run_files(init_from)[1]
    tokenizer = Tokenizer.load(tokenizer_dir)
    stored = ckpt.weights_fingerprint(ckpt.checkpoint_weights(init_from))
    if stored is not None and stored != tokenizer.fingerprint():
        raise TrainingError(
            f"train.init_from {init_from}: its weights were trained with tokenizer {stored[:12]}, but "
            f"{tokenizer_dir} holds {tokenizer.fingerprint()[:12]}"
        )
    return tokenizer


def run_tokenizer(cfg: Config, run_dir: Path) -> Tokenizer:
    """The run's tokenizer: its own (a restart), the init_from checkpoint's, or one trained on the training data."""
    tok_dir = run_dir / ckpt.TOKENIZER
    if any(tok_dir.glob("*.model")):
        # A restart reads no corpus file here: binarize checks the files when its cache misses.
        return Tokenizer.load(tok_dir)
    if cfg.train.init_from:
        tokenizer = init_tokenizer(Path(cfg.train.init_from), run_dir)
        tokenizer.save(tok_dir)
        return tokenizer
    if cfg.data.hf is None:  # every file problem surfaces before the tokenizer is trained
        for name in ("train", "valid") if has_split(cfg, "valid") else ("train",):
            for where, split in corpora(cfg.data, name):
                check_split(split, where)
    log.info("training a %s tokenizer (vocab %d) on the training data", cfg.data.tokenizer, cfg.data.vocab_size)
    return train_tokenizer(
        (s for s, _ in split_pairs(cfg.data, "train")),
        (t for _, t in split_pairs(cfg.data, "train")),
        tok_dir,
        cfg.data,
    )


def with_tokenizer(cfg: Config, tokenizer: Tokenizer) -> Config:
    """The config with the tokenizer's vocabulary sizes, and its special ids for a model trained from scratch."""
    if cfg.train.init_from:  # the checkpoint's model, whose ids its tokenizer was checked against
        model = cfg.model
    else:
        bos = cfg.model.bos_id if tokenizer.bos_id is None else tokenizer.bos_id
        model = dataclasses.replace(
            cfg.model,
            src_vocab_size=tokenizer.src_vocab_size,
            tgt_vocab_size=tokenizer.tgt_vocab_size,
            pad_id=tokenizer.pad_id,
            bos_id=bos,
            eos_id=tokenizer.eos_id,
        )
    try:
        tokenizer.check_model_ids(model)
    except ValueError as e:
        raise TrainingError(str(e)) from None
    return dataclasses.replace(cfg, model=model)


def prepare_run_dir(cfg: Config, run_dir: Path) -> tuple[Config, Tokenizer]:
    """Train (checking the corpus first) or load the tokenizer, fix vocabulary sizes in the config, save config.yaml."""
    check_run_dir(run_dir)
    init_from = Path(cfg.train.init_from) if cfg.train.init_from else None
    if init_from is not None and init_from.resolve() in (run_dir.resolve(), run_dir.resolve().parent.parent):
        raise TrainingError(f"train.init_from {init_from} is the --run-dir itself; give the fine-tuning run its own")
    (run_dir / ckpt.CHECKPOINTS).mkdir(parents=True, exist_ok=True)  # marks the directory as a training run's
    tokenizer = run_tokenizer(cfg, run_dir)
    cfg = with_tokenizer(cfg, tokenizer)
    saved = run_dir / ckpt.CONFIG
    if saved.is_file():
        old = load_config(saved)
        for section in ("model", "data"):
            a, b = to_dict(getattr(old, section)), to_dict(getattr(cfg, section))
            diff = [k for k in a if a[k] != b.get(k)]
            if diff:
                raise TrainingError(
                    f"{run_dir} holds a run with another {section} config ({section}.{diff[0]}: "
                    f"{a[diff[0]]!r} there, {b[diff[0]]!r} now); use another --run-dir"
                )
    # Resolved: the model section is whole, so the run loads without the checkpoint it started from.
    save_config(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=None)), saved)
    return cfg, tokenizer


def valid_set(cfg: Config, tokenizer: Tokenizer, cache: Path) -> tuple[Corpus, list[str], list[str]] | None:
    """Binarized validation corpus and the raw text of the sentences used for BLEU."""
    if not has_split(cfg, "valid"):
        return None
    corpus = binarize(cfg.data, "valid", tokenizer, cache, max_len=cfg.model.max_positions - 1)
    n = cfg.train.valid_bleu_sentences
    srcs, refs = [], []
    # The first n pairs of each validation set (a multilingual model's: of each language).
    parts = [read_pairs(s, w) for w, s in corpora(cfg.data, "valid")]
    if cfg.data.hf is not None:
        parts = [split_pairs(cfg.data, "valid")]
    for pairs in parts:
        kept = 0
        for src, tgt in pairs:
            if n is not None and kept >= n:
                break
            if src.strip() and tgt.strip():
                srcs.append(src)
                refs.append(tgt)
                kept += 1
    return corpus, srcs, refs


@dataclass(frozen=True)
class TrainData:
    """What training reads: the tokenizer, the binarized corpus, the validation set, and per-epoch inputs."""

    tokenizer: Tokenizer
    corpus: Corpus
    valid: tuple[Corpus, list[str], list[str]] | None  # binarized, and the raw sources/references for BLEU
    max_len: int
    texts: tuple[CorpusText, CorpusText] | None  # memory-mapped raw pairs, re-segmented each epoch (BPE-dropout)
    output_vocab: dict[bool, torch.Tensor]  # restrict_output: the scored target ids, with / without reversed pairs


def prepare_files(cfg: Config, run_dir: Path, cache: Path, max_len: int) -> tuple:
    """Rank 0's part: config.yaml, the tokenizer, the binarized train and valid sets (cached on disk)."""
    cfg, tokenizer = prepare_run_dir(cfg, run_dir)
    return cfg, tokenizer, binarize(cfg.data, "train", tokenizer, cache, max_len), valid_set(cfg, tokenizer, cache)


def prepare_data(cfg: Config, run_dir: Path, rt: Runtime) -> tuple[Config, TrainData]:
    """Tokenizer and binarized train and valid sets, made by rank 0 once while the others wait; then read by all."""
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / "bin"
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    what = "training the tokenizer and binarizing the data"
    prepared = main_rank_first(rt, what, lambda: prepare_files(cfg, run_dir, cache, max_len))
    if prepared is None:  # another rank: it opens what rank 0 wrote
        saved = dataclasses.replace(load_config(run_dir / ckpt.CONFIG), train=cfg.train)  # train.init_from too
        cfg, tokenizer = saved, Tokenizer.load(run_dir / ckpt.TOKENIZER)
        corpus = binarize(cfg.data, "train", tokenizer, cache, max_len)
        prepared = cfg, tokenizer, corpus, valid_set(cfg, tokenizer, cache)
    cfg, tokenizer, corpus, valid = prepared
    if len(corpus) == 0:
        raise TrainingError("no training pairs left after filtering")
    output_vocab = {}
    if cfg.model.restrict_output:
        unk, eos = tokenizer.unk_id, cfg.model.eos_id
        output_vocab[False] = torch.from_numpy(output_ids(corpus, unk, eos))
        if cfg.train.bidirectional_epochs:  # a reversed epoch's targets are both sides' sentences
            output_vocab[True] = torch.from_numpy(output_ids(both_directions(corpus), unk, eos))
    return cfg, TrainData(
        tokenizer=tokenizer,
        corpus=corpus,
        valid=valid,
        max_len=max_len,
        texts=corpus_texts(corpus, tokenizer) if cfg.data.bpe_dropout else None,
        output_vocab=output_vocab,
    )
