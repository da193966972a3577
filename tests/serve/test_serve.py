"""nanomt serve: the JSON API via TestClient, a load test on a real server process, the page in headless Chromium."""

import hmac
import html
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import tiny_config
from servers import start_server_retrying, stop

from nanomt.core.decoding import Sampling
from nanomt.decoding.translate import Translator

SERVE_EXTRA = (
    "nanomt serve needs FastAPI, uvicorn, prometheus_client; these tests httpx: pip install 'nanomt[serve]' httpx"
)
pytest.importorskip("fastapi", reason=SERVE_EXTRA)
pytest.importorskip("uvicorn", reason=SERVE_EXTRA)
httpx = pytest.importorskip("httpx", reason=SERVE_EXTRA)
pytest.importorskip("prometheus_client", reason=SERVE_EXTRA)

from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nanomt.decoding.quantize import quantize_int8  # noqa: E402
from nanomt.serve import create_app  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(toy_corpus, trained):
    """A tiny model trained for a few seconds (its checkpoint's default beam is 2)."""
    torch.set_num_threads(1)
    return trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


@pytest.fixture(scope="module")
def sentences(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()[:6]


@pytest.fixture(scope="module")
def many(toy_corpus):
    """40 test sentences of varied lengths."""
    return toy_corpus["test.src"].read_text().splitlines()[:40]


@pytest.fixture(scope="module")
def client(translator):
    """An app with small limits, so the limits are cheap to hit."""
    with TestClient(create_app(translator, max_sentences=4, max_chars=300)) as c:
        yield c


def test_translate_equals_the_translator(client, translator, sentences):
    res = client.post("/translate", json={"text": sentences[:3], "beam_size": 1})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["translations"] == translator.translate(sentences[:3], beam_size=1)
    assert isinstance(body["seconds"], float) and body["seconds"] >= 0
    # One string is a list of one; no beam_size means the checkpoint's (2); empty lines stay empty.
    res = client.post("/translate", json={"text": sentences[3]})
    assert res.json()["translations"] == translator.translate([sentences[3]], beam_size=2)
    res = client.post("/translate", json={"text": ["", sentences[4]], "beam_size": 3})
    assert res.json()["translations"] == ["", translator.translate([sentences[4]], beam_size=3)[0]]


def test_default_beam_comes_from_the_app(translator, sentences):
    with TestClient(create_app(translator, default_beam=1)) as c:
        assert c.post("/translate", json={"text": sentences[:2]}).json()["translations"] == translator.translate(
            sentences[:2], beam_size=1
        )
        assert c.get("/health").json()["default_beam"] == 1
    with pytest.raises(ValueError, match="beam size"):
        create_app(translator, default_beam=17)


def test_attention_is_the_cross_attention_of_the_translation(client, translator, sentences):
    res = client.post("/attention", json={"text": sentences[0], "beam_size": 2})
    assert res.status_code == 200, res.text
    body = res.json()
    att = translator.attention(sentences[0], beam_size=2)
    assert body["src_tokens"] == att.src_tokens and body["tgt_tokens"] == att.tgt_tokens
    assert body["translation"] == att.translation == translator.translate([sentences[0]], beam_size=2)[0]
    cross = np.array(body["cross_attention"])  # (layers, H, T, S)
    cfg = translator.cfg.model
    assert cross.shape == (cfg.n_decoder_layers, cfg.n_heads, len(att.tgt_tokens), len(att.src_tokens))
    np.testing.assert_array_equal(cross, np.round(np.stack(att.cross).astype(np.float64), 4))
    assert all(len(repr(x).split(".")[-1]) <= 4 for x in cross.ravel().tolist())  # 4 decimals, no float32 noise
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-3)  # each row is a distribution over the source


def test_health_page_and_docs(client, translator):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["default_beam"] == 2
    assert health["model"]["n_heads"] == translator.cfg.model.n_heads
    assert health["model"]["int8"] is False
    assert health["limits"] == {"max_sentences": 4, "max_chars": 300, "max_beam": 16}
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    markers = ('id="source"', 'id="translate"', 'id="translation"', 'id="heatmap"', 'id="layer"', 'id="head"')
    for marker in (*markers, 'id="api-key"'):
        assert marker in page.text
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/translate", "/attention", "/health"} <= set(paths)


