"""The `nanomt` command line; the only package that turns strings into configs.

parser.py holds every subcommand's arguments (no torch, no server imports); each subcommand's module (training,
translate, evaluate, plot, interop, demo, serve) is imported when it runs and imports what it uses.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import sys
from collections.abc import Iterator

from nanomt.cli.parser import build_parser

__all__ = ["build_parser", "main", "no_collection_while_loading"]


class MissingExtra(Exception):
    """A command that needs an optional extra which is not installed; the message names what to install."""


def require_extra(extra: str, what: str, modules: tuple[str, ...]) -> None:
    """Import `modules`, or raise MissingExtra: one line naming the extra that installs them."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise MissingExtra(f"{what} ({e}): pip install 'nanomt[{extra}]'") from None


def user_errors() -> tuple[type[BaseException], ...]:
    """The errors a command ends with in one line (the traceback with --verbose): its input's, not nanomt's bugs."""
    # ConfigError, CheckpointError, CorpusError, DeviceError and the documents' FileError are ValueErrors.
    errors: list[type[BaseException]] = [ValueError, FileNotFoundError, MissingExtra]
    training = sys.modules.get("nanomt.training.train")  # a TrainingError was raised only if it was imported
    if training is not None:
        errors.append(training.TrainingError)
    return tuple(errors)


@contextlib.contextmanager
def no_collection_while_loading() -> Iterator[None]:
    """Python's cyclic garbage collector off while torch, nanomt and the model load, and the objects they made
    (~10^5, kept until the process ends) frozen out of its later passes: it would otherwise scan them again and
    again, as they are made and after (0.19 s of a one-line `nanomt translate`, 1.0 s of a 5-step toy training)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `nanomt` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    logging.getLogger("nanomt").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    module, _, name = args.handler.partition(":")
    try:
        with no_collection_while_loading():  # a command module that imports torch at once (demo)
            command = getattr(importlib.import_module(f"nanomt.cli.{module}"), name)
        command(args)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `nanomt translate ... | head`
        sys.exit(0)
    except Exception as e:
        if args.verbose or not isinstance(e, user_errors()):
            raise
        print(f"nanomt: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
