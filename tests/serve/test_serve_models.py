"""One server, many models: routing by source and target, a pivot through a third language, lazy loading with an LRU
bound, batches that never mix models, /languages and /health listing every pair, runs that cannot be served."""

import pytest
from conftest import tiny_config

from nanomt.core.checkpoint import CheckpointError
from nanomt.core.config import config_from_dict
from nanomt.decoding.alignment import Alignment
from nanomt.decoding.translate import Translator
from nanomt.training.train import train

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import ModelSet, ModelSpec, ServeConfig, create_app  # noqa: E402

PAIRS = ("xx-en", "en-yy", "zz-ww")


@pytest.fixture(scope="module")
def runs(toy_corpus, tmp_path_factory):
    """Three tiny runs of different seeds standing for three language pairs."""
    out = {}
    for seed, pair in enumerate(PAIRS, 1):
        cfg = tiny_config(toy_corpus, max_steps=20, eval_every=20, save_every=20, seed=seed)
        out[pair] = train(config_from_dict(cfg), tmp_path_factory.mktemp(pair) / "run")
    return out


def model_set(runs, **kw) -> ModelSet:
    specs = [ModelSpec.parse(f"{pair}={runs[pair]}") for pair in PAIRS]
    return ModelSet.read(specs, kw.get("pivot", "en"), kw.get("max_loaded"), "cpu", False)


class Recording:
    """Counts the calls into each model's Translator and the texts each holds."""

    def __init__(self, models: ModelSet):
        self.calls = []
        real = models.translator

        def translator(model):
            t = real(model)
            calls, inner = self.calls, t.translate

            def translate(texts, **kw):
                calls.append((model.name, list(texts)))
                return inner(texts, **kw)

            t.translate = translate
            return t

        models.translator = translator