BAD_REQUESTS = [
    ("/translate", b'{"text": ["la nuka', 400, "malformed JSON"),
    ("/translate", b"not json at all", 400, "malformed JSON"),
    ("/translate", {"text": 5}, 422, "text"),
    ("/translate", {"text": [5]}, 422, "text"),
    ("/translate", {"text": []}, 422, "text"),
    ("/translate", {"texts": ["a"]}, 422, "text"),
    ("/translate", ["a", "b"], 422, "invalid request"),
    # A field taking a string or a list of them: named as the request names it, not by pydantic's union branches.
    ("/translate", {"q": 5, "source": "x", "target": "y"}, 422, "q: Input should be a valid string or a valid list"),
    ("/translate", {"q": ["a", 5], "source": "x", "target": "y"}, 422, "q.1: Input should be a valid string"),
    ("/translate", {"text": ["a"], "prefix": [5]}, 422, "prefix.0: Input should be"),
    ("/translate", {"text": ["a"], "beam_size": 0}, 422, "beam_size"),
    ("/translate", {"text": ["a"], "beam_size": 17}, 422, "beam_size"),
    ("/translate", {"text": ["a"], "beam_size": "5"}, 422, "beam_size"),
    ("/translate", {"text": ["a"], "beam_size": True}, 422, "beam_size"),
    ("/translate", {"text": ["a"], "beam_size": 2.5}, 422, "beam_size"),
    ("/translate", {"text": ["a"] * 5}, 413, "5 sentences"),
    ("/translate", {"text": ["a" * 200, "b" * 101]}, 413, "301 characters"),
    ("/translate", {"text": ["x" * 100_000]}, 413, "bytes"),
    ("/attention", {"text": ["a"]}, 422, "text"),
    ("/attention", {"text": ""}, 422, "text"),
    ("/attention", {"text": "a" * 301}, 413, "301 characters"),
    ("/attention", {"text": "a", "beam_size": 99}, 422, "beam_size"),
    # JSON's \u escapes can spell half of a UTF-16 surrogate pair, which is no character at all.
    ("/translate", rb'{"text": ["\ud800"]}', 400, "text.0: a lone surrogate \\ud800"),
    ("/translate", rb'{"text": ["ok", "la \udc00"]}', 400, "text.1: a lone surrogate \\udc00"),
    ("/translate", rb'{"text": "\ud800\ud800\udc00"}', 400, "lone surrogate"),
    ("/attention", rb'{"text": "la \udfff nuka"}', 400, "text: a lone surrogate \\udfff"),
    ("/translate", {"text": ["a"], "temperature": 0}, 422, "temperature"),
    ("/translate", {"text": ["a"], "temperature": -1.0}, 422, "temperature"),
    ("/translate", {"text": ["a"], "temperature": "0.5"}, 422, "temperature"),
    ("/translate", {"text": ["a"], "temperature": True}, 422, "temperature"),
    ("/translate", b'{"text": ["a"], "temperature": NaN}', 422, "temperature"),
    ("/translate", b'{"text": ["a"], "temperature": Infinity}', 422, "temperature"),
    ("/translate", {"text": ["a"], "top_k": -1}, 422, "top_k"),
    ("/translate", {"text": ["a"], "top_k": 2.5}, 422, "top_k"),
    ("/translate", {"text": ["a"], "top_k": "5"}, 422, "top_k"),
    ("/translate", {"text": ["a"], "top_p": 0}, 422, "top_p"),
    ("/translate", {"text": ["a"], "top_p": 1.01}, 422, "top_p"),
    ("/translate", {"text": ["a"], "top_p": -0.5}, 422, "top_p"),
    ("/translate", {"text": ["a"], "temperature": 1.0, "seed": -1}, 422, "seed"),
    ("/translate", {"text": ["a"], "temperature": 1.0, "seed": 2**64}, 422, "seed"),
    ("/translate", {"text": ["a"], "temperature": 1.0, "seed": "7"}, 422, "seed"),
    ("/translate", {"text": ["a"], "seed": 7}, 422, "seed applies to sampling"),
    ("/translate", {"text": ["a"], "top_k": 5, "beam_size": 2}, 422, "beam_size"),
]


@pytest.mark.parametrize("path,body,status,message", BAD_REQUESTS)
def test_bad_input_is_a_4xx_json_error_and_the_server_goes_on(client, sentences, path, body, status, message):
    if isinstance(body, bytes):
        res = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        res = client.post(path, json=body)
    assert res.status_code == status, res.text
    error = res.json()
    assert isinstance(error["error"], str) and message in error["error"]
    assert client.post(path, json={"text": sentences[0]}).status_code == 200


