"""`nanomt export argos`: packages of toy runs (shared and separate SentencePiece models) and of an imported Marian
model install with argostranslate (offline, into a temporary packages directory) and translate with the tokens of
`export ct2`; what a package cannot carry is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_config
from marian_models import opus_mt_tokenizer, sentencepiece_model, small_config

from nanomt.core.config import config_from_dict
from nanomt.core.languages import language_pair
from nanomt.interop.argos import ArgosExportError, export_argos
from nanomt.training.train import train

argostranslate = pytest.importorskip("argostranslate")
pytest.importorskip("ctranslate2")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # foreign converters and loaders

SENTENCES = 30


@pytest.fixture(scope="module")
def argos(tmp_path_factory):
    """argostranslate imported with its data, config and cache directories in a temporary home."""
    home = tmp_path_factory.mktemp("argos_home")
    env = {f"XDG_{d}_HOME": str(home / d.lower()) for d in ("DATA", "CONFIG", "CACHE")}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**env, "ARGOS_PACKAGES_DIR": str(home / "packages")}.items():
            mp.setenv(name, value)
        from argostranslate import package, settings, translate

        yield package, settings, translate


@pytest.fixture
def installed(argos, tmp_path, monkeypatch):
    """install(path) -> the package's translation, from a fresh packages directory, decoded greedily in float32."""
    package, settings, translate = argos
    packages = tmp_path / "packages"
    packages.mkdir()
    monkeypatch.setattr(settings, "package_data_dir", packages)
    monkeypatch.setattr(settings, "package_dirs", [packages])
    # Greedy search (beam 1, where the length penalty does nothing), the model's float32 weights, one thread.
    monkeypatch.setattr(settings, "beam_size", 1)
    monkeypatch.setattr(settings, "compute_type", "default")
    monkeypatch.setattr(settings, "intra_threads", 1)
    translate.installed_translates.clear()
    translate.get_installed_languages.cache_clear()

    def install(path: Path, source: str, target: str):
        package.install_from_path(path)
        return translate.get_translation_from_codes(source, target)

    yield install
    translate.installed_translates.clear()
    translate.get_installed_languages.cache_clear()


class OneSentence:
    """Argos's sentence splitter for a test: each input is one sentence (MiniSBD's models are fetched online)."""

    def split_sentences(self, text: str) -> list[str]:
        return [text]


def argos_tokens(translation, sentences: list[str]) -> tuple[list[list[str]], list[str]]:
    """The target pieces CTranslate2 gave Argos for each sentence, and Argos's texts."""
    underlying = translation.underlying  # CachedTranslation(PackageTranslation)
    underlying.sentencizer = OneSentence()
    tokenizer, seen = underlying.pkg.tokenizer, []
    decode = tokenizer.decode

    def spy(tokens):
        seen.append(list(tokens))
        return decode(tokens)

    tokenizer.decode = spy
    texts = [translation.translate(s) for s in sentences]
    return seen, texts


# ---------------------------------------------------------------------------------------------------------
# Runs: toy nanomt trainings and an imported random Marian model.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_runs(toy_corpus, tmp_path_factory) -> dict[str, Path]:
    """Separate source and target SentencePiece models, and one shared model; 256 positions, so that Argos's
    unbudgeted decoding stays within them."""
    out = {}
    for name, shared in (("separate", False), ("shared", True)):
        cfg = tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60, lr=1e-2, max_tokens=1000)
        cfg["data"]["shared_vocab"] = shared
        cfg["model"]["max_positions"] = 256
        out[name] = tmp_path_factory.mktemp(name) / "run"
        train(config_from_dict(cfg), out[name])
    return out


@pytest.fixture(scope="module")
def marian_run(toy_corpus, tmp_path_factory) -> Path:
    """A random MarianMTModel with the Opus-MT layout (two SentencePiece models, one id table), imported."""
    transformers = pytest.importorskip("transformers")
    from nanomt.interop import import_marian

    out = tmp_path_factory.mktemp("marian")
    table = opus_mt_tokenizer(out, toy_corpus)["vocab"]
    cfg = small_config(
        len(table),
        table["<pad>"],
        decoder_vocab_size=len(table),
        max_position_embeddings=256,
        activation_function="swish",
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.1 if "layer_norm" in name else 0.4)
        bias = model.final_logits_bias[0]
        bias.normal_(0.0, 1.0)
        bias[0] += 7.0  # EOS: translations that end, of several lengths
        bias[[1, table["<pad>"]]] -= 20.0  # no <unk> (Argos would replace it with a source word) and no <pad>
    model.save_pretrained(out)
    return import_marian(out, tmp_path_factory.mktemp("imported") / "run")


