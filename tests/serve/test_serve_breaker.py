"""A store that hangs (Redis stopped with SIGSTOP, as behind a dead NAT) under load: every request answers in bounded
time, probes included, the store is skipped after its first failure (a circuit breaker, logged once) and used again
once it answers."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from servers import metric, start_redis, start_server_retrying, stop

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.store import open_store  # noqa: E402

BOUND = 15.0  # seconds any request may take while the store hangs (the store's wait is 5 s)


@pytest.fixture(scope="module")
def run_dir(served_run):
    return served_run


def timed(fn):
    start = time.monotonic()
    try:
        return fn().status_code, time.monotonic() - start
    except httpx.TimeoutException:
        return "no answer", time.monotonic() - start


def load(url: str, lines: list[str], n: int = 8) -> list[tuple]:
    """n requests at once, half nanomt's sentences, half LibreTranslate's paragraphs: (status, seconds) each."""

    def one(i: int):
        if i % 2:
            body = {"q": " ".join(lines[i : i + 3]), "source": "src", "target": "tgt"}
        else:
            body = {"text": [lines[i]]}
        return timed(lambda: httpx.post(f"{url}/translate", json=body, timeout=60))

    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(one, range(n)))


@pytest.mark.slow  # a real nanomt serve process
def test_a_paused_redis_costs_each_request_a_bounded_wait_and_is_used_again_once_resumed(run_dir, lines, tmp_path):
    redis = start_redis()
    args = ["--store", redis.url, "--req-limit", "1000", "--timeout", "30", "--no-access-log"]
    proc, url, log = start_server_retrying(run_dir, tmp_path, args)
    try:
        assert load(url, lines, 2)[0][0] == 200
        redis.pause()
        with ThreadPoolExecutor(1) as ex:
            during = ex.submit(load, url, lines, 8)
            time.sleep(0.5)
            health = timed(lambda: httpx.get(f"{url}/health", timeout=10))
            answered = during.result()
        assert health[0] == 200 and health[1] < 1.0, health  # the event loop never waits for the store
        assert all(status == 200 and seconds < BOUND for status, seconds in answered), answered
        # The breaker is open now: a request no longer waits for the store at all.
        assert all(s == 200 and t < 2.0 for s, t in load(url, lines[20:], 4)), log.read_text()[-3000:]
        assert httpx.get(f"{url}/health").json()["store"]["reachable"] is False
        redis.resume()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").json()["store"]["reachable"] is False:
            assert time.monotonic() < deadline, "the store was not used again within 30 s of its return"
            time.sleep(0.2)
        again = httpx.post(f"{url}/translate", json={"text": [lines[40]]}, timeout=10)
        assert again.status_code == 200 and cache_misses(url) >= 1  # looked up in the store again
        text = log.read_text()
        assert text.count("store lost") == 1 and text.count("store back") == 1, text[-3000:]
    finally:
        stop(proc)
        redis.stop()


def cache_misses(url: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, "nanomt_cache_misses_total")


def test_limits_that_fail_closed_refuse_in_bounded_time_while_the_store_hangs(run_dir, lines):
    redis = start_redis()
    store = open_store(redis.url)
    app = create_app(
        Translator.from_checkpoint(run_dir), store=store, req_limit=100, limits_fail_closed=True, access_log=False
    )
    try:
        with TestClient(app) as client:
            assert client.post("/translate", json={"text": [lines[0]]}).status_code == 200
            redis.pause()
            refused = [timed(lambda t=line: client.post("/translate", json={"text": [t]})) for line in lines[1:4]]
            assert refused[0][0] == 503 and refused[0][1] < BOUND, refused
            assert all(s == 503 and t < 1.0 for s, t in refused[1:]), refused  # skipped: no wait at all
            redis.resume()
    finally:
        redis.stop()
        store.close()
