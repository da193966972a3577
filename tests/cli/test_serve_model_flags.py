"""`nanomt serve`'s flags for many models and their limits reach the server it starts: --pivot, --max-loaded,
--req-limit, --char-limit, --device, --int8 and --keys-file, each seen in what the server answers."""

from __future__ import annotations

import flag_run
import numpy as np
import pytest
from flag_run import rounded_cross

from nanomt.cli import main
from nanomt.core import runtime
from nanomt.decoding.translate import Translator
from nanomt.serve.keys import key_line

run_dir, inputs = flag_run.run_dir, flag_run.inputs  # flag_run's fixtures, this module's too

pytestmark = pytest.mark.usefixtures("one_thread")


def loaded(client) -> list[tuple]:
    """(loaded, device, int8) of each model /health lists."""
    return [(m["loaded"], m["device"], m["int8"]) for m in client.get("/health").json()["models"]]


def test_pivot_max_loaded_limits_device_and_int8_flags_reach_the_server(run_dir, inputs, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import uvicorn
    from fastapi.testclient import TestClient

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: True)  # the test process's malloc left as it is
    keys = tmp_path / "keys"
    keys.write_text(key_line("k3y") + "\n")  # a key without limits of its own: the server's are its
    flags = ["--pivot", "yy", "--max-loaded", "1", "--req-limit", "2", "--char-limit", "40"]
    flags += ["--device", "cpu:0", "--int8", "--keys-file", str(keys)]
    main(["serve", f"xx-yy={run_dir}", f"yy-zz={run_dir}", *flags])
    int8, plain = Translator.from_checkpoint(run_dir, int8=True), Translator.from_checkpoint(run_dir)
    text = next(s for s in inputs.lines if len(s) <= 40)
    auth = {"Authorization": "Bearer k3y"}
    with TestClient(started["app"]) as c:
        assert loaded(c) == [(False, None, None)] * 2  # --max-loaded 1 of 2 models: none loaded before it is asked for
        # --pivot yy: xx reaches zz through yy.
        assert {x["code"]: x["targets"] for x in c.get("/languages").json()} == {"xx": ["yy", "zz"], "yy": ["zz"]}
        res = c.post("/translate", json={"text": [text], "source": "xx", "target": "zz"}, headers=auth)  # request 1
        assert res.status_code == 200, res.text
        assert res.json()["route"] == ["xx-yy", "yy-zz"]
        assert res.json()["translations"] == int8.translate(int8.translate([text]))
        assert loaded(c) == [(False, None, None), (True, "cpu:0", True)]  # the least recently used one unloaded
        # --char-limit 40: a request of 41 characters is refused, and not counted against --req-limit.
        res = c.post("/translate", json={"text": ["a" * 41]}, headers=auth)
        assert res.status_code == 413 and "41 characters" in res.json()["error"], res.text
        res = c.post("/attention", json={"text": text, "source": "xx", "target": "yy"}, headers=auth)  # request 2
        assert res.status_code == 200, res.text
        assert loaded(c) == [(True, "cpu:0", True), (False, None, None)]
        # --int8: the served model's linear layers are int8 ones; its attention weights are theirs, not float32's.
        cross = np.array(res.json()["cross_attention"])
        want, float32 = (rounded_cross(t.attention(text, beam_size=2)) for t in (int8, plain))
        np.testing.assert_array_equal(cross, want)
        assert not np.array_equal(cross, float32)
        # --req-limit 2: a third request within the minute is refused.
        res = c.post("/translate", json={"text": [text], "source": "xx", "target": "yy"}, headers=auth)
        assert res.status_code == 429 and int(res.headers["retry-after"]) > 0, res.text
