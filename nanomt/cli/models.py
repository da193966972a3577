"""What the decoding commands share: the device check, the checkpoints' Translator, and the Decoding of the flags.

The command line builds its Decoding at its edge, as the HTTP API does: the checkpoint's decoding settings
(Translator.default_decoding, read from its config) with the flags changed, checked there before the model is
loaded, then passed whole to the Translator.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nanomt.cli import no_collection_while_loading
from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.settings import fields_at, reader

if TYPE_CHECKING:
    from nanomt.decoding.translate import Translator


def check_device(device: str) -> None:
    """Refuse a device this PyTorch build or machine lacks, in one line, before anything is loaded onto it."""
    from nanomt.core.runtime import pick_device

    pick_device(device, option="--device")


def sampling_options(args: argparse.Namespace) -> dict | None:
    """Sampling's settings from --sampling and its options (one a Sampling field); None for search."""
    given = {f.name: getattr(args, f.name) for f in fields_at(Sampling, "flag") if getattr(args, f.name) is not None}
    if not args.sampling:
        if given:
            flags = [flag_name(f) for f in fields_at(Sampling, "flag") if f.name in given]
            raise ValueError(f"{', '.join(flags)} only apply with --sampling")
        return None
    return given


def flag_name(f) -> str:
    """A setting's flag as the command line spells it."""
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def decoding_flags(args: argparse.Namespace) -> dict:
    """The Decoding fields the flags of a `translate` or `evaluate` command change (None: left as they are, the
    checkpoint's): one a Decoding field the command has a flag for, a file's flag read here (the glossary), before
    the model is loaded."""
    changes = {}
    for f in fields_at(Decoding, "flag"):
        if not hasattr(args, f.name):  # a flag this command does not take (evaluate: --n-best, --sampling)
            continue
        value, read = getattr(args, f.name), reader(f)
        if f.name == "sampling":
            value = sampling_options(args)
        elif read is not None and value is not None:
            value = read(value)
        changes[f.name] = value
    return changes


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
