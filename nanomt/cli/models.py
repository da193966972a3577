"""What the decoding commands share: the device check, the checkpoints' Translator, and the Decoding of the flags.

The command line builds its Decoding at its edge, as the HTTP API does: the checkpoint's decoding settings
(Translator.default_decoding, read from its config) with the flags changed, checked there before the model is
loaded, then passed whole to the Translator.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nanomt.cli import no_collection_while_loading

if TYPE_CHECKING:
    from nanomt.core.decoding import Decoding
    from nanomt.decoding.translate import Translator


def check_device(device: str) -> None:
    """Refuse a device this PyTorch build or machine lacks, in one line, before anything is loaded onto it."""
    from nanomt.core.runtime import pick_device

    pick_device(device, option="--device")


def sampling_options(args: argparse.Namespace) -> dict | None:
    """Sampling's settings from --sampling and its options; None for beam search."""
    options = {
        "--sampling-topk": ("top_k", args.sampling_topk),
        "--sampling-topp": ("top_p", args.sampling_topp),
        "--temperature": ("temperature", args.temperature),
        "--seed": ("seed", args.seed),
    }
    given = [flag for flag, (_, value) in options.items() if value is not None]
    if not args.sampling:
        if given:
            raise ValueError(f"{', '.join(given)} only apply with --sampling")
        return None
    if args.beam is not None or args.n_best > 1:
        raise ValueError("--beam and --n-best are beam search's; they do not combine with --sampling")
    return {key: value for key, value in options.values() if value is not None}


def decoding_flags(args: argparse.Namespace) -> dict:
    """The Decoding fields the flags of a `translate` or `evaluate` command change (None: left as they are); the
    flags that contradict each other and the glossary file are refused here, before the model is loaded."""
    from nanomt.decoding.glossary import read_glossary

    n_best = getattr(args, "n_best", 1)
    return {
        "beam_size": args.beam,
        "n_best": n_best if n_best > 1 else None,
        "length_penalty": args.length_penalty,
        "min_len": args.min_len,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "repetition_penalty": args.repetition_penalty,
        "sampling": sampling_options(args) if hasattr(args, "sampling") else None,
        "glossary": read_glossary(args.glossary) if args.glossary else None,
        "shortlist": args.shortlist,
    }


def load_translator(args: argparse.Namespace) -> Translator:
    """The checkpoints' Translator for a process that decodes until it ends (translate, evaluate)."""
    with no_collection_while_loading():
        from nanomt.core import runtime
        from nanomt.decoding.translate import Translator

        check_device(args.device)
        translator = Translator.from_checkpoints(args.checkpoints, device=args.device, int8=args.int8)
    # Beam search frees and reallocates blocks of tens of MB every step: kept in the heap, their pages are not
    # faulted in again (benchmarks/results/decode_malloc.json). After loading, whose freed memory is not kept.
    if args.device.startswith("cpu"):
        runtime.keep_freed_memory()
    return translator


def checkpoint_decoding(path: str) -> Decoding:
    """A checkpoint's decoding settings as its Translator's default_decoding has them (its config's decode section;
    an ensemble's are its first member's), read from its config.yaml without loading the model. A directory that is
    not a checkpoint gets the defaults: loading it then says what it lacks."""
    from nanomt.core.config import RUN_CONFIG, ConfigError, DecodeConfig, checkpoint_root, load_config
    from nanomt.core.decoding import Decoding

    root = checkpoint_root(path)
    if root is None:
        return Decoding.from_config(DecodeConfig())
    try:
        return Decoding.from_config(load_config(root / RUN_CONFIG).decode)
    except ConfigError as e:
        raise ConfigError(f"{root / RUN_CONFIG}: {e}") from None


def translator_and_decoding(args: argparse.Namespace) -> tuple[Translator, Decoding]:
    """The Decoding of a `translate` or `evaluate` command, the checkpoint's with the flags changed and checked
    before the model is loaded, and the checkpoints' Translator, which decodes with it (decoding=)."""
    decoding = checkpoint_decoding(args.checkpoints[0]).replace(**decoding_flags(args))
    return load_translator(args), decoding