@pytest.fixture(scope="module")
def sources(toy_corpus) -> list[str]:
    return toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:SENTENCES]


# ---------------------------------------------------------------------------------------------------------
# Installed in Argos, the package translates as `export ct2` does.
# ---------------------------------------------------------------------------------------------------------


def check_package(path: Path, run: Path, source: str, target: str) -> None:
    """The zip's layout and metadata, as argostranslate.package documents them."""
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        folder = f"translate-{source}_{target}-1_0"
        assert {n.split("/")[0] for n in names} == {folder}
        assert {f"{folder}/metadata.json", f"{folder}/sentencepiece.model", f"{folder}/model/model.bin"} <= set(names)
        meta = json.loads(z.read(f"{folder}/metadata.json"))
        tokenizer = run / "tokenizer"
        src_model = tokenizer / ("spm.model" if (tokenizer / "spm.model").is_file() else "src.model")
        assert z.read(f"{folder}/sentencepiece.model") == src_model.read_bytes()
    assert meta["from_code"] == source and meta["to_code"] == target and meta["type"] == "translate"
    assert {"package_version", "argos_version", "from_name", "to_name"} <= set(meta)


def assert_same_tokens(run: Path, package: Path, source: str, target: str, sources, install, tmp_path) -> None:
    """Argos's greedy tokens for every sentence are Ct2Translator's (an `export ct2` of the same run)."""
    from nanomt.interop.ct2 import Ct2Translator, export_ct2

    ct2 = Ct2Translator(export_ct2(run, tmp_path / "ct2"), intra_threads=1)
    ct2.decode["min_len"] = 1  # Argos leaves CTranslate2's min_decoding_length at 1: never an empty translation
    ids = ct2.translate_ids(ct2.encode(sources), beam_size=1)
    budgets = [ct2.max_len(len(s)) for s in ct2.encode(sources)]
    theirs, texts = argos_tokens(install(package, source, target), sources)
    assert len(theirs) == len(sources)
    ended = 0
    for i, (mine, their) in enumerate(zip(ids, theirs)):
        pieces = [ct2.tgt_vocab[t] for t in mine]
        if len(pieces) < budgets[i]:  # ended with EOS: the whole translation
            ended += 1
            assert their == pieces, sources[i]
            assert texts[i].strip() == ct2.decode_ids([mine])[0], sources[i]
        else:  # cut by nanomt's length budget, which Argos does not have
            assert their[: len(pieces)] == pieces, sources[i]
    lengths = sorted(len(t) for t in theirs)
    assert ended >= len(sources) * 2 // 3 and len(set(lengths)) > 2, lengths


@pytest.mark.parametrize("variant", ["separate", "shared"])
def test_toy_run_package_translates_as_export_ct2(variant, toy_runs, sources, installed, tmp_path):
    run = toy_runs[variant]
    package = export_argos(run, tmp_path / "toy.argosmodel", source="de", target="en", names=("German", None))
    check_package(package, run, "de", "en")
    meta = json.loads(zipfile.ZipFile(package).read("translate-de_en-1_0/metadata.json"))
    assert (meta["from_name"], meta["to_name"]) == ("German", "en")
    assert_same_tokens(run, package, "de", "en", sources, installed, tmp_path)


def test_imported_marian_package_translates_as_export_ct2(marian_run, sources, installed, tmp_path):
    """The id table needs nothing more: CTranslate2's vocabulary maps Argos's pieces to the model's ids."""
    package = export_argos(marian_run, tmp_path / "marian.argosmodel", source="fr", target="en")
    check_package(package, marian_run, "fr", "en")
    assert_same_tokens(marian_run, package, "fr", "en", sources, installed, tmp_path)


