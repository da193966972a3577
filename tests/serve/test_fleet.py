"""A fleet: two `nanomt serve` processes sharing one real Redis give what one server gives (limits, downloads,
corrections, the cache), whichever replica a request lands on."""

import os
import subprocess
import time

import pytest
from conftest import NANOMT, tiny_config
from servers import free_port, metric, start_redis

from nanomt.serve.keys import key_line

httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(toy_corpus, trained, tmp_path_factory):
    redis = start_redis()
    tmp = tmp_path_factory.mktemp("fleet")
    run = trained(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10))
    keys = tmp / "keys"
    keys.write_text(key_line("fleet-key", "fleet", req_limit=5, trusted=True) + "\n")  # its corrections served
    ports = [free_port(), free_port()]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                *NANOMT,
                "serve",
                str(run),
                "--port",
                str(port),
                "--store",
                redis.url,
                "--keys-file",
                str(keys),
                "--suggestions",
                "--no-access-log",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for port in ports
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        deadline = time.monotonic() + 60
        for url, proc in zip(urls, procs):
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()
                try:
                    if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the replica did not start within 60 s"
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        redis.stop()


def cache_hits(url: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, "nanomt_cache_hits_total")


def test_two_replicas_on_one_redis_serve_as_one(fleet, toy_corpus):
    a, b = fleet
    lines = toy_corpus["test.src"].read_text().splitlines()
    auth = {"Authorization": "Bearer fleet-key"}
    post = lambda url, body: httpx.post(f"{url}/translate", json=body, headers=auth, timeout=30)  # noqa: E731

    # A sentence translated by one replica is a cache hit on the other.
    first = post(a, {"text": [lines[0]]})
    assert first.status_code == 200, first.text
    before = cache_hits(b)
    again = post(b, {"text": [lines[0]]})
    assert again.json()["translations"] == first.json()["translations"] and cache_hits(b) == before + 1

    # A correction sent to one is answered by the other.
    correction = {"q": lines[1], "s": "FIXED.", "source": "src", "target": "tgt"}
    fixed = httpx.post(f"{a}/suggest", json=correction, headers=auth)
    assert fixed.status_code == 200, fixed.text
    out = post(b, {"text": [lines[1]]}).json()
    assert out["translations"] == ["FIXED."] and out["memory"] == [0]

    # A file translated through one downloads from the other.
    files = {"file": ("a.txt", f"{lines[2]}\n{lines[3]}\n".encode())}
    res = httpx.post(f"{a}/translate_file", data={"source": "src", "target": "tgt"}, files=files, headers=auth)
    assert res.status_code == 200, res.text
    path = res.json()["translatedFileUrl"].split("/", 3)[3]
    download = httpx.get(f"{b}/{path}")
    assert download.status_code == 200 and download.content.decode().count("\n") == 2

    # The key's limit (5 a minute, all counted above) holds across both: past it, a 429 on either.
    for url in (a, b):
        res = post(url, {"text": [lines[4]]})
        assert res.status_code == 429 and 1 <= int(res.headers["retry-after"]) <= 60, res.text
