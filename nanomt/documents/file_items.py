"""What every file format's reader shares: the errors a file is refused with, the job a reader is given (the
translate function, the limits, the target language, the progress), text as markup items, and a format's library."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from nanomt.documents import markup
from nanomt.documents.formats import BY_NAME
from nanomt.documents.markup import Item, Tag, Text

# (sentences done, sentences in all) after each chunk a file's sentences are translated in; raising stops the file.
Progress = Callable[[int, int], None]


class FileError(ValueError):
    """A file that cannot be translated; the message names the problem in one line."""


class UnsupportedFile(FileError):
    """A file of a type nanomt does not translate, or one that is not what its type says (HTTP 415)."""


class FileTooLarge(FileError):
    """A file over one of the size limits (HTTP 413)."""


@dataclass(frozen=True)
class FileJob:
    """What a format's reader is given beside the file's bytes."""

    translate: markup.Translate  # sentences -> translations with alignments (limited and chunked by translate_file)
    split: markup.Split | None  # text -> sentences (None: markup's rule)
    unzipped: int  # the most bytes a zipped format may unpack to
    target: str | None = None  # the target language's code, written into the document's language tags (None: kept)


# Whitespace other than one space keeps its place through translation: tabs, line breaks, runs of spaces.
SPACING = re.compile(r"([ \t\n\r\f]*[\t\n\r\f][ \t\n\r\f]*| {2,})")


def text_items(text: str) -> list[Item]:
    """Text as items, whitespace other than single spaces kept as spacing voids."""
    parts = SPACING.split(text)
    return [Tag("void", p, space=True) if i % 2 else Text(p) for i, p in enumerate(parts) if p]


def joined(items: list[Item]) -> str:
    """Items whose tags are text, written out."""
    return "".join(i.text if isinstance(i, Text) else str(i.raw) for i in items)


def library(fmt: str, module: str | None = None):
    """A format's library (or another `module` its package installs), or an UnsupportedFile naming the package."""
    f = BY_NAME[fmt]
    try:
        return importlib.import_module(module or f.module)
    except ImportError:
        raise UnsupportedFile(f"this format needs {f.package}: pip install 'nanomt[files]'") from None