def test_each_pair_is_routed_to_its_model_and_a_missing_one_through_the_pivot(runs, toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()[:4]
    own = {pair: Translator.from_checkpoint(runs[pair]) for pair in PAIRS}
    with TestClient(create_app(model_set(runs))) as c:
        for pair in PAIRS:
            source, target = pair.split("-")
            res = c.post("/translate", json={"text": lines, "source": source, "target": target, "beam_size": 2})
            assert res.json()["translations"] == own[pair].translate(lines, beam_size=2), pair
            assert "route" not in res.json()
            lt = c.post("/translate", json={"q": lines[0], "source": source, "target": target})
            assert lt.json()["translatedText"] == own[pair].translate(lines[:1])[0]
        res = c.post("/translate", json={"text": lines, "source": "xx", "target": "yy", "beam_size": 2})
        first = own["xx-en"].translate(lines, beam_size=2)
        assert res.json() == {**res.json(), "translations": own["en-yy"].translate(first, beam_size=2)}
        assert res.json()["route"] == ["xx-en", "en-yy"]
        missing = c.post("/translate", json={"q": "a", "source": "zz", "target": "en"})
        assert missing.status_code == 400 and "en is not supported" in missing.json()["error"]
        assert c.post("/translate", json={"text": "a", "source": "yy", "target": "xx"}).status_code == 400
        languages = {x["code"]: x["targets"] for x in c.get("/languages").json()}
        assert languages == {"en": ["yy"], "xx": ["en", "yy"], "zz": ["ww"]}
        health = c.get("/health").json()
        assert [m["pair"] for m in health["models"]] == list(PAIRS) and health["languages"]["source"] == "xx"
        # nanomt's API without a pair: the first model's.
        res = c.post("/translate", json={"text": lines[:1], "beam_size": 1})
        assert res.json()["translations"] == own["xx-en"].translate(lines[:1], beam_size=1)


def test_batches_never_mix_models(runs, toy_corpus):
    from concurrent.futures import ThreadPoolExecutor

    lines = toy_corpus["test.src"].read_text().splitlines()[:12]
    models = model_set(runs)
    recording = Recording(models)
    with TestClient(create_app(models, max_wait_ms=200)) as c, ThreadPoolExecutor(6) as pool:
        jobs = []
        for i in range(6):
            source, target = PAIRS[i % 2].split("-")
            body = {"text": lines[2 * i : 2 * i + 2], "source": source, "target": target, "beam_size": 1}
            jobs.append((PAIRS[i % 2], body, pool.submit(c.post, "/translate", json=body)))
        for pair, body, job in jobs:
            own = Translator.from_checkpoint(runs[pair])
            assert job.result(timeout=120).json()["translations"] == own.translate(body["text"], beam_size=1)
    for pair, texts in recording.calls:
        allowed = {t for p, b, _ in jobs if p == pair for t in b["text"]}
        assert set(texts) <= allowed, (pair, texts)


def test_models_load_when_asked_and_the_least_recently_used_goes_past_max_loaded(runs, toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()[:2]
    models = model_set(runs, max_loaded=1)
    assert all(m.translator is None for m in models.models)  # nothing loaded until asked for
    with TestClient(create_app(models, cache_size=0)) as c:  # no cache: the third request is decoded again
        for pair in ("xx-en", "zz-ww", "xx-en"):
            source, target = pair.split("-")
            res = c.post("/translate", json={"text": lines, "source": source, "target": target, "beam_size": 1})
            assert res.json()["translations"] == Translator.from_checkpoint(runs[pair]).translate(lines, beam_size=1)
            loaded = [m.name for m in models.models if m.translator is not None]
            assert loaded == [pair]
        metrics = c.get("/metrics").text
    assert 'nanomt_model_loads_total{model="xx-en"} 2.0' in metrics
    assert 'nanomt_model_loaded{model="zz-ww"} 0.0' in metrics


def test_a_run_that_cannot_be_served_is_a_one_line_error_naming_it(runs, tmp_path):
    with pytest.raises(CheckpointError, match="nowhere: cannot serve it"):
        ModelSet.read([ModelSpec(str(tmp_path / "nowhere"))], "en", None, "cpu", False)
    with pytest.raises(ValueError, match="two models translate xx-en"):
        ModelSet.read([ModelSpec(str(runs["xx-en"]), "xx", "en")] * 2, "en", None, "cpu", False)
    assert ModelSpec.parse("de-en=runs/a") == ModelSpec("runs/a", "de", "en")
    assert ModelSpec.parse("runs/de-en") == ModelSpec("runs/de-en")
    with pytest.raises(ValueError, match="max_loaded must be >= 1"):
        ServeConfig(max_loaded=0)


def test_a_model_that_fails_to_load_answers_500_and_the_others_go_on(runs, tmp_path, toy_corpus):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(runs["zz-ww"], broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    specs = [ModelSpec(str(runs["xx-en"]), "xx", "en"), ModelSpec(str(broken), "zz", "ww")]
    models = ModelSet.read(specs, "en", 1, "cpu", False)
    line = toy_corpus["test.src"].read_text().splitlines()[:1]
    with TestClient(create_app(models), raise_server_exceptions=False) as c:
        bad = c.post("/translate", json={"text": line, "source": "zz", "target": "ww"})
        assert bad.status_code == 500 and bad.json()["error"].startswith("internal server error")
        good = c.post("/translate", json={"text": line, "source": "xx", "target": "en", "beam_size": 1})
        assert good.json()["translations"] == Translator.from_checkpoint(runs["xx-en"]).translate(line, beam_size=1)


class Repeating:
    """A first hop whose translation of anything is a long repetitive text of several sentences (what a weak model
    writes), longer than the second model's positions."""

    TEXT = "la nuka fosur. " * 3 + "la fesa korat " * 30 + "korat."

    def __init__(self, inner: Translator):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate(self, texts, **kw):
        return [self.TEXT.strip() if t.strip() else "" for t in texts]

    def translate_n_best(self, texts, **kw):
        return [[(t, 0.0)] for t in self.translate(texts)]

    def alignments(self, texts, *args, **kw):
        return [Alignment(t) for t in self.translate(texts)]  # no attention: the tags placed by position


class Seen:
    """The texts a model was given to translate, by any of the Translator's ways."""

    def __init__(self, inner: Translator):
        self.inner, self.texts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate_n_best(self, texts, **kw):
        self.texts += texts
        return self.inner.translate_n_best(texts, **kw)

    def alignments(self, texts, *args, **kw):
        self.texts += texts
        return self.inner.alignments(texts, *args, **kw)


def test_a_pivot_is_exactly_its_two_hops_on_long_repetitive_first_hop_output(runs, toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()[:2]
    models = model_set(runs)
    real, second = models.translator, Seen(Translator.from_checkpoint(runs["en-yy"]))
    models.translator = lambda m: Repeating(real(m)) if m.name == "xx-en" else second if m.name == "en-yy" else real(m)
    paragraph = " ".join(lines)
    with TestClient(create_app(models, cache_size=0)) as c:
        lt = lambda q, s, t, **kw: c.post("/translate", json={"q": q, "source": s, "target": t, **kw}).json()  # noqa: E731
        for fmt in ("text", "html"):
            doc = paragraph if fmt == "text" else f"<p>{paragraph}</p>"
            second.texts.clear()
            pivot = lt(doc, "xx", "yy", format=fmt)["translatedText"]
            seen, second.texts = second.texts, []
            by_hand = lt(lt(doc, "xx", "en", format=fmt)["translatedText"], "en", "yy", format=fmt)["translatedText"]
            assert seen == second.texts and len(seen) > 2, fmt  # the second model got what a client would send it
            assert pivot == by_hand, fmt
        via = c.post("/translate", json={"text": [paragraph], "split": True, "source": "xx", "target": "yy"}).json()
        first = c.post("/translate", json={"text": [paragraph], "split": True, "source": "xx", "target": "en"}).json()
        onward = {"text": first["translations"], "split": True, "source": "en", "target": "yy"}
        assert via["translations"] == c.post("/translate", json=onward).json()["translations"]
        assert via["route"] == ["xx-en", "en-yy"] and via["cut"] == [0]  # the first hop's text was translated in pieces
