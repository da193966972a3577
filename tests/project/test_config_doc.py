"""docs/config.md documents every config key with the dataclasses' defaults."""

import dataclasses
import re

import pytest
import yaml
from paths import REPO

from nanomt.core.config import (
    CorpusConfig,
    DataConfig,
    DecodeConfig,
    HFDataConfig,
    ModelConfig,
    SplitConfig,
    TrainConfig,
    to_dict,
)

DOC = REPO / "docs" / "config.md"

SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "data.train, data.valid, data.test": SplitConfig,
    "data.train as a list of corpora": CorpusConfig,
    "data.hf": HFDataConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
}


def doc_tables() -> dict[str, dict[str, str]]:
    """{section heading: {key: default cell}} for every table under a `## heading` of docs/config.md."""
    tables: dict[str, dict[str, str]] = {}
    heading = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("|") and heading is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] in ("key", "") or set(cells[0]) <= set("-: "):
                continue  # the header row and the |---| row
            key = re.fullmatch(r"`(\w+)`", cells[0])
            assert key, f"docs/config.md, section {heading!r}: the key cell {cells[0]!r} is not `name`"
            assert len(cells) == 4, f"docs/config.md, {heading}.{key[1]}: want key | type | default | meaning"
            rows = tables.setdefault(heading, {})
            assert key[1] not in rows, f"docs/config.md documents {heading}.{key[1]} twice"
            rows[key[1]] = cells[2]
    return tables


def test_every_section_has_a_table():
    assert set(doc_tables()) == set(SECTIONS)


@pytest.mark.parametrize("section", SECTIONS)
def test_keys_are_the_dataclass_fields(section):
    documented = set(doc_tables().get(section, {}))
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    assert not fields - documented, f"docs/config.md, section {section!r}: no row for {sorted(fields - documented)}"
    assert not documented - fields, f"docs/config.md, section {section!r}: no such key {sorted(documented - fields)}"


@pytest.mark.parametrize("section", SECTIONS)
def test_defaults_are_the_dataclass_defaults(section):
    rows = doc_tables().get(section, {})
    for f in dataclasses.fields(SECTIONS[section]):
        if f.name not in rows:
            continue  # test_keys_are_the_dataclass_fields reports it
        cell = rows[f.name]
        value = re.fullmatch(r"`([^`]*)`", cell)
        if f.default is dataclasses.MISSING:
            # No plain default (a required field, or a nested section): the cell says in words where it comes from.
            assert value is None, f"{section}.{f.name} has no default value, but docs/config.md gives {cell}"
            continue
        assert value, f"{section}.{f.name}: docs/config.md should give the default {f.default!r} as `value`"
        documented = yaml.safe_load(value[1])
        expected = to_dict(f.default)  # as YAML holds it: a tuple is a list
        assert documented == expected and type(documented) is type(expected), (
            f"{section}.{f.name}: docs/config.md says {value[1]}, the dataclass {f.default!r}"
        )