def test_a_surrogate_pair_is_one_character(client, translator):
    res = client.post(
        "/translate", content=rb'{"text": ["\ud83d\ude00 la"]}', headers={"content-type": "application/json"}
    )
    assert res.status_code == 200, res.text
    assert res.json()["translations"] == translator.translate(["\U0001f600 la"], beam_size=2)


def test_sampling_equals_the_translators(client, translator, sentences):
    settings = {"temperature": 1.5, "top_k": 8, "top_p": 0.9, "seed": 3}
    res = client.post("/translate", json={"text": sentences[:4], **settings})
    assert res.status_code == 200, res.text
    assert res.json()["translations"] == translator.translate(sentences[:4], sampling=settings)
    # Each setting reaches the sampler: the seed, and top_k alone (temperature 1, no top-p).
    other = translator.translate(sentences[:4], sampling={**settings, "seed": 4})
    assert other != res.json()["translations"]
    assert (
        client.post("/translate", json={"text": sentences[:4], **settings, "seed": 4}).json()["translations"] == other
    )
    res = client.post("/translate", json={"text": sentences[:4], "top_k": 1, "beam_size": 1})
    assert res.json()["translations"] == translator.translate(sentences[:4], sampling={"top_k": 1, "seed": 0})
    assert res.json()["translations"] == translator.translate(sentences[:4], beam_size=1)  # top-1 sampling is greedy
    # Without a seed every request draws afresh (and still translates every sentence).
    assert len(client.post("/translate", json={"text": sentences[:4], "temperature": 0.5}).json()["translations"]) == 4


def test_default_limits_wrong_method_and_content_type(translator):
    with TestClient(create_app(translator)) as c:
        res = c.post("/translate", json={"text": ["a"] * 65})
        assert res.status_code == 413 and "limit is 64" in res.json()["error"]
        res = c.post("/translate", json={"text": ["a" * 5000, "b" * 5001]})
        assert res.status_code == 413 and "limit is 10000" in res.json()["error"]
        res = c.get("/translate")
        assert res.status_code == 405 and "error" in res.json()
        res = c.post("/translate", content=b'{"text": "a"}', headers={"content-type": "text/plain"})
        assert res.status_code == 415 and "Content-Type: application/json" in res.json()["error"]
        # A form, as `curl -d` sends: the schema's form is LibreTranslate's request, so a form without q is a 422
        # that says what to send.
        res = c.post("/translate", data={"text": "a"})
        assert res.status_code == 422 and "q: Field required" in res.json()["error"], res.text
        assert "Content-Type: application/json" in res.json()["error"]


class CountingTranslator:
    """Wraps a Translator and records how many threads are inside the model at once."""

    def __init__(self, inner: Translator):
        self.inner, self.cfg, self.device, self.int8 = inner, inner.cfg, inner.device, inner.int8
        self.inside = self.most_inside = 0
        self.guard = threading.Lock()

    def __getattr__(self, name):  # tokenizer, attention, ...: the wrapped Translator's
        return getattr(self.inner, name)

    def translate(self, sentences, **kwargs):
        with self.guard:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(0.02)  # widen the window in which a missing lock would let two threads overlap
            return self.inner.translate(sentences, **kwargs)
        finally:
            with self.guard:
                self.inside -= 1


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "one-lock"])
def test_model_is_entered_by_one_thread_at_a_time(translator, sentences, batching):
    counting = CountingTranslator(translator)
    with TestClient(create_app(counting, batching=batching)) as c:

        def one(i):
            return c.post("/translate", json={"text": sentences[i % 3], "beam_size": 1}).json()["translations"]

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(32), timeout=300))
    assert counting.most_inside == 1
    expected = translator.translate(sentences[:3], beam_size=1)
    assert results == [[expected[i % 3]] for i in range(32)]


class GatedTranslator:
    """Wraps a Translator: translate() says it has begun, then holds the model until the test opens the gate."""

    def __init__(self, inner: Translator):
        self.inner, self.cfg, self.device, self.int8 = inner, inner.cfg, inner.device, inner.int8
        self.decoding, self.gate = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate(self, sentences, **kwargs):
        self.decoding.set()
        assert self.gate.wait(timeout=300), "the test never opened the gate"
        return self.inner.translate(sentences, **kwargs)


