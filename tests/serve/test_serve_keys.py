"""Several API keys with limits of their own (a keys file, hashed at rest), and language detection, served."""

import hmac

import pytest
from conftest import tiny_config

from nanomt.decoding.translate import Translator
from nanomt.serve.keys import hash_key, key_line

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.cli import main  # noqa: E402
from nanomt.serve import ModelSet, ModelSpec, create_app  # noqa: E402


@pytest.fixture(scope="module")
def translator(toy_corpus, trained):
    return Translator.from_checkpoint(trained(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10)))


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "keys"
    lines = [key_line("alice-key", "alice", req_limit=2), key_line("bob-key", "bob", char_limit=12), "# a comment"]
    path.write_text("\n".join(lines) + "\n")
    assert "alice-key" not in path.read_text() and hash_key("alice-key") in path.read_text()  # hashed at rest
    return path


def test_each_key_has_its_own_limits_and_a_429_says_when_to_retry(translator, keys_file, monkeypatch):
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    with TestClient(create_app(translator, keys_file=str(keys_file), char_limit=1000)) as c:
        ask = lambda key, text="la nuka.": c.post("/translate", json={"text": text, "api_key": key})  # noqa: E731
        assert ask(None).status_code == 403 and ask("mallory").status_code == 403
        assert [ask("alice-key").status_code for _ in range(2)] == [200, 200]
        third = ask("alice-key")
        assert third.status_code == 429 and 1 <= int(third.headers["retry-after"]) <= 60, third.text
        assert ask("bob-key").status_code == 200  # alice's limit is hers alone
        long = ask("bob-key", "la nuka fosur la fesa.")
        assert long.status_code == 413 and "this key's limit is 12" in long.json()["error"]
        assert ask("alice-key", "la nuka fosur la fesa.").status_code == 429  # her own char limit is the default
        lt = c.post(
            "/translate", json={"q": "la nuka.", "source": "src", "target": "tgt"}, headers={"x-api-key": "bob-key"}
        )
        assert lt.status_code == 200
        assert c.get("/frontend/settings").json()["keyRequired"] is True
    assert len(compared) >= 2 * 6  # every entry compared for every request, in constant time


def test_a_malformed_keys_file_is_a_one_line_error_at_start(translator, tmp_path, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    bad = tmp_path / "keys"
    bad.write_text(key_line("k") + "\nplain-key-not-hashed\n")
    run = tmp_path / "run"
    from nanomt.core.checkpoint import model_state, write_checkpoint_dir

    tok_dir = tmp_path / "tok"
    translator.tokenizer.save(tok_dir)
    write_checkpoint_dir(run, translator.cfg, tok_dir, model_state(translator.model))
    with pytest.raises(SystemExit):
        main(["serve", str(run), "--keys-file", str(bad)])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bad}:2:" in err


def test_source_auto_is_detected_among_the_served_languages(translator, toy_corpus, tmp_path):
    pytest.importorskip("lingua")
    from nanomt.core.checkpoint import model_state, write_checkpoint_dir

    tok_dir = tmp_path / "tok"
    translator.tokenizer.save(tok_dir)
    run = write_checkpoint_dir(tmp_path / "run", translator.cfg, tok_dir, model_state(translator.model))
    models = ModelSet.read([ModelSpec(str(run), "de", "en"), ModelSpec(str(run), "fr", "en")], "en", None, "cpu", False)
    with TestClient(create_app(models)) as c:
        found = c.post("/detect", json={"q": "Der Hund läuft schnell über die grüne Wiese."}).json()
        assert found[0]["language"] == "de" and found[0]["confidence"] > found[-1]["confidence"]
        assert {x["language"] for x in found} <= {"de", "fr"}
        res = c.post(
            "/translate",
            json={"q": ["Le chien court dans le jardin.", "Der Hund läuft."], "source": "auto", "target": "en"},
        )
        assert [d["language"] for d in res.json()["detectedLanguage"]] == ["fr", "de"]
