"""What the server tells anyone who asks: /health without file paths, /metrics behind a key where the operator
sets one, /docs from the package's own files (no CDN) or closed."""

import re
import threading

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import ModelSet, ModelSpec, create_app  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(served_run):
    return served_run


def served(run_dir, **settings) -> TestClient:
    models = ModelSet.read([ModelSpec(str(run_dir), "src", "tgt")], "en", None, "cpu", False)
    return TestClient(create_app(models, access_log=False, **settings))


def test_health_names_no_file_and_metrics_answer_only_their_key(run_dir):
    with served(run_dir, metrics_key="m3trics") as client:
        health = client.get("/health")
        assert str(run_dir) not in health.text and "path" not in health.json()["models"][0]  # before: the run's path
        assert client.get("/metrics").status_code == 403
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
        res = client.get("/metrics", headers={"Authorization": "Bearer m3trics"})
        assert res.status_code == 200 and "nanomt_requests_total" in res.text
    with served(run_dir) as client:
        assert client.get("/metrics").status_code == 200  # open unless a key is set


def test_the_api_docs_fetch_nothing_from_another_host_or_are_closed(run_dir):
    with served(run_dir) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
        assert urls and not [u for u in urls if re.match(r"(https?:)?//", u)], urls  # before: a CDN's scripts
        for url in urls:
            assert client.get(f"/{url}").status_code == 200, url
        assert client.get("/docs/static/../../settings.py").status_code == 404
    with served(run_dir, no_docs=True) as client:
        assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404


def test_detect_is_size_checked_and_detects_off_the_event_loop(run_dir, monkeypatch):
    from nanomt.serve import langdetect

    seen, detect = [], langdetect.detect
    monkeypatch.setattr(langdetect, "detect", lambda *a: seen.append(threading.current_thread().name) or detect(*a))
    models = ModelSet.read([ModelSpec(str(run_dir), s, "en") for s in ("de", "fr")], "en", None, "cpu", False)
    with TestClient(create_app(models, max_chars=100, access_log=False)) as client:
        res = client.post("/detect", json={"q": "Der Hund läuft durch den Park."})
        assert res.status_code == 200 and res.json()[0]["language"] == "de", res.text
        res = client.post("/translate", json={"q": "Le chien court dans le parc.", "source": "auto", "target": "en"})
        assert res.status_code == 200 and res.json()["detectedLanguage"]["language"] == "fr", res.text
        assert seen and all(name.startswith("nanomt-work") for name in seen), seen  # before: on the event loop
        big = client.post("/detect", json={"q": "Der Hund. " * 20})
        assert big.status_code == 413 and "limit is 100" in big.json()["error"], big.text  # before: no size check
