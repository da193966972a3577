"""The server's grouping of queued requests into decoding calls, seen from the Translator: which texts each call
holds, and that every answer is the Translator's for that request alone.

A request is held in the model while the others queue behind it, so that they could all share one call; the
checks use only what the Translator sees (how many calls, which texts) and what the client gets back.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import random_transformer

from nanomt.core.config import Config, DataConfig
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.translate import Translator

SERVE_EXTRA = (
    "nanomt serve needs FastAPI, uvicorn, prometheus_client; these tests httpx: pip install 'nanomt[serve]' httpx"
)
pytest.importorskip("fastapi", reason=SERVE_EXTRA)
pytest.importorskip("httpx", reason=SERVE_EXTRA)
pytest.importorskip("prometheus_client", reason=SERVE_EXTRA)

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import create_app  # noqa: E402

DEFAULT_BEAM = 2
TRANSLATE = ("translate", "translate_hypotheses", "translate_n_best")

pytestmark = pytest.mark.usefixtures("one_thread")


class Recording:
    """The real Translator; records the method and texts of every call the server makes, the first held at a gate."""

    def __init__(self, inner: Translator):
        self.inner = inner
        self.calls: list[tuple[str, list[str]]] = []
        self.decoding, self.gate = threading.Event(), threading.Event()

    def __getattr__(self, name):  # cfg, tokenizer, device, ...: the Translator's own
        return getattr(self.inner, name)

    def _call(self, method: str, texts: list[str], *args, **kwargs):
        self.calls.append((method, list(texts)))
        self.decoding.set()
        assert self.gate.wait(timeout=300), "the test never opened the gate"
        return getattr(self.inner, method)(texts if method != "attention" else texts[0], *args, **kwargs)

    def translate(self, sentences, *args, **kwargs):
        return self._call("translate", sentences, *args, **kwargs)

    def translate_hypotheses(self, sentences, *args, **kwargs):
        return self._call("translate_hypotheses", sentences, *args, **kwargs)

    def translate_n_best(self, sentences, *args, **kwargs):
        return self._call("translate_n_best", sentences, *args, **kwargs)

    def attention(self, sentence, *args, **kwargs):
        return self._call("attention", [sentence], *args, **kwargs)


@pytest.fixture(scope="module")
def translator(toy_corpus, tmp_path_factory) -> Translator:
    """A random model with the toy pair's tokenizer: each sentence its own varied translation."""
    data = DataConfig(vocab_size=120, shared_vocab=True)
    lines = [toy_corpus[f"train.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")]
    tokenizer = train_tokenizer(*lines, tmp_path_factory.mktemp("tokenizer"), data)
    model = random_transformer(4, tokenizer.src_vocab_size)
    return Translator(model, tokenizer, Config(model=model.cfg, data=data))


@pytest.fixture(scope="module")
def lines(toy_corpus) -> list[str]:
    return list(dict.fromkeys(toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()))[:20]


def wait_until(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.01)


def queued_together(translator: Translator, requests: list[tuple[str, dict]]) -> tuple[list, list]:
    """Post the requests while a first one holds the model; (their responses, the calls made after the first)."""
    recording = Recording(translator)
    app = create_app(recording, default_beam=DEFAULT_BEAM, max_wait_ms=20)
    with TestClient(app) as c, ThreadPoolExecutor(len(requests) + 1) as pool:
        first = pool.submit(c.post, "/translate", json={"text": "la", "beam_size": 1})
        assert recording.decoding.wait(timeout=120), "the first request never reached the model"
        futures = [pool.submit(c.post, path, json=body) for path, body in requests]
        wait_until(lambda: app.state.engine.depth() == len(requests), "every request queued")
        recording.gate.set()
        responses = [f.result(timeout=300) for f in futures]
        assert first.result(timeout=300).status_code == 200
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return responses, recording.calls[1:]


