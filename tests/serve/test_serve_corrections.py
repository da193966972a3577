"""Corrections trusted by design: a stranger's or an ordinary key's /suggest is kept for review and never served
until approved (`nanomt memory pending|approve|reject|delete`), a trusted key's is served at once, reported as
memory (no made-up confidence), and the served ones are bounded."""

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.cli import main  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402
from nanomt.serve.store import StoreDown, open_store  # noqa: E402
from nanomt.serve.store.sqlite import SqliteStore  # noqa: E402

PAIR = {"source": "src", "target": "tgt"}
POISON = "POISONED BY A STRANGER."


@pytest.fixture(scope="module")
def translator(served_run):
    return Translator.from_checkpoint(served_run)


def suggest(client, q: str, s: str, key: str | None = None):
    return client.post("/suggest", json={"q": q, "s": s, **PAIR, **({"api_key": key} if key else {})})


def memory(capsys, *args) -> list[dict]:
    """`nanomt memory ARGS --json`'s entries."""
    main(["memory", *args, "--json"])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_strangers_suggestion_waits_for_review_and_is_served_once_approved(translator, lines, tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/store.db"
    app = create_app(translator, store=open_store(url), suggestions=True, access_log=False)
    with TestClient(app) as client:
        res = suggest(client, lines[0], POISON)
        assert res.status_code == 200 and res.json() == {"success": True, "status": "pending"}, res.text
        out = client.post("/translate", json={"text": [lines[0]]}).json()
        assert out["translations"] == translator.translate([lines[0]]) and "memory" not in out  # before: POISONED
        suggest(client, lines[1], "A better one.")
        [first, second] = memory(capsys, "pending", url)
        assert (first["source"], first["translation"], first["by"]) == (lines[0], POISON, "ip:testclient")
        main(["memory", "reject", url, first["id"]])
        main(["memory", "approve", url, second["id"]])
        assert memory(capsys, "pending", url) == []
        out = client.post("/translate", json={"text": [lines[0], lines[1]], "confidence": True}).json()
        assert out["translations"] == [translator.translate([lines[0]])[0], "A better one."] and out["memory"] == [1]
        remembered = out["sentences"][1][0]  # a person's translation: no made-up confidence of 1.0
        assert remembered["memory"] is True and remembered.get("confidence") is None and out["confidence"][1] is None
        [served] = memory(capsys, "list", url)
        main(["memory", "delete", url, served["id"]])
        assert client.post("/translate", json={"text": [lines[1]]}).json()["translations"] != ["A better one."]
        with pytest.raises(SystemExit):
            main(["memory", "approve", url, "no-such-id"])
        assert "no such suggestion: no-such-id" in capsys.readouterr().err


def test_an_ordinary_keys_suggestion_waits_and_a_trusted_keys_is_served(translator, lines, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line("ordinary", "someone") + "\n" + key_line("editor", "editor", trusted=True) + "\n")
    app = create_app(translator, keys_file=str(keys), suggestions=True, max_corrections=2, access_log=False)
    with TestClient(app) as client:
        assert suggest(client, lines[0], POISON, "ordinary").json()["status"] == "pending"
        translate = lambda text: client.post(  # noqa: E731
            "/translate", json={"text": [text], "api_key": "ordinary"}
        ).json()["translations"][0]
        assert translate(lines[0]) == translator.translate([lines[0]])[0]
        assert suggest(client, lines[0], "Fixed.", "editor").json()["status"] == "served"
        assert translate(lines[0]) == "Fixed."
        assert suggest(client, lines[0], "Fixed again.", "editor").status_code == 200  # a replacement: no more
        assert suggest(client, lines[1], "Two.", "editor").status_code == 200
        full = suggest(client, lines[2], "Three.", "editor")
        assert full.status_code == 507 and "2 corrections" in full.json()["error"], full.text
        assert suggest(client, lines[2], "x", "wrong").status_code == 403


def test_memory_commands_fail_in_one_line_when_the_store_is_down_and_never_write_half(tmp_path, capsys, monkeypatch):
    url, out = f"sqlite:///{tmp_path}/store.db", tmp_path / "tm.tsv"
    open_store(url).close()
    out.write_text("the last export\n")

    def down(self, prefix):
        raise StoreDown(f"{self.url}: database is locked")

    monkeypatch.setattr(SqliteStore, "scan", down)
    with pytest.raises(SystemExit):
        main(["memory", "export", url, "--out", str(out)])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "database is locked: nothing was written" in err, err  # before: "0 exported"
    assert out.read_text() == "the last export\n"
    with pytest.raises(SystemExit):
        main(["memory", "pending", "redis://:s3cret@127.0.0.1:1/0"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach" in err and "s3cret" not in err, err
