"""What the server must keep doing whatever its code looks like: the batcher's token budget and order, a worker that
survives a failed batch, and draining."""

import threading
import time

import pytest
import serve_run

from nanomt.decoding.translate import Translator
from nanomt.serve.batching import Batcher

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import create_app  # noqa: E402

run_dir = serve_run.run_dir  # serve_run's fixture, this module's too


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


def test_the_batcher_fills_its_token_budget_in_arrival_order_and_sends_a_larger_job_alone():
    calls, gate = [], threading.Event()

    def run(key, items):
        if items == ["gate"]:
            assert gate.wait(60)
        calls.append(list(items))
        return items

    batcher = Batcher(run, max_tokens=10, max_wait=0.0)
    first = batcher.submit("k", ["gate"], 1)
    while not batcher.depth() == 0 or not batcher.alive():
        time.sleep(0.01)
    time.sleep(0.05)  # the worker holds the gate job
    jobs = [batcher.submit("k", [f"j{i}"], t) for i, t in enumerate((4, 6, 4, 20, 3))]
    other = batcher.submit("other", ["o"], 1)
    gate.set()
    for job in [first, *jobs, other]:
        job.future.result(timeout=60)
    batcher.close(10)
    # 4 + 6 fill 10 exactly, a third job does not fit; 20 goes alone though over the budget; the other key waits.
    assert calls == [["gate"], ["j0", "j1"], ["j2"], ["j3"], ["j4"], ["o"]]


class FailsOnce:
    """A translator whose first call fails."""

    def __init__(self, inner: Translator):
        self.inner, self.cfg, self.failed = inner, inner.cfg, False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate(self, sentences, **kwargs):
        if not self.failed:
            self.failed = True
            raise RuntimeError("the model failed once")
        return self.inner.translate(sentences, **kwargs)


def test_the_worker_survives_a_failed_batch(translator):
    with TestClient(create_app(FailsOnce(translator)), raise_server_exceptions=False) as c:
        assert c.post("/translate", json={"text": "la nuka."}).status_code == 500
        res = c.post("/translate", json={"text": "la nuka.", "beam_size": 1})
        assert res.status_code == 200 and res.json()["translations"] == translator.translate(["la nuka."], beam_size=1)


def test_while_draining_a_request_gets_503_with_retry_after_and_ready_is_503(translator):
    app = create_app(translator)
    with TestClient(app) as c:
        assert c.get("/ready").status_code == 200
        app.state.engine.close(10)
        res = c.post("/translate", json={"text": "la nuka."})
        assert res.status_code == 503 and res.headers["retry-after"] == "5", res.text
        ready = c.get("/ready")
        assert ready.status_code == 503 and "shutting down" in ready.json()["error"]
