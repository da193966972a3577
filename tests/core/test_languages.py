"""Language codes: one pattern, one base language of a tag, one language pair of a run, and every caller uses them."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from nanomt.core.config import config_from_dict
from nanomt.core.languages import CODE, PAIR_CODE, PLACEHOLDERS, base_code, is_code, language_pair
from nanomt.documents.sentences import DEFAULT_LANGUAGE, language_code
from nanomt.documents.translation import Source
from nanomt.serve.models import ModelSet

WMT14 = {"path": "wmt14", "name": "de-en", "src_lang": "de", "tgt_lang": "en"}


def data(section: dict):
    return config_from_dict({"data": section}).data


@pytest.mark.parametrize(
    "section, pair",
    [
        ({"hf": WMT14}, ("de", "en")),
        ({"hf": WMT14, "train": {"src": "t.fr", "tgt": "t.it"}}, ("de", "en")),  # the dataset's codes first
        ({"hf": {"path": "x", "src_lang": "source", "tgt_lang": "target", "translation_field": None}}, None),  # columns
        ({"hf": {"path": "wmt14"}}, None),
        ({"train": {"src": "corpus/train.de", "tgt": "corpus/train.en"}}, ("de", "en")),
        ({"train": {"src": "a/train.pt-BR", "tgt": "a/train.en"}}, ("pt-BR", "en")),
        ({"train": {"src": "a/train.zh_Hant", "tgt": "a/train.eng"}}, ("zh_Hant", "eng")),
        ({"train": [{"src": "x.cs", "tgt": "x.en"}, {"src": "y.cs", "tgt": "y.en", "weight": 2}]}, ("cs", "en")),
        ({"train": [{"src": "x.cs", "tgt": "x.en"}, {"src": "y.fr", "tgt": "y.en"}]}, None),  # corpora disagree
        ({"train": [{"src": "x.cs", "tgt": "x.en"}, {"tsv": "y.tsv"}]}, ("cs", "en")),  # a TSV names no codes
        ({"train": {"src": "train.src", "tgt": "train.tgt"}}, None),  # placeholders
        ({"train": {"src": "train.src", "tgt": "train.en"}}, None),
        ({"train": {"src": "train.txt", "tgt": "train.txt"}}, None),  # the same "code" twice
        ({"train": {"src": "train.de", "tgt": "train.de"}}, None),
        ({"train": {"src": "train.german", "tgt": "train.english"}}, None),  # no codes
        ({"train": {"src": "train", "tgt": "train2"}}, None),
        ({"train": {"tsv": "train.tsv"}}, None),
        ({}, None),
    ],
)
def test_language_pair_of_a_run(section, pair):
    assert language_pair(data(section)) == pair


@pytest.mark.parametrize(
    "tag, base",
    [
        ("de", "de"),
        ("DE", "de"),
        ("de-DE", "de"),
        ("de_AT.UTF-8", "de"),
        ("en_US@euro", "en"),
        ("zh-Hans", "zh"),
        ("pt_BR", "pt"),
        ("fil", "fil"),
        ("zt", "zt"),  # LibreTranslate's aliases are language detection's business
        (" de ", "de"),
        ("auto", None),
        ("german", None),
        ("x", None),
        ("", None),
        (None, None),
    ],
)
def test_base_code(tag, base):
    assert base_code(tag) == base


@pytest.mark.parametrize("code", ["de", "eng", "pt-BR", "pt_BR", "zh_Hant", "DE", "sr-Latn"])
def test_codes(code):
    assert is_code(code) and re.fullmatch(CODE, code)


@pytest.mark.parametrize("text", ["German", "de/x", "d", "de-", "de-B", "de-BR-x", "", "1de"])
def test_not_codes(text):
    assert not is_code(text)


def test_a_pair_code_is_a_code_without_the_dash_that_separates_a_pair():
    spec = re.compile(rf"(?P<source>{PAIR_CODE})-(?P<target>{PAIR_CODE})")
    for source, target in (("de", "en"), ("pt_BR", "en"), ("eng", "zh_Hant")):
        m = spec.fullmatch(f"{source}-{target}")
        assert m is not None and (m["source"], m["target"]) == (source, target)
        assert is_code(source) and is_code(target)
    assert spec.fullmatch("pt-BR-en") is None
    assert not re.fullmatch(PAIR_CODE, "pt-BR") and re.fullmatch(CODE, "pt-BR")


def test_callers_use_the_one_rule():
    """The server names a run by its pair (src-tgt where it has none); documents split by its source language."""
    named = config_from_dict({"data": {"train": [{"src": "x.cs", "tgt": "x.en"}, {"src": "y.cs", "tgt": "y.en"}]}})
    toy = config_from_dict({"data": {"train": {"src": "train.src", "tgt": "train.tgt"}}})
    tokenizer = SimpleNamespace(encode_src=lambda texts: [[1] for _ in texts], target_codes=())
    for cfg, pair, lang in ((named, ("cs", "en"), "cs"), (toy, PLACEHOLDERS, None)):
        translator = SimpleNamespace(cfg=cfg, tokenizer=tokenizer)
        model = ModelSet.of(translator).default
        assert (model.source, model.target) == pair
        assert Source.of(cfg, tokenizer).lang == lang
    assert language_code(None) == DEFAULT_LANGUAGE and language_code("cs-CZ") == base_code("cs-CZ") == "cs"


def test_the_module_needs_only_the_standard_library():
    """The server's settings and the command line's parser may use it without importing torch, numpy or yaml."""
    code = "import sys, nanomt.core.languages; print(sorted(m for m in ('torch', 'numpy', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
