"""The docs' tables of facts described once in the package: the decoding settings, from their fields
(nanomt.core.settings; the `decode` section of docs/config.md and the whole of docs/decoding.md), and the file formats
(nanomt.documents.formats; a table in docs/cli.md). `make docs` runs it; a test fails while a file differs from
what it writes.

    python -m scripts.docs            # rewrite the tables
    python -m scripts.docs --check    # exit 1, naming the file, where a table is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path

import yaml

from nanomt.core.config import DecodeConfig
from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.settings import DOORS, bounds_text, default_of, fields_at
from nanomt.documents import formats
from scripts.common import ROOT

CONFIG_DOC, DECODING_DOC, CLI_DOC = ROOT / "docs" / "config.md", ROOT / "docs" / "decoding.md", ROOT / "docs" / "cli.md"
FORMATS_START, FORMATS_END = "<!-- formats: written by make docs -->\n", "<!-- end formats -->"
DOOR_NAMES = {
    "config": "config (`decode:`)",
    "flag": "`nanomt translate` / `evaluate`",
    "request": "nanomt's `/translate`, `/attention`",
    "ct2": "`export ct2`",
}


def type_cell(f: dataclasses.Field, hint) -> str:
    """A setting's type as docs/config.md writes it."""
    if f.metadata["choices"]:
        *rest, last = [f"`{c}`" for c in f.metadata["choices"]]
        return f"{', '.join(rest)} or {last}"
    kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return " or ".join(getattr(k, "__name__", str(k)) for k in kinds) + (" or null" if typing.get_args(hint) else "")


def default_cell(value) -> str:
    """A default as YAML writes it."""
    return f"`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`"


def meaning(f: dataclasses.Field) -> str:
    """A setting's help, with its bounds."""
    bounds = f.metadata["bounds"]
    return f.metadata["help"] + (f" (must be {bounds_text(bounds)})" if bounds else "")


def config_rows() -> list[str]:
    """docs/config.md's `decode` table: a row a DecodeConfig field."""
    hints = typing.get_type_hints(DecodeConfig)
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(DecodeConfig):
        rows.append(f"| `{f.name}` | {type_cell(f, hints[f.name])} | {default_cell(default_of(f))} | {meaning(f)} |")
    return rows


def door_cell(cls: type, f: dataclasses.Field, door: str) -> str:
    """Where a door takes the setting: its key, flag, field or CTranslate2 option; or "-"."""
    if door in f.metadata["absent"]:
        return "-"
    if door == "config":
        return f"`decode.{f.name}`"
    if door == "flag":
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        return f"`{flag}`" if cls is Decoding else f"`--sampling {flag}`"
    if door == "request":
        return f"`{f.name}`"
    return {"nanomt": "nanomt's own rule"}.get(f.metadata["ct2"], f"`{f.metadata['ct2']}`")


def decoding_page() -> str:
    """docs/decoding.md: every decoding setting, where it is given, and why not elsewhere."""
    lines = [
        "# Decoding settings",
        "",
        "<!-- Written by `make docs` (python -m scripts.docs) from the fields of nanomt/core/decoding.py. -->",
        "",
        "One `Decoding` (nanomt/core/decoding.py) holds how a sentence is decoded; each setting is described once, on",
        "its field, and every front door takes it from there: a checkpoint's config (its `decode` section, the",
        "defaults of every command and server), the flags of `nanomt translate` and `nanomt evaluate` (a command's",
        "changes), nanomt's HTTP request (a request's changes, within the server's limits) and the CTranslate2",
        "export (`Ct2Translator`). A value out of bounds is refused at every door, naming the setting. Sampling's",
        "settings apply with `--sampling` (any of `temperature`, `top_k`, `top_p` in a request).",
        "",
        "| setting | default | " + " | ".join(DOOR_NAMES[d] for d in DOORS) + " | meaning |",
        "|---|---|" + "---|" * len(DOORS) + "---|",
    ]
    for cls in (Decoding, Sampling):
        for f in dataclasses.fields(cls):
            name = f.name if cls is Decoding else f"sampling.{f.name}"
            doors = " | ".join(door_cell(cls, f, d) for d in DOORS)
            lines.append(f"| `{name}` | {default_cell(default_of(f))} | {doors} | {meaning(f)} |")
    lines += ["", "Where a door does not take a setting, why:", ""]
    for cls in (Decoding, Sampling):
        for f in dataclasses.fields(cls):
            for door, why in f.metadata["absent"].items():
                lines.append(f"- `{f.name}`, {DOOR_NAMES[door]}: {why}")
    flags = ", ".join(f"`{f.metadata['flag'] or '--' + f.name.replace('_', '-')}`" for f in fields_at(Decoding, "flag"))
    lines += ["", f"The flags in order: {flags}; `nanomt evaluate` takes them but `--n-best` and `--sampling`.", ""]
    return "\n".join(lines)


def with_config_rows(text: str) -> str:
    """docs/config.md with its `decode` table replaced by config_rows()."""
    head, rest = text.split("\n## decode\n", 1)
    intro, table_and_after = rest.split("\n| key |", 1)
    after = table_and_after.split("\n\n", 1)[1] if "\n\n" in table_and_after else ""
    return f"{head}\n## decode\n{intro}\n" + "\n".join(config_rows()) + ("\n\n" + after if after else "\n")


def format_rows() -> list[str]:
    """docs/cli.md's table of file formats: a row a format of nanomt.documents.formats."""
    rows = ["| `--format` | file name suffixes | sent back as | reads it |", "|---|---|---|---|"]
    for f in formats.TABLE:
        reads = f"{f.package} (`[files]`)" if f.package else "the standard library"
        suffixes = ", ".join(f"`{x}`" for x in f.suffixes)
        rows.append(f"| `{f.name}` ({f.title}) | {suffixes} | `{f.media_type}` | {reads} |")
    return rows


def with_format_rows(text: str) -> str:
    """docs/cli.md with the table between its formats markers replaced by format_rows()."""
    head, rest = text.split(FORMATS_START, 1)
    return head + FORMATS_START + "\n".join(format_rows()) + "\n" + FORMATS_END + rest.split(FORMATS_END, 1)[1]


def written() -> dict[Path, str]:
    """Each generated doc as this writes it."""
    return {
        CONFIG_DOC: with_config_rows(CONFIG_DOC.read_text(encoding="utf-8")),
        DECODING_DOC: decoding_page(),
        CLI_DOC: with_format_rows(CLI_DOC.read_text(encoding="utf-8")),
    }


def outdated() -> list[Path]:
    """The docs whose generated tables differ from what this writes."""
    return [p for p, text in written().items() if not p.is_file() or p.read_text(encoding="utf-8") != text]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 where a table is out of date; write nothing")
    args = p.parse_args()
    stale = outdated()
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)}: out of date; run make docs", file=sys.stderr)
        sys.exit(1 if stale else 0)
    for path, text in written().items():
        path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