def test_health_answers_while_the_model_is_busy(translator, sentences):
    gated = GatedTranslator(translator)
    with TestClient(create_app(gated)) as c, ThreadPoolExecutor(2) as pool:
        busy = pool.submit(c.post, "/translate", json={"text": sentences[0], "beam_size": 1})
        try:
            assert gated.decoding.wait(timeout=120), "the request never reached the model"
            # The model's lock stays held until the gate opens, so a /health that waited for it would never answer
            # and fail the 60 s bound, which is far beyond what /health takes on a loaded machine.
            health = pool.submit(c.get, "/health").result(timeout=60)
            assert health.json()["status"] == "ok" and not busy.done()
        finally:
            gated.gate.set()
        assert busy.result(timeout=120).json()["translations"] == translator.translate([sentences[0]], beam_size=1)


class BrokenTranslator(CountingTranslator):
    """A translator whose model fails."""

    def translate(self, sentences, **kwargs):
        raise RuntimeError("the model failed")


def test_an_unexpected_failure_is_a_500_json_error(translator):
    with TestClient(create_app(BrokenTranslator(translator)), raise_server_exceptions=False) as c:
        res = c.post("/translate", json={"text": "a"})
        assert res.status_code == 500
        assert res.json() == {"error": "internal server error: RuntimeError", "detail": None}
        assert c.get("/health").status_code == 200


class RecordingTranslator:
    """Wraps a Translator: records every call into the model; the first one holds the model until the gate opens."""

    def __init__(self, inner: Translator):
        self.inner, self.cfg, self.device, self.int8 = inner, inner.cfg, inner.device, inner.int8
        self.calls: list[tuple[list[str], dict]] = []
        self.returned = 0  # calls that have come back from the model
        self.decoding, self.gate = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _enter(self, sentences, kwargs):
        self.calls.append((list(sentences), kwargs))
        self.decoding.set()
        assert self.gate.wait(timeout=300), "the test never opened the gate"

    def translate(self, sentences, **kwargs):
        self._enter(sentences, kwargs)
        try:
            return self.inner.translate(sentences, **kwargs)
        finally:
            self.returned += 1

    def attention(self, sentence, **kwargs):
        self._enter([sentence], {"attention": True, **kwargs})
        try:
            return self.inner.attention(sentence, **kwargs)
        finally:
            self.returned += 1


def wait_until(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.01)


def mixed_requests(many: list[str]) -> list[dict]:
    """Requests of 1 to 5 sentences, beams 1 to 3, an empty line, a seeded sample and an unseeded one."""
    out, at = [], 0
    for i in range(24):
        n = 1 + (i * 7) % 5
        out.append({"text": [many[(at + j) % len(many)] for j in range(n)], "beam_size": 1 + i % 3})
        at += n
    out[5]["text"].insert(1, "")
    out.append({"text": many[3:7], "temperature": 1.3, "top_k": 8, "seed": 11})
    out.append({"text": many[7:9], "temperature": 0.7})
    return out


def test_batching_returns_each_request_its_own_translations(translator, many):
    recording = RecordingTranslator(translator)
    app = create_app(recording, max_wait_ms=20)
    requests = mixed_requests(many)
    with TestClient(app) as c, ThreadPoolExecutor(len(requests) + 2) as pool:
        # The first request holds the model, so every later one waits in the queue and they batch together.
        first = pool.submit(c.post, "/translate", json={"text": many[0], "beam_size": 1})
        assert recording.decoding.wait(timeout=120), "the first request never reached the model"
        futures = [pool.submit(c.post, "/translate", json=r) for r in requests]
        attention = pool.submit(c.post, "/attention", json={"text": many[9], "beam_size": 2})
        wait_until(lambda: app.state.engine.depth() == len(requests) + 1, "every request queued")
        recording.gate.set()
        responses = [f.result(timeout=300) for f in futures]
        assert first.result(timeout=300).status_code == 200
        assert attention.result(timeout=300).json()["translation"] == translator.attention(many[9], 2).translation

    for req, res in zip(requests, responses):
        assert res.status_code == 200, res.text
        got = res.json()["translations"]
        sampling = {k: req[k] for k in ("temperature", "top_k", "seed") if k in req}
        if "seed" in req:  # exactly the Translator's draw for this request alone
            assert got == translator.translate(req["text"], sampling=sampling)
        elif sampling:  # a fresh draw: one translation a sentence
            assert len(got) == len(req["text"])
        else:  # each request its own translations, in order, as if decoded alone
            assert got == translator.translate(req["text"], beam_size=req["beam_size"]), req
    # One call a kind: beams 1, 2 and 3, the seeded sample alone, the unseeded one, the attention.
    calls = recording.calls[1:]
    assert len(calls) == 6, [(len(t), k) for t, k in calls]
    for beam in (1, 2, 3):
        texts = [t for r in requests if r.get("beam_size") == beam for t in r["text"]]
        [batch] = [
            t
            for t, k in calls
            if "attention" not in k and (k["decoding"].sampling, k["decoding"].beam_size) == (None, beam)
        ]
        assert sorted(batch) == sorted(texts) and len(batch) > 5 * 8 // 3  # many requests in one batch
    [seeded] = [t for t, k in calls if "decoding" in k and (k["decoding"].sampling or Sampling()).seed == 11]
    assert seeded == requests[-2]["text"]


