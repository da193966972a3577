"""Every `nanomt serve` flag below reaches the server it starts: host, port, beam, batching, queue, timeout, API key,
access log and glossary, and --one-lock."""

import pytest
import serve_run

from nanomt.decoding.translate import Translator

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.cli import main  # noqa: E402

run_dir = serve_run.run_dir  # serve_run's fixture, this module's too


def test_every_serve_flag_reaches_the_server(run_dir, tmp_path, monkeypatch):
    import uvicorn

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    glossary = tmp_path / "glossary.tsv"
    glossary.write_text("nuka\tdog\n")
    flags = ["--host", "0.0.0.0", "--port", "8123", "--beam", "3", "--max-batch-tokens", "777"]
    flags += ["--max-wait-ms", "12", "--queue-size", "9", "--timeout", "7", "--api-key", "k3y", "--no-access-log"]
    main(["serve", str(run_dir), *flags, "--glossary", str(glossary)])
    app = started["app"]
    assert (started["host"], started["port"], started["timeout_graceful_shutdown"]) == ("0.0.0.0", 8123, 12)
    engine = app.state.engine
    assert (engine.max_tokens, engine.max_wait, engine.max_queue) == (777, 0.012, 9)
    with TestClient(app) as c:
        health = c.get("/health").json()
        assert health["default_beam"] == 3 and health["api_key_required"]
        assert c.post("/translate", json={"text": "x"}).status_code == 403
        res = c.post("/translate", json={"text": ["la nuka."], "api_key": "k3y"})
        assert res.status_code == 200
        translator = Translator.from_checkpoint(run_dir)
        expected = translator.translate(["la nuka."], beam_size=3, glossary=(("nuka", "dog"),))
        assert res.json()["translations"] == expected
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    main(["serve", str(run_dir), "--one-lock"])
    with TestClient(started["app"]) as c:
        assert c.post("/translate", json={"text": "la nuka."}).status_code == 200