def texts_of(calls: list, kinds=TRANSLATE) -> list[list[str]]:
    return sorted(sorted(texts) for method, texts in calls if method in kinds)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"temperature": 0.5}, {"temperature": 1.5}),
        ({"top_k": 0}, {"top_k": 8}),
        ({"temperature": 0.5, "top_k": 0}, {"temperature": 1.5, "top_k": 8}),
        # Settings under which one draw is the greedy translation: each request's answer shows whose settings it got.
        ({"top_k": 1, "temperature": 2.0}, {"temperature": 2.0}),
        ({"top_p": 0.001}, {"top_p": 1.0, "temperature": 2.0}),
    ],
    ids=["temperature", "top_k", "both", "greedy_top_k", "greedy_top_p"],
)
def test_unseeded_sampling_requests_with_different_settings_never_share_a_call(translator, lines, a, b):
    requests = [("/translate", {"text": lines[:6], **a}), ("/translate", {"text": lines[6:12], **b})]
    responses, calls = queued_together(translator, requests)
    assert texts_of(calls) == texts_of([("translate", lines[:6]), ("translate", lines[6:12])])
    assert len(calls) == 2
    got = [r.json()["translations"] for r in responses]
    assert [len(g) for g in got] == [6, 6]
    if a.get("top_k") == 1 or a.get("top_p", 1.0) < 0.01:
        greedy = [translator.translate(lines[:6], beam_size=1), translator.translate(lines[6:12], beam_size=1)]
        assert got[0] == greedy[0]  # a's own settings: one draw, the likeliest token at every step
        assert got[1] != greedy[1]  # b's own settings: drawn at temperature 2 from the whole distribution


def test_seeded_requests_with_the_same_settings_and_seed_are_decoded_apart(translator, lines):
    settings = {"temperature": 1.3, "top_k": 8, "seed": 11}
    requests = [("/translate", {"text": lines[:4], **settings}), ("/translate", {"text": lines[4:7], **settings})]
    responses, calls = queued_together(translator, requests)
    assert texts_of(calls) == texts_of([("translate", lines[:4]), ("translate", lines[4:7])])
    assert len(calls) == 2
    sampling = {k: settings[k] for k in ("temperature", "top_k", "seed")}
    alone = [translator.translate(lines[:4], sampling=sampling), translator.translate(lines[4:7], sampling=sampling)]
    assert [r.json()["translations"] for r in responses] == alone
    # Decoded in one call the two would have drawn other samples: sharing a call would show.
    together = translator.translate(lines[:7], sampling=sampling)
    assert [together[:4], together[4:]] != alone


def test_beam_sizes_and_attention_never_share_a_call(translator, lines):
    requests = [
        ("/translate", {"text": lines[0:3], "beam_size": 1}),
        ("/translate", {"text": lines[3:5], "beam_size": 3}),
        ("/translate", {"text": lines[5:7], "beam_size": 1}),
        ("/attention", {"text": lines[7], "beam_size": 1}),
        ("/translate", {"text": lines[8:10], "beam_size": 3}),
        ("/attention", {"text": lines[10], "beam_size": 3}),
        ("/translate", {"q": lines[11:13], "source": "src", "target": "tgt"}),  # LibreTranslate: the default beam
        ("/attention", {"text": lines[13], "beam_size": 1}),
    ]
    responses, calls = queued_together(translator, requests)
    # Equal beams queued together share one call; nothing else does.
    assert texts_of(calls) == texts_of(
        [("translate", lines[0:3] + lines[5:7]), ("translate", lines[3:5] + lines[8:10]), ("translate", lines[11:13])]
    )
    attended = [("attention", [lines[7]]), ("attention", [lines[10]]), ("attention", [lines[13]])]
    assert texts_of(calls, ("attention",)) == texts_of(attended, ("attention",))
    assert len(calls) == 6
    for (path, body), res in zip(requests, responses):
        if path == "/attention":
            assert (
                res.json()["translation"] == translator.attention(body["text"], beam_size=body["beam_size"]).translation
            )
        elif "q" in body:
            assert res.json()["translatedText"] == translator.translate(body["q"], beam_size=DEFAULT_BEAM)
        else:
            assert res.json()["translations"] == translator.translate(body["text"], beam_size=body["beam_size"])
    # The beams matter to this model: a mixed call would have answered some request with another beam's output.
    assert translator.translate(lines[:13], beam_size=1) != translator.translate(lines[:13], beam_size=3)