def test_one_lock_decodes_each_request_alone(translator, many):
    recording = RecordingTranslator(translator)
    recording.gate.set()
    requests = mixed_requests(many)[:8]
    with TestClient(create_app(recording, batching=False)) as c, ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda r: c.post("/translate", json=r), requests))
    assert [r.json()["translations"] for r in responses] == [
        translator.translate(r["text"], beam_size=r["beam_size"]) for r in requests
    ]
    assert sorted(len(t) for t, _ in recording.calls) == sorted(len(r["text"]) for r in requests)


def test_int8_requests_batched_together_decode_as_each_alone(translator, many):
    """int8 activations get one scale per row: a sentence's numbers do not depend on its batch mates."""
    from nanomt.core.tokenizer import EOS_ID, PAD_ID

    # A mate of the same length: over padding, attention's float32 sums may differ in the last bit.
    lone = torch.tensor([[5, 9, 12, EOS_ID]])
    batch = torch.tensor([[5, 9, 12, EOS_ID], [40, 41, 7, EOS_ID], [60, 61, EOS_ID, PAD_ID]])
    q8 = quantize_int8(translator.model)
    with torch.inference_mode():
        fp32 = [translator.model.encode(x).memory[0, :4] for x in (lone, batch)]
        int8 = [q8.encode(x).memory[0, :4] for x in (lone, batch)]
    assert torch.equal(fp32[0], fp32[1])  # float32: the mates change nothing
    assert torch.equal(int8[0], int8[1])  # int8 neither
    assert not torch.equal(int8[0], fp32[0])  # and it is int8

    int8 = Translator(translator.model, translator.tokenizer, translator.cfg, int8=True)
    recording = RecordingTranslator(int8)
    requests = [{"text": many[10:13], "beam_size": 2}, {"text": many[13:17], "beam_size": 2}]
    app = create_app(recording, max_wait_ms=20)
    with TestClient(app) as c, ThreadPoolExecutor(3) as pool:
        first = pool.submit(c.post, "/translate", json={"text": many[0], "beam_size": 1})
        assert recording.decoding.wait(timeout=120)
        futures = [pool.submit(c.post, "/translate", json=r) for r in requests]
        wait_until(lambda: app.state.engine.depth() == 2, "both requests queued")
        recording.gate.set()
        got = [f.result(timeout=300).json()["translations"] for f in futures]
        assert first.result(timeout=300).status_code == 200
    [(batch, _)] = recording.calls[1:]
    assert sorted(batch) == sorted(many[10:17])  # the two requests were decoded as one batch
    # Each request gets the int8 translation it gets alone, whatever else the server was decoding.
    assert got == [int8.translate(r["text"], beam_size=r["beam_size"]) for r in requests]
    assert got == [[int8.translate([t], beam_size=2)[0] for t in r["text"]] for r in requests]


def test_a_full_queue_is_a_503_at_once(translator, sentences):
    recording = RecordingTranslator(translator)
    app = create_app(recording, queue_size=2, max_wait_ms=0)
    with TestClient(app) as c, ThreadPoolExecutor(4) as pool:
        busy = pool.submit(c.post, "/translate", json={"text": sentences[0], "beam_size": 1})
        assert recording.decoding.wait(timeout=120)
        queued = [pool.submit(c.post, "/translate", json={"text": s, "beam_size": 1}) for s in sentences[1:3]]
        wait_until(lambda: app.state.engine.depth() == 2, "two requests queued")
        start = time.monotonic()
        res = c.post("/translate", json={"text": sentences[3], "beam_size": 1})
        assert res.status_code == 503 and "limit is 2" in res.json()["error"], res.text
        assert int(res.headers["retry-after"]) >= 1
        assert time.monotonic() - start < 30  # answered at once, not after the queue moved
        assert c.get("/ready").status_code == 503
        assert c.get("/health").status_code == 200  # alive, though not ready
        recording.gate.set()
        assert [f.result(timeout=300).status_code for f in [busy, *queued]] == [200, 200, 200]
        wait_until(lambda: c.get("/ready").status_code == 200, "ready again")
        assert c.post("/translate", json={"text": sentences[3], "beam_size": 1}).status_code == 200


