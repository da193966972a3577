"""Glossaries: `source term<TAB>target term` files, and the terms of a sentence that its translation must contain."""

from __future__ import annotations

import re
from pathlib import Path

Glossary = tuple[tuple[str, str], ...]  # (source term, target term) pairs, as a Decoding holds them


class GlossaryError(ValueError):
    """A glossary file or entry that cannot be used, named with its line."""


def read_glossary(path: str | Path) -> Glossary:
    """The pairs of a UTF-8 TSV file, one `source term<TAB>target term` a line; blank lines and # comments skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GlossaryError(f"{path}: glossary file not found") from None
    except IsADirectoryError:
        raise GlossaryError(f"{path}: a directory, not a glossary file") from None
    except UnicodeDecodeError as e:
        raise GlossaryError(f"{path}: not UTF-8 text (byte {e.start})") from None
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise GlossaryError(f"{path}: line {n}: want 'source term<TAB>target term', found {len(fields)} field(s)")
        pairs.append(fields)
    return checked(pairs, str(path))


def checked(pairs, where: str = "glossary") -> Glossary:
    """The pairs as a Glossary, each side stripped and non-empty (an error names the entry)."""
    out = []
    for n, pair in enumerate(pairs, 1):
        if len(pair) != 2:
            raise GlossaryError(f"{where}: entry {n}: want a [source term, target term] pair")
        source, target = (" ".join(str(side).split()) for side in pair)
        if not source or not target:
            raise GlossaryError(f"{where}: entry {n}: a term is empty ({pair[0]!r} -> {pair[1]!r})")
        out.append((source, target))
    return tuple(out)


def required_terms(glossary: Glossary, sentence: str) -> list[str]:
    """The target terms of the source terms found in `sentence`: case-insensitive, whole words, longest match first,
    each stretch of the sentence used once, in the order of the sentence."""
    found, taken = [], []
    for source, target in sorted(glossary, key=lambda pair: -len(pair[0])):
        pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, source.split())) + r"(?!\w)"
        for m in re.finditer(pattern, sentence, flags=re.IGNORECASE):
            if not any(m.start() < end and start < m.end() for start, end in taken):
                taken.append((m.start(), m.end()))
                found.append((m.start(), target))
                break
    return list(dict.fromkeys(target for _, target in sorted(found)))  # a term twice is required once


def has_terms(glossary: Glossary, sentence: str, translation: str) -> bool:
    """Whether the translation contains every target term the sentence asks for."""
    return all(term in translation for term in required_terms(glossary, sentence))
