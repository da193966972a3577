"""The server's pools under bursts, on each store, as an operator starts it: no thread waits on work that needs a
thread of its own pool, every wait ends at the request's deadline, /ready says when the server cannot make progress."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from servers import start_redis, start_server_retrying, stop

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.workers import Busy, Expired, Pool  # noqa: E402

BURST = 24  # requests at once: more than the documents pool's threads (16) and the default executor's (6 on 2 cores)


@pytest.fixture(scope="module")
def run_dir(served_run):
    return served_run


@pytest.fixture(scope="module")
def paragraphs(toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()
    return [" ".join(lines[i : i + 4]) for i in range(0, 4 * BURST, 4)]


def burst(url: str, paragraphs: list[str]) -> list:
    """LibreTranslate format=text paragraphs, all at once: each answer's status (or the client's error)."""

    def one(paragraph: str):
        body = {"q": paragraph, "source": "src", "target": "tgt", "format": "text"}
        try:
            return httpx.post(f"{url}/translate", json=body, timeout=40).status_code
        except httpx.TimeoutException:
            return "no answer within 40 s"

    with ThreadPoolExecutor(len(paragraphs)) as ex:
        return list(ex.map(one, paragraphs))


@pytest.mark.slow  # real nanomt serve processes
@pytest.mark.parametrize("store", ["sqlite", "redis", "memory"])
def test_a_burst_of_paragraphs_is_answered_on_every_store_from_the_first_requests(store, run_dir, paragraphs, tmp_path):
    redis = start_redis() if store == "redis" else None
    url_of = {"sqlite": f"sqlite:///{tmp_path}/store.db", "memory": "memory://"}
    args = ["--store", redis.url if redis else url_of[store], "--no-access-log", "--timeout", "30"]
    proc, url, log = start_server_retrying(run_dir, tmp_path, args)
    try:
        first = burst(url, paragraphs)  # a fresh server's first requests: the weights' hash is computed meanwhile
        assert first == [200] * BURST, (first, log.read_text()[-2000:])
        assert burst(url, paragraphs) == [200] * BURST  # and again, the cache answering some
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 200
    finally:
        stop(proc)
        if redis:
            redis.stop()


def test_a_pool_is_bounded_and_a_task_past_its_deadline_never_starts():
    pool, started = Pool("test", threads=1, queue=1), []
    gate = threading.Event()
    held = pool.submit(gate.wait)
    queued = pool.submit(lambda: started.append("late"), deadline=time.monotonic() + 0.05)
    with pytest.raises(Busy):
        pool.submit(lambda: None)  # one thread and one place in the queue: full
    time.sleep(0.1)
    assert pool.oldest() >= 0.1  # the queued task has waited that long for the thread
    gate.set()
    held.result(5)
    with pytest.raises(Expired):
        queued.result(5)
    assert started == [] and pool.tasks() == 0
    pool.close()


class Stuck:
    """A Translator whose decoding blocks until released: a model that cannot make progress."""

    def __init__(self, inner):
        self.inner, self.release = inner, threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def translate_n_best(self, texts, **kwargs):
        self.release.wait(30)
        return self.inner.translate_n_best(texts, **kwargs)


def test_a_document_past_its_deadline_is_a_504_and_ready_says_the_server_is_stuck(run_dir, paragraphs):
    stuck = Stuck(Translator.from_checkpoint(run_dir))
    app = create_app(stuck, timeout=1.0, access_log=False)
    with TestClient(app) as client:
        start = time.monotonic()
        res = client.post("/translate", json={"q": paragraphs[0], "source": "src", "target": "tgt"})
        assert res.status_code == 504 and time.monotonic() - start < 5, res.text
        assert "timeout" in res.json()["error"]
        time.sleep(1.2)  # the batch has now been decoding for longer than the server's timeout
        ready = client.get("/ready")
        assert ready.status_code == 503 and "no progress" in ready.json()["error"], ready.text
        assert client.get("/health").status_code == 200  # alive: a balancer only takes it out of rotation
        stuck.release.set()
        for _ in range(100):
            if client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        assert client.get("/ready").status_code == 200
        res = client.post("/translate", json={"q": paragraphs[1], "source": "src", "target": "tgt"})
        assert res.status_code == 200, res.text


def test_files_are_parsed_two_at_a_time(run_dir, paragraphs, monkeypatch):
    from nanomt.documents import files

    inside, most, lock, parse = [0], [0], threading.Lock(), files.translate_file

    def counted(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.2)  # long enough for the others to arrive
            return parse(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(files, "translate_file", counted)
    with TestClient(create_app(Translator.from_checkpoint(run_dir), access_log=False)) as client:

        def upload(i: int) -> int:
            files_ = {"file": ("a.txt", paragraphs[i])}
            return client.post("/translate_file", data={"source": "src", "target": "tgt"}, files=files_).status_code

        with ThreadPoolExecutor(6) as ex:
            assert list(ex.map(upload, range(6))) == [200] * 6
    assert most[0] == 2  # each parse holds a whole file in memory: never more than two at once