def test_a_timeout_is_a_504_its_sentences_are_dropped_and_the_server_goes_on(translator, sentences):
    recording = RecordingTranslator(translator)
    app = create_app(recording, timeout=2.0, max_wait_ms=0)
    with TestClient(app) as c, ThreadPoolExecutor(2) as pool:
        busy = pool.submit(c.post, "/translate", json={"text": sentences[0], "beam_size": 1})
        assert recording.decoding.wait(timeout=120)
        late = c.post("/translate", json={"text": ["dropped " + sentences[1]], "beam_size": 1})
        assert late.status_code == 504 and "timeout of 2 s" in late.json()["error"], late.text
        assert busy.result(timeout=120).status_code == 504  # in flight when its time ran out: 504 too
        recording.gate.set()
        wait_until(lambda: recording.returned == 1, "the decoding in flight finished")  # C gets its 2 s alone
        res = c.post("/translate", json={"text": sentences[2], "beam_size": 1})
        assert res.status_code == 200
        assert res.json()["translations"] == translator.translate([sentences[2]], beam_size=1)
        metrics = c.get("/metrics").text
    assert not any(t.startswith("dropped ") for texts, _ in recording.calls for t in texts)
    assert 'nanomt_requests_total{method="POST",route="/translate",status="504"} 2.0' in metrics


def libre(translator, sentences):
    return translator.translate(sentences, beam_size=2)


def test_libretranslate_requests_and_responses(client, translator, sentences):
    res = client.post("/translate", json={"q": sentences[0], "source": "auto", "target": "tgt"})
    assert res.status_code == 200, res.text
    assert res.json() == {
        "translatedText": libre(translator, sentences[:1])[0],
        "detectedLanguage": {"confidence": 100.0, "language": "src"},
    }
    res = client.post("/translate", json={"q": sentences[:3], "source": "src", "target": "tgt", "format": "text"})
    assert res.json() == {"translatedText": libre(translator, sentences[:3])}
    # As a form (what many LibreTranslate clients send), a repeated q being a list.
    res = client.post("/translate", data={"q": sentences[1], "source": "src", "target": "tgt", "api_key": ""})
    assert res.status_code == 200, res.text
    assert res.json() == {"translatedText": libre(translator, sentences[1:2])[0]}
    res = client.post("/translate", data={"q": sentences[:2], "source": "src", "target": "tgt"})
    assert res.json()["translatedText"] == libre(translator, sentences[:2])
    # HTML: the text between tags is translated, tags and scripts kept.
    doc = f"<p>{sentences[0]} <b>{sentences[1]}</b></p><script>var x = '{sentences[2]}';</script>"
    res = client.post("/translate", json={"q": doc, "source": "src", "target": "tgt", "format": "html"})
    t0, t1 = (html.escape(t, quote=False) for t in libre(translator, sentences[:2]))
    assert res.json()["translatedText"] == f"<p>{t0} <b>{t1}</b></p><script>var x = '{sentences[2]}';</script>"
    res = client.post("/translate", json={"q": "<br/>&amp; ", "source": "src", "target": "tgt", "format": "html"})
    assert res.json() == {"translatedText": "<br/>&amp; "}  # text without a letter is kept, not translated
    res = client.post("/translate", json={"q": ["<p></p>", ""], "source": "src", "target": "tgt", "format": "html"})
    assert res.json() == {"translatedText": ["<p></p>", ""]}
    # Errors come back with LibreTranslate's "error" field.
    for body, status, message in [
        ({"q": "a", "source": "xx", "target": "tgt"}, 400, "xx is not supported"),
        ({"q": "a", "source": "src", "target": "de"}, 400, "de is not supported"),
        ({"q": "a", "source": "src"}, 422, "target"),
        ({"q": 5, "source": "src", "target": "tgt"}, 422, "q"),
        ({"q": "a", "source": "src", "target": "tgt", "format": "pdf"}, 422, "format"),
        ({"q": ["a"] * 5, "source": "src", "target": "tgt"}, 413, "5 sentences"),
    ]:
        res = client.post("/translate", json=body)
        assert res.status_code == status and message in res.json()["error"], res.text
    assert client.get("/languages").json() == [{"code": "src", "name": "src", "targets": ["tgt"]}]
    assert client.post("/detect", data={"q": sentences[0]}).json() == [{"confidence": 100.0, "language": "src"}]
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/translate"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/x-www-form-urlencoded"} <= set(body)
    assert {"TranslateRequest", "LibreTranslateRequest"} <= set(schema["components"]["schemas"])
    assert {"/languages", "/detect", "/ready"} <= set(schema["paths"])


