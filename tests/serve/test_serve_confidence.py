"""Confidence through the server: nanomt's /translate and LibreTranslate's, the min_confidence threshold (request
and --min-confidence), a model without calibration, each against the Translator's own translate_confident."""

import shutil

import pytest

from nanomt.decoding import calibration as calib
from nanomt.decoding.translate import Translator
from nanomt.documents.translation import text_confidence

pytest.importorskip("fastapi", reason="nanomt serve needs FastAPI: pip install 'nanomt[serve]' httpx")
pytest.importorskip("httpx", reason="the tests' client needs httpx")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import create_app  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(calibrated_run):
    return calibrated_run


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


@pytest.fixture(scope="module")
def plain(run_dir, tmp_path_factory):
    """The same model, never calibrated."""
    copy = tmp_path_factory.mktemp("plain") / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints", calib.CALIBRATION))
    return Translator.from_checkpoint(copy)


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(create_app(translator)) as c:
        yield c


@pytest.fixture(scope="module")
def sentences(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()[:8]


def test_nanomts_api_returns_the_translators_confidences(client, translator, sentences):
    res = client.post("/translate", json={"text": sentences, "confidence": True, "beam_size": 1})
    assert res.status_code == 200, res.text
    body = res.json()
    found = translator.translate_confident(sentences, beam_size=1)
    assert body["translations"] == [c.translation for c in found] == translator.translate(sentences, beam_size=1)
    assert body["confidence"] == [round(c.confidence, 4) for c in found]
    assert body["confidence_raw"] == [round(c.raw, 4) for c in found]
    assert body["calibrated"] is True and "low_confidence" not in body
    for row, c, src in zip(body["sentences"], found, sentences):
        assert len(row) == 1 and row[0]["source"] == src and row[0]["translation"] == c.translation
        assert [(w["word"], w["probability"]) for w in row[0]["words"]] == list(c.words)
        assert row[0]["doubtful"] == c.doubtful
    # a client that does not ask sees nothing new
    plain_body = client.post("/translate", json={"text": sentences, "beam_size": 1}).json()
    assert set(plain_body) == {"translations", "seconds"}


def test_a_documents_confidence_is_its_sentences_weighted_by_characters(client, translator, sentences):
    doc = f"{sentences[0].capitalize()} {sentences[1].capitalize()}\n\n{sentences[2].capitalize()}"
    body = client.post("/translate", json={"text": [doc], "split": True, "confidence": True}).json()
    plain = client.post("/translate", json={"text": [doc], "split": True}).json()
    assert body["translations"] == plain["translations"]
    row = body["sentences"][0]
    assert len(row) == 3
    found = translator.translate_confident([s["source"] for s in row], replace_unknowns=True)
    assert [s["confidence"] for s in row] == [round(c.confidence, 4) for c in found]
    expected, _ = text_confidence(list(zip([s["source"] for s in row], found)))
    assert body["confidence"][0] == round(expected, 4)


def test_min_confidence_lists_the_texts_under_it_and_drops_nothing(client, translator, sentences):
    found = translator.translate_confident(sentences)
    ranked = sorted({c.confidence for c in found})
    threshold = (ranked[len(ranked) // 2 - 1] + ranked[len(ranked) // 2]) / 2  # half of them are under it, none at it
    body = client.post("/translate", json={"text": sentences, "min_confidence": threshold}).json()
    under = [i for i, c in enumerate(found) if c.confidence < threshold]
    assert under and body["low_confidence"] == under
    assert [row[0]["low"] for row in body["sentences"]] == [i in under for i in range(len(sentences))]
    assert body["translations"] == [c.translation for c in found]  # nothing left out
    with TestClient(create_app(translator, min_confidence=threshold)) as c:  # the server's default
        assert c.post("/translate", json={"text": sentences}).json()["low_confidence"] == under
        # the request's threshold wins over the server's: none is under 0, and the answer says so
        assert c.post("/translate", json={"text": sentences, "min_confidence": 0}).json()["low_confidence"] == []
    bad = client.post("/translate", json={"text": sentences, "min_confidence": 1.5})
    assert bad.status_code == 422 and "min_confidence" in bad.text


def test_libretranslate_adds_confidence_only_when_asked(client, translator, sentences):
    q = f"{sentences[0].capitalize()} {sentences[1].capitalize()}"
    asked = client.post("/translate", json={"q": q, "source": "src", "target": "tgt", "confidence": True}).json()
    plain = client.post("/translate", json={"q": q, "source": "src", "target": "tgt"}).json()
    assert set(plain) == {"translatedText"}
    assert asked["translatedText"] == plain["translatedText"]
    assert asked["calibrated"] is True and isinstance(asked["confidence"], float)
    assert len(asked["sentences"]) == 2 and all(0 <= s["confidence"] <= 1 for s in asked["sentences"])
    form = client.post("/translate", data={"q": q, "source": "src", "target": "tgt", "confidence": "true"}).json()
    assert form == asked
    listed = client.post("/translate", json={"q": [q, q], "source": "src", "target": "tgt", "confidence": True}).json()
    assert listed["confidence"] == [asked["confidence"]] * 2
    html = client.post(
        "/translate", json={"q": q, "source": "src", "target": "tgt", "format": "html", "confidence": True}
    )
    assert html.status_code == 400 and "format text" in html.json()["error"]


def test_a_model_without_calibration_gives_raw_scores_and_says_so(plain, translator, sentences):
    with TestClient(create_app(plain)) as c:
        body = c.post("/translate", json={"text": sentences[:3], "confidence": True}).json()
        assert body["calibrated"] is False and body["confidence"] == [None] * 3
        assert body["confidence_raw"] == [round(x.raw, 4) for x in translator.translate_confident(sentences[:3])]
        res = c.post("/translate", json={"text": sentences[:3], "min_confidence": 0.5})
        assert res.status_code == 400 and "no calibration" in res.json()["error"]
    with pytest.raises(ValueError, match="no calibration"):
        create_app(plain, min_confidence=0.5)


def test_a_correction_has_no_confidence_and_the_texts_are_the_models_sentences(translator, sentences):
    found = translator.translate_confident(sentences[:2])
    app = create_app(translator, suggestions=True, api_key="k", min_confidence=1.0)  # every model sentence low
    with TestClient(app, headers={"Authorization": "Bearer k"}) as c:
        fix = {"q": sentences[1], "s": "Fixed.", "source": "src", "target": "tgt"}
        assert c.post("/suggest", json=fix).json()["status"] == "served"
        body = c.post("/translate", json={"text": [f"{sentences[0]} {sentences[1]}", sentences[1]], "split": True})
        body = body.json()
        assert body["calibrated"] is True and body["memory"] == [0, 1]
        [model, person], [alone] = body["sentences"]
        assert person["memory"] is True and "confidence" not in person and "low" not in person
        assert model["confidence"] == round(found[0].confidence, 4) and model["low"] is True
        assert body["confidence"][0] == round(found[0].confidence, 4)  # the model's sentence's, not a mean with 1.0
        assert "confidence" not in alone and body["confidence"][1] is None  # all from memory: no estimate
        assert body["low_confidence"] == [0]  # a person's translation is not flagged; the model's is
