"""A setting described once (nanomt.core.settings): its bounds checked where the value is built, and every front door
of a decoding setting (a config's decode section, the flags, nanomt's request, the CTranslate2 export) generated from
its field; the worked example of docs/architecture.md is two files."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from types import SimpleNamespace

import pytest
from paths import REPO
from pydantic import ValidationError

from nanomt.cli.models import decoding_flags
from nanomt.cli.parser import build_parser
from nanomt.core.config import ConfigError, DecodeConfig, config_from_dict
from nanomt.core.decoding import MAX_REQUEST_BEAM, RULES, Decoding, DecodingError, Sampling
from nanomt.core.settings import DOORS, bounds_text, check_bounds, default_of, setting, within
from nanomt.interop.ct2 import Ct2ExportError, Ct2Translator
from nanomt.serve.libretranslate import MAX_ALTERNATIVES, LibreTranslateRequest
from nanomt.serve.schemas import CROSS_FIELD_RULES, AttentionRequest, TranslateRequest

SETTINGS = [(cls, f.name) for cls in (Decoding, Sampling) for f in dataclasses.fields(cls)]
IDS = [f"{cls.__name__}.{name}" for cls, name in SETTINGS]
MODEL = {"src_vocab_size": 10, "tgt_vocab_size": 10}


def field_of(cls: type, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def other_value(cls: type, name: str):
    """A valid value of a setting other than its default."""
    f = field_of(cls, name)
    default, choices = default_of(f), f.metadata["choices"]
    if choices:
        return next(c for c in choices if c != default)
    if name == "sampling":
        return Sampling()
    if default is None:
        return "fra" if "str" in str(f.type) else 7  # a code (target_lang), else a number (seed)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default / 2 if default else 0.5
    return (("nuka", "dog"),)


def decoding_with(cls: type, name: str, value) -> Decoding:
    """A Decoding with one setting changed (a Sampling setting: sampling with it)."""
    if cls is Sampling:
        return Decoding().replace(sampling={name: value})
    return Decoding().replace(**{name: value})


def translate_flags() -> dict[str, object]:
    """`nanomt translate`'s arguments by their dest."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {a.dest: a for a in sub.choices["translate"]._actions}


def reaches(door: str, cls: type, name: str) -> bool:
    """Whether a front door takes the setting."""
    if door == "config":
        return name in {f.name for f in dataclasses.fields(DecodeConfig)}
    if door == "flag":
        return name in translate_flags()
    if door == "request":
        on = [name in m.model_json_schema()["properties"] for m in (TranslateRequest, AttentionRequest)]
        assert on[0] == on[1], f"{name}: /translate and /attention take the same decoding settings"
        return on[0]
    return field_of(cls, name).metadata["ct2"] is not None or cls is Sampling and reaches("ct2", Decoding, "sampling")


@pytest.mark.parametrize("cls, name", SETTINGS, ids=IDS)
def test_every_decoding_setting_reaches_each_front_door_or_says_why_not(cls, name):
    meta = field_of(cls, name).metadata
    assert "help" in meta, (
        f"{cls.__name__}.{name} is not made with nanomt.core.settings.setting: no front door knows it"
    )
    assert set(meta["absent"]) <= set(DOORS)
    for door in DOORS:
        why = meta["absent"].get(door)
        assert why is None or why.strip(), f"{name}: absent at {door} without a reason"
        if cls is Sampling and door == "ct2":
            continue  # the export takes sampling as a whole or refuses it (Decoding.sampling)
        assert reaches(door, cls, name) == (why is None), f"{cls.__name__}.{name} at {door}: {why or 'missing'}"