def test_api_key(translator, sentences, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    with TestClient(create_app(translator, api_key="s3cret")) as c:
        lt = {"q": sentences[0], "source": "auto", "target": "tgt"}
        for res in [
            c.post("/translate", json={"text": sentences[0]}),
            c.post("/translate", json={"text": sentences[0], "api_key": "s3cre"}),
            c.post("/translate", json=lt),
            c.post("/translate", json={**lt, "api_key": "wrong"}),
            c.post("/translate", data={**lt, "api_key": "S3CRET"}),
            c.post("/translate", json={"text": "a"}, headers={"Authorization": "Bearer s3cret!"}),
            c.post("/attention", json={"text": "a"}),
            c.post("/detect", json={"q": "a"}),
        ]:
            assert res.status_code == 403 and "API key" in res.json()["error"], res.text
        assert compared  # every key is compared in constant time
        ok = [
            c.post("/translate", json={"text": sentences[0], "api_key": "s3cret"}),
            c.post("/translate", json={"text": sentences[0]}, headers={"Authorization": "Bearer s3cret"}),
            c.post("/translate", json={"text": sentences[0]}, headers={"X-API-Key": "s3cret"}),
            c.post("/translate", json={**lt, "api_key": "s3cret"}),
            c.post("/translate", data={**lt, "api_key": "s3cret"}),
            c.post("/attention", json={"text": sentences[0], "api_key": "s3cret"}),
        ]
        assert [r.status_code for r in ok] == [200] * 6
        for path in ("/health", "/ready", "/metrics", "/languages", "/"):  # open: probes, scrapers, the page
            assert c.get(path).status_code == 200
        assert c.get("/health").json()["api_key_required"] is True


def test_metrics_parse_as_prometheus_text(translator, sentences):
    with TestClient(create_app(translator)) as c:
        for s in sentences[:3]:
            assert c.post("/translate", json={"text": [s, s], "beam_size": 1}).status_code == 200
        assert c.post("/translate", json={"text": 5}).status_code == 422
        res = c.get("/metrics")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(res.text)}
    samples = {f: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families[f].samples} for f in families}
    ok = ("nanomt_requests_total", (("method", "POST"), ("route", "/translate"), ("status", "200")))
    bad = ("nanomt_requests_total", (("method", "POST"), ("route", "/translate"), ("status", "422")))
    assert samples["nanomt_requests"][ok] == 3 and samples["nanomt_requests"][bad] == 1
    assert families["nanomt_request_duration_seconds"].type == "histogram"
    count = ("nanomt_request_duration_seconds_count", (("route", "/translate"),))
    assert samples["nanomt_request_duration_seconds"][count] == 4
    assert samples["nanomt_queue_depth"][("nanomt_queue_depth", ())] == 0
    assert families["nanomt_batch_sentences"].type == "histogram"
    assert samples["nanomt_batch_sentences"][("nanomt_batch_sentences_sum", ())] == 6
    assert samples["nanomt_sentences"][("nanomt_sentences_total", ())] == 6
    assert samples["nanomt_source_tokens"][("nanomt_source_tokens_total", ())] >= 12
    assert samples["nanomt_throughput"][("nanomt_throughput", (("unit", "sentences"),))] == pytest.approx(6 / 60)


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    """A real `nanomt serve` process on 127.0.0.1 and a free port; its URL."""
    log_dir = tmp_path_factory.mktemp("server")
    proc, url, log = start_server_retrying(run_dir, log_dir)
    try:
        yield url
        assert proc.poll() is None, f"server died: {log.read_text()}"
    finally:
        stop(proc)