def test_the_command_writes_what_the_function_writes(toy_runs, tmp_path, capsys):
    from nanomt.cli import main

    run, out = toy_runs["shared"], tmp_path / "cmd.argosmodel"
    main(["export", "argos", str(run), "--out", str(out), "--source", "cs", "--target", "en"])
    assert capsys.readouterr().out.strip() == f"exported to {out}"
    ref = export_argos(run, tmp_path / "fn.argosmodel", source="cs", target="en")
    with zipfile.ZipFile(out) as a, zipfile.ZipFile(ref) as b:
        assert a.namelist() == b.namelist()
        assert all(a.read(n) == b.read(n) for n in a.namelist())
    with pytest.raises(SystemExit):  # the toy run's files (train.src, train.tgt) name no languages
        main(["export", "argos", str(run), "--out", str(tmp_path / "no_codes.argosmodel")])
    assert "give the codes (--source de --target en)" in capsys.readouterr().err
    assert not (tmp_path / "no_codes.argosmodel").exists()


# ---------------------------------------------------------------------------------------------------------
# Languages, and what is refused.
# ---------------------------------------------------------------------------------------------------------


def test_the_package_is_named_by_the_run_s_language_pair(toy_runs, tmp_path):
    """Without --source/--target, the codes are nanomt.core.languages.language_pair's of the run's config."""
    run = tmp_path / "run"
    shutil.copytree(toy_runs["shared"], run, ignore=shutil.ignore_patterns("checkpoints"))
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    config["data"]["train"] = [{"src": "a/train.cs", "tgt": "a/train.en"}, {"src": "b/news.cs", "tgt": "b/news.en"}]
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    assert language_pair(config_from_dict({"data": config["data"]}).data) == ("cs", "en")
    check_package(export_argos(run, tmp_path / "cs_en.argosmodel"), run, "cs", "en")


def fake_run(run: Path, tmp_path: Path) -> Path:
    """A copy of a run's config.yaml and tokenizer/ (no weights: the checks come first)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    shutil.copyfile(run / "config.yaml", fake / "config.yaml")
    shutil.copytree(run / "tokenizer", fake / "tokenizer")
    return fake


def test_a_model_wanting_a_language_tag_is_refused(toy_runs, tmp_path):
    fake = fake_run(toy_runs["separate"], tmp_path)
    table = {"</s>": 0, "<unk>": 1, ">>fra<<": 2, ">>spa<<": 3, "<pad>": 4}
    (fake / "tokenizer" / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ArgosExportError, match=r"target-language tag such as >>fra<< .*2 in its vocabulary"):
        export_argos(fake, tmp_path / "x.argosmodel", source="en", target="fr")


def test_target_pieces_the_source_model_writes_otherwise_are_refused(toy_runs, toy_corpus, tmp_path):
    """A byte-fallback target model: its <0x..> pieces are bytes to it, text to a source model without them."""
    fake = fake_run(toy_runs["separate"], tmp_path)
    ids = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
    target = sentencepiece_model(toy_corpus["train.tgt"], 300, byte_fallback=True, **ids)
    (fake / "tokenizer" / "tgt.model").write_bytes(target)
    with pytest.raises(ArgosExportError, match=r"writes 256 of the target's pieces otherwise \(e\.g\. '<0x00>'"):
        export_argos(fake, tmp_path / "x.argosmodel", source="de", target="en")
    assert not (tmp_path / "x.argosmodel").exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "the run names no language pair"),
        ({"source": "de"}, "the run names no language pair"),
        ({"source": "German", "target": "en"}, "'German' is not a language code"),
        ({"source": "de/x", "target": "en"}, "'de/x' is not a language code"),
        ({"source": "en", "target": "en"}, "both 'en'"),
        ({"source": "de", "target": "en", "package_version": "v1"}, "package version 'v1'"),
    ],
)
def test_bad_options_are_refused(toy_runs, tmp_path, kwargs, message):
    with pytest.raises(ArgosExportError, match=message):
        export_argos(toy_runs["shared"], tmp_path / "x.argosmodel", **kwargs)
    assert not os.listdir(tmp_path)


def test_out_must_be_a_file(toy_runs, tmp_path):
    with pytest.raises(ArgosExportError, match="is a directory"):
        export_argos(toy_runs["shared"], tmp_path, source="de", target="en")
