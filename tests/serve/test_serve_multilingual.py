"""One multilingual run (a random Marian with >>fra<<, >>spa<<, >>por<< tokens, imported) served for every pair it
knows: LibreTranslate's /translate for each target against the Translator with that code, /languages listing each
target by name, a target the run lacks refused naming the pairs it has, one load for all its targets, and a pivot
through it."""

from __future__ import annotations

import pytest
from marian_models import multilingual_marian

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.core.checkpoint import CheckpointError  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.interop import import_marian  # noqa: E402
from nanomt.serve import ModelSet, ModelSpec, create_app  # noqa: E402
from nanomt.training.synthetic import write_corpus  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CODES = ("fra", "spa", "por")
SERVED = {"fr": "fra", "es": "spa", "pt": "por"}  # LibreTranslate's codes for the run's ISO 639-3 ones


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("toy"), pairs=400, valid=4, test=6)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    hf_dir = multilingual_marian(tmp_path_factory.mktemp("marian"), corpus, CODES, 12)
    return import_marian(hf_dir, tmp_path_factory.mktemp("run") / "run")


def served(specs: list[str]) -> ModelSet:
    return ModelSet.read([ModelSpec.parse(s) for s in specs], "en", None, "cpu", False)


def test_each_target_of_the_run_is_served_with_its_code(run, corpus):
    lines = corpus["test.src"].read_text().splitlines()
    own = Translator.from_checkpoint(run)
    models = served([f"en-mul={run}"])
    with TestClient(create_app(models)) as c:
        for target, code in SERVED.items():
            res = c.post("/translate", json={"q": lines, "source": "en", "target": target})
            assert res.status_code == 200, res.text
            assert res.json()["translatedText"] == own.translate(lines, target_lang=code), target
        languages = c.get("/languages").json()
        assert [(x["code"], x["targets"]) for x in languages] == [("en", sorted(SERVED))]
        missing = c.post("/translate", json={"q": lines[0], "source": "en", "target": "de"})
        assert missing.status_code == 400
        assert all(f"en-{t}" in missing.json()["error"] for t in SERVED), missing.json()
    loaded = {id(m.translator) for m in models.models}
    assert len(loaded) == 1 and None not in loaded  # one Translator for all three targets


def test_a_run_served_from_several_sources_is_loaded_once_and_never_into_its_source(run, corpus):
    models = served([f"en-mul={run}", f"fr-mul={run}"])
    assert [m.name for m in models.models] == ["en-fr", "en-es", "en-pt", "fr-es", "fr-pt"]
    line = corpus["test.src"].read_text().splitlines()[0]
    with TestClient(create_app(models)) as c:
        for source, target in (("en", "pt"), ("fr", "es")):
            res = c.post("/translate", json={"q": line, "source": source, "target": target})
            expected = Translator.from_checkpoint(run).translate([line], target_lang=SERVED[target])[0]
            assert res.json()["translatedText"] == expected
    assert len({id(m.translator) for m in models.models}) == 1


def test_a_run_served_for_one_of_its_targets_and_a_target_it_lacks(run):
    models = served([f"en-fr={run}"])
    assert [(m.name, m.code) for m in models.models] == [("en-fr", "fra")]
    assert [(m.name, m.code) for m in served([f"en-spa={run}"]).models] == [("en-spa", "spa")]
    with pytest.raises(CheckpointError, match="no target language de; its codes: fra, spa, por"):
        served([f"en-de={run}"])


def test_a_multilingual_run_is_a_hop_of_a_pivot(run, corpus, served_run):
    lines = corpus["test.src"].read_text().splitlines()[:2]
    models = served([f"xx-en={served_run}", f"en-mul={run}"])
    with TestClient(create_app(models)) as c:
        res = c.post("/translate", json={"text": lines, "source": "xx", "target": "pt", "beam_size": 2})
        assert res.status_code == 200, res.text
        first = Translator.from_checkpoint(served_run).translate(lines, beam_size=2)
        expected = Translator.from_checkpoint(run).translate(first, beam_size=2, target_lang="por")
        assert res.json()["translations"] == expected and res.json()["route"] == ["xx-en", "en-pt"]