@pytest.mark.parametrize("cls, name", SETTINGS, ids=IDS)
def test_a_setting_given_at_a_door_reaches_the_decoding(cls, name, tmp_path):
    """The value a flag, a request field or a config key gives is the Decoding's (a file's flag read)."""
    f, value = field_of(cls, name), other_value(cls, name)
    want = decoding_with(cls, name, value)
    if reaches("flag", cls, name):
        given = value
        if f.metadata["read"]:  # a glossary file
            (tmp_path / "terms.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in value), encoding="utf-8")
            given = tmp_path / "terms.tsv"
        flag = translate_flags()[name].option_strings[0]
        argv = [flag] if isinstance(value, bool) or name == "sampling" else [flag, str(given)]
        argv += ["--sampling"] if cls is Sampling else []
        args = build_parser().parse_args(["translate", "runs/x", *argv])
        assert Decoding().replace(**decoding_flags(args)) == want, argv
    if reaches("request", cls, name):
        body = {"text": ["a"], name: [list(p) for p in value] if isinstance(value, tuple) else value}
        body |= {"temperature": 1.0} if name == "seed" else {}
        got = TranslateRequest.model_validate(body).decoding(Decoding())
        assert got == (want.replace(sampling={name: value, "temperature": 1.0}) if name == "seed" else want)
    if reaches("config", cls, name):
        cfg = config_from_dict({"model": MODEL, "decode": {name: value}})
        assert Decoding.from_config(cfg.decode) == want


@pytest.mark.parametrize("cls, name", SETTINGS, ids=IDS)
def test_the_export_passes_a_setting_on_or_refuses_it_with_its_reason(cls, name):
    meta, value = field_of(cls, name).metadata, other_value(cls, name)
    export = SimpleNamespace(decode={"max_tokens": 100})  # what search_options reads of the Ct2Translator
    d = decoding_with(cls, name, value)
    if cls is Sampling or meta["ct2"] is None:
        field = "sampling" if cls is Sampling else name
        with pytest.raises(Ct2ExportError, match=f"^{field}: "):
            Ct2Translator.search_options(export, d)
    elif meta["ct2"] != "nanomt":  # one of CTranslate2's options takes it as it is
        assert Ct2Translator.search_options(export, d)[meta["ct2"]] == value


@pytest.mark.parametrize("cls, name", [s for s in SETTINGS if field_of(*s).metadata["bounds"]], ids=str)
def test_a_value_out_of_bounds_is_refused_at_every_door_naming_the_setting(cls, name):
    bounds = field_of(cls, name).metadata["bounds"]
    bad = bounds.get("ge", bounds.get("gt", 0)) - 1
    with pytest.raises(ValueError, match=f"^{name} must be {re.escape(bounds_text(bounds))}, got"):
        decoding_with(cls, name, bad)
    if reaches("request", cls, name):
        with pytest.raises(ValidationError, match=name):
            TranslateRequest.model_validate({"text": ["a"], name: bad})
    if reaches("config", cls, name):
        with pytest.raises(ConfigError, match=name):
            config_from_dict({"model": MODEL, "decode": {name: bad}})


def test_a_request_is_capped_where_a_stranger_asks_and_the_value_is_not():
    assert Decoding(beam_size=MAX_REQUEST_BEAM + 1).beam_size == MAX_REQUEST_BEAM + 1
    with pytest.raises(ValidationError, match="beam_size"):
        TranslateRequest.model_validate({"text": ["a"], "beam_size": MAX_REQUEST_BEAM + 1})
    schema = TranslateRequest.model_json_schema()["properties"]["temperature"]["anyOf"][0]
    assert (schema["minimum"], schema["maximum"]) == (1e-3, 1e3)  # the cap, tighter than > 0


@pytest.mark.parametrize(
    "settings, rule",
    [
        ({"beam_size": 2, "n_best": 3}, "n_best_within_beam"),
        ({"beam_size": 2, "sampling": {"top_k": 5}}, "beam_with_sampling"),
        ({"glossary": (("a", "b"),), "sampling": {"top_k": 5}}, "glossary_with_sampling"),
    ],
)
def test_rules_across_fields_live_in_the_decoding_and_a_request_states_them(settings, rule):
    with pytest.raises(DecodingError) as e:
        Decoding().replace(**settings)
    assert e.value.rule == rule and set(RULES) <= set(CROSS_FIELD_RULES)
    body = {"text": ["a"], **{k: v for k, v in settings.items() if k != "sampling"}, **settings.get("sampling", {})}
    if "n_best" not in body:  # a request has no n_best (LibreTranslate's alternatives, below)
        with pytest.raises(ValidationError) as e:
            TranslateRequest.model_validate({**body, "glossary": [list(p) for p in body.get("glossary", ())]})
        assert [err["type"] for err in e.value.errors()] == [rule]
    assert RULES[rule] in TranslateRequest.model_json_schema()["x-rules"]


def test_libretranslate_takes_no_decoding_setting_but_its_alternatives():
    """LibreTranslate's API is its own: its only decoding field is alternatives, n_best - 1, within a beam a request
    may ask for."""
    names = {f.name for cls in (Decoding, Sampling) for f in dataclasses.fields(cls)}
    assert not set(LibreTranslateRequest.model_fields) & names
    assert MAX_ALTERNATIVES + 1 <= MAX_REQUEST_BEAM
    assert Decoding(beam_size=MAX_ALTERNATIVES + 1, n_best=MAX_ALTERNATIVES + 1).n_best == MAX_ALTERNATIVES + 1


def test_bounds_are_checked_and_written_as_a_reader_writes_them():
    @dataclasses.dataclass(frozen=True)
    class Knobs:
        rate: float = setting(0.5, help="a rate", gt=0, le=1)
        count: int = setting(0, help="a count", ge=0)
        kind: str = setting("a", help="a kind", choices=("a", "b"))
        free: float = setting(0.0, help="any number")
        plain: int = -5  # no metadata: not checked

    check_bounds(Knobs())
    for bad, message in [
        ({"rate": 0.0}, r"rate must be in \(0, 1\], got 0.0"),
        ({"rate": float("nan")}, "rate must be in"),
        ({"count": -1}, "count must be >= 0, got -1"),
        ({"kind": "c"}, r"kind must be one of \('a', 'b'\), got 'c'"),
        ({"free": float("inf")}, "free must be a number, got inf"),
        # Python callers: the type a field declares (argparse, YAML and the request schema convert before this).
        ({"count": 2.5}, "count must be an integer, got 2.5"),
        ({"rate": "0.5"}, "rate must be a number, got '0.5'"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_bounds(Knobs(**bad))
    assert within(2**63, {"ge": 0, "lt": 2**64}) and not within(2**64, {"ge": 0, "lt": 2**64})
    assert bounds_text({"ge": 0, "lt": 2**64}) == "in [0, 18446744073709551616)"


def worked_example() -> list[str]:
    """The three code blocks of docs/architecture.md's "Adding a decoding rule", in order."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Adding a decoding rule", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


CHECK_EXAMPLE = """
import dataclasses, sys, types, torch
from nanomt.cli.parser import build_parser
from nanomt.cli.models import decoding_flags
from nanomt.core.config import DecodeConfig, config_from_dict
from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer, ModelConfig
from nanomt.decoding.search import search
from nanomt.interop.ct2 import Ct2ExportError, Ct2Translator
from nanomt.serve.schemas import TranslateRequest

args = build_parser().parse_args(["translate", "runs/x", "--max-repeat", "2"])
assert Decoding().replace(**decoding_flags(args)).max_repeat == 2
cfg = config_from_dict({"model": {"src_vocab_size": 12, "tgt_vocab_size": 12}, "decode": {"max_repeat": 2}})
assert Decoding.from_config(cfg.decode).max_repeat == 2
assert "max_repeat" in {f.name for f in dataclasses.fields(DecodeConfig)}
assert TranslateRequest.model_validate({"text": ["a"], "max_repeat": 2}).decoding(Decoding()).max_repeat == 2
assert TranslateRequest.model_json_schema()["properties"]["max_repeat"]["anyOf"][0]["minimum"] == 0
try:
    Decoding(max_repeat=-1)
    sys.exit("max_repeat -1 was taken")
except ValueError as e:
    assert str(e) == "max_repeat must be >= 0, got -1", e
try:
    Ct2Translator.search_options(types.SimpleNamespace(decode={"max_tokens": 9}), Decoding(max_repeat=2))
    sys.exit("the export took max_repeat")
except Ct2ExportError as e:
    assert str(e) == "max_repeat: CTranslate2 has no such option", e
torch.manual_seed(0)
cfg = ModelConfig(12, 12, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, output_bias=True)
model = Transformer(cfg).eval()
with torch.no_grad():
    model.output.bias.copy_(torch.arange(12.0) * 10)  # the likeliest token is 11 every step, then 10, then 9...
src = torch.tensor([[5, 6, 3]])
for beam in (1, 3):
    plain = search(model, src, Decoding(beam_size=beam, max_len_a=0.0, max_len_b=6))[0][0].tokens
    capped = search(model, src, Decoding(beam_size=beam, max_len_a=0.0, max_len_b=6, max_repeat=2))[0][0].tokens
    assert plain.count(11) > 2 and max(capped.count(t) for t in capped) == 2, (plain, capped)
sys.path.append(sys.argv[1])  # the checkout's scripts/, after the copy of the package
from scripts.docs import config_rows, decoding_page

assert any(row.startswith("| `max_repeat` | int | `0` |") for row in config_rows())
assert "| `max_repeat` | `0` | `decode.max_repeat` | `--max-repeat` | `max_repeat` | - |" in decoding_page()
print("worked example: every door")
"""


def test_the_worked_example_is_two_files_and_reaches_every_door(tmp_path):
    """docs/architecture.md's rule `max_repeat`, its three blocks applied as they stand to a copy of the package
    (the field in core/decoding.py, the class and its line in decoding/rules.py): the config, the flag, the request,
    the export and the docs' tables take it, and decoding obeys it."""
    import shutil

    field, rule, line = worked_example()
    package = tmp_path / "nanomt"
    shutil.copytree(REPO / "nanomt", package, ignore=shutil.ignore_patterns("__pycache__"))
    decoding = package / "core" / "decoding.py"
    text = decoding.read_text(encoding="utf-8")
    anchor = "\n    def __post_init__(self):\n        check_bounds(self)\n        if self.n_best"
    assert text.count(anchor) == 1
    decoding.write_text(text.replace(anchor, "\n" + field + anchor), encoding="utf-8")
    rules = package / "decoding" / "rules.py"
    text = rules.read_text(encoding="utf-8")
    assert text.count("\ndef rules_for(") == 1 and text.count("    if any(prefixes):") == 1
    text = text.replace("\ndef rules_for(", "\n" + rule + "\n\ndef rules_for(")
    rules.write_text(text.replace("    if any(prefixes):", line + "    if any(prefixes):"), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = dict(env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # cwd: not this checkout first
    done = subprocess.run([sys.executable, "-c", CHECK_EXAMPLE, str(REPO)], **run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "worked example: every door"
    changed = {p.relative_to(tmp_path).as_posix() for p in (decoding, rules)}
    assert changed == {"nanomt/core/decoding.py", "nanomt/decoding/rules.py"}


def test_the_request_schema_is_the_decodings():
    """Each request field's bounds are its setting's (or its cap), its description its help."""
    props = TranslateRequest.model_json_schema()["properties"]
    hints = typing.get_type_hints(Decoding)
    for f in dataclasses.fields(Decoding):
        if f.name not in props:
            continue
        assert props[f.name]["description"].startswith(f.metadata["help"])
        if hints[f.name] is int:
            low = {**f.metadata["bounds"], **f.metadata["cap"]}.get("ge")
            assert props[f.name]["anyOf"][0].get("minimum") == low