@pytest.mark.slow
def test_load_on_a_real_server(server, translator, sentences):
    payloads = [
        ("/translate", {"text": sentences[0]}),
        ("/translate", {"text": sentences[1:3], "beam_size": 1}),
        ("/translate", {"text": sentences[3:6], "beam_size": 3}),
        ("/translate", {"text": [sentences[2], "", sentences[4]]}),
        ("/attention", {"text": sentences[5], "beam_size": 2}),
    ]
    clients, per_client = 8, 26  # 208 requests

    def client_loop(c: int) -> list[tuple[int, int, dict | str]]:
        out = []
        with httpx.Client(base_url=server, timeout=60) as http:
            for j in range(per_client):
                k = (c + j) % len(payloads)
                try:
                    res = http.post(payloads[k][0], json=payloads[k][1])
                    body = res.json()
                    body.pop("seconds", None)
                    out.append((k, res.status_code, body))
                except (httpx.HTTPError, ValueError) as e:
                    out.append((k, -1, repr(e)))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client_loop, range(clients)) for r in rs]
    seconds = time.perf_counter() - start
    assert len(results) == clients * per_client >= 200
    errors = [r for r in results if r[1] != 200]
    assert not errors, errors[:3]
    answers = {k: {repr(body) for kk, _, body in results if kk == k} for k in range(len(payloads))}
    assert all(len(a) == 1 for a in answers.values()), "identical requests got different answers"
    by_payload = {k: body for k, _, body in results}
    for k, (_, payload) in enumerate(payloads[:4]):
        texts = [payload["text"]] if isinstance(payload["text"], str) else payload["text"]
        assert by_payload[k]["translations"] == translator.translate(texts, beam_size=payload.get("beam_size", 2))
    assert by_payload[4]["translation"] == translator.attention(sentences[5], beam_size=2).translation
    print(f"{len(results)} requests from {clients} clients in {seconds:.1f} s ({len(results) / seconds:.0f}/s)")


@pytest.mark.slow
def test_sigterm_stops_accepting_and_answers_what_came_in(run_dir, translator, many, tmp_path):
    # A long batching wait holds the requests in the queue while the signal arrives; the key comes from the
    # environment.
    args = ("--max-wait-ms", "6000", "--beam", "1")
    proc, url, log = start_server_retrying(run_dir, tmp_path, args, env={"NANOMT_API_KEY": "k3y"})
    try:
        assert httpx.post(url + "/translate", json={"text": "a"}, timeout=60).status_code == 403
        requests = [many[i : i + 1 + i % 3] for i in range(8)]
        auth = {"Authorization": "Bearer k3y"}
        with ThreadPoolExecutor(len(requests)) as pool:
            futures = [
                pool.submit(httpx.post, url + "/translate", json={"text": t}, headers=auth, timeout=120)
                for t in requests
            ]
            wait_until(
                lambda: httpx.get(url + "/ready", timeout=10).json()["queue_depth"] == len(requests), "all queued"
            )
            proc.send_signal(signal.SIGTERM)
            # No new connections while the queued requests are answered.
            wait_until(lambda: not reachable(url), "the listening socket closed", timeout=30)
            assert not all(f.done() for f in futures), "answered before the signal: the test proves nothing"
            responses = [f.result(timeout=120) for f in futures]
        assert [r.status_code for r in responses] == [200] * len(requests), [r.text for r in responses]
        assert [r.json()["translations"] for r in responses] == [translator.translate(t, beam_size=1) for t in requests]
        # uvicorn re-raises the signal once it has shut down, so the exit status is SIGTERM's (or 0).
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        text = log.read_text()
        assert "queue drained" in text, text
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert sum(e["path"] == "/translate" and e["status"] == 200 for e in lines) == len(requests), text
    finally:
        if proc.poll() is None:
            stop(proc)


def reachable(url: str) -> bool:
    try:
        httpx.get(url + "/health", timeout=5)
        return True
    except httpx.TransportError:
        return False


@pytest.mark.slow  # a foreign client library on a real server
def test_a_libretranslate_client_library_talks_to_nanomt_serve(server, translator, sentences):
    libretranslatepy = pytest.importorskip("libretranslatepy")  # the dev extra installs it
    lt = libretranslatepy.LibreTranslateAPI(server)
    t0, t1, t2 = libre(translator, sentences[:3])
    # a paragraph and a blank line: split into sentences, translated, joined in the same shape
    assert lt.translate(f"{sentences[0]} {sentences[1]}\n\n{sentences[2]}", "src", "tgt") == f"{t0} {t1}\n\n{t2}"
    assert lt.translate(sentences[0], "auto", "tgt") == t0
    assert lt.detect(sentences[0]) == [{"confidence": 100.0, "language": "src"}]
    assert lt.languages() == [{"code": "src", "name": "src", "targets": ["tgt"]}]
