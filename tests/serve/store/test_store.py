"""The server's store (memory, SQLite, a real Redis started here): one interface, and what the server keeps in it."""

import logging
import time

import pytest
from conftest import tiny_config
from servers import free_port, start_redis

from nanomt.decoding.translate import Translator
from nanomt.serve.keys import key_line
from nanomt.serve.store import MemoryStore, StoreError, open_store

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.serve import create_app  # noqa: E402


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "sqlite":
        s = open_store(f"sqlite:///{tmp_path}/store.db")
        yield s
        s.close()
    else:
        server = request.getfixturevalue("redis_server")
        server.flush()
        s = open_store(server.url)
        yield s
        s.close()


def test_every_backend_keeps_values_bounded_groups_and_sliding_windows(store):
    assert store.get("nanomt:x") is None
    store.put("nanomt:x", b"\x00one")
    store.put("nanomt:gone", b"soon", ttl=0.05)
    assert store.get("nanomt:x") == b"\x00one" and store.get("nanomt:gone") == b"soon"
    assert store.get_many(["nanomt:x", "nanomt:none"]) == [b"\x00one", None]
    time.sleep(0.1)
    assert store.get("nanomt:gone") is None  # past its age
    for i in range(5):
        store.put(f"nanomt:g:{i}", str(i).encode(), bounds=(("g", 3),))
    assert [k for k, _ in store.scan("nanomt:g:")] == ["nanomt:g:2", "nanomt:g:3", "nanomt:g:4"]  # oldest dropped
    decisions = [store.hit("nanomt:rate:a", 2, 60.0) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False] and 1 <= decisions[2].retry_after <= 60
    assert store.hit("nanomt:rate:b", 2, 60.0).allowed  # a's window is a's alone
    assert [store.hit("nanomt:rate:c", 1, 0.2).allowed for _ in range(2)] == [True, False]
    time.sleep(0.25)
    assert store.hit("nanomt:rate:c", 1, 0.2).allowed  # the window slid past the first request


def test_a_store_that_cannot_be_opened_is_an_error_naming_it(tmp_path, monkeypatch):
    bad = tmp_path / "store.db"
    bad.write_bytes(b"not a database, and not to be replaced " * 100)
    with pytest.raises(StoreError, match=str(bad)):
        open_store(f"sqlite:///{bad}")
    assert bad.read_bytes().startswith(b"not a database")  # left as it was
    port = free_port()
    with pytest.raises(StoreError, match=f"redis://127.0.0.1:{port}/0: cannot reach"):
        open_store(f"redis://127.0.0.1:{port}/0")
    with pytest.raises(StoreError, match="ftp://x: not a store"):
        open_store("ftp://x")
    monkeypatch.chdir(tmp_path)  # sqlite:///data/x.db is data/x.db below the working directory (SQLAlchemy's form)
    with pytest.raises(StoreError, match="the folder data does not exist .*sqlite:////PATH is absolute"):
        open_store("sqlite:///data/x.db")
    assert not (tmp_path / "data").exists()


def test_nanomt_serve_with_a_store_it_cannot_open_stops_in_one_line(tmp_path, capsys):
    from nanomt.cli import main

    port = free_port()
    for url, says in ((f"redis://127.0.0.1:{port}/0", "cannot reach the store"), ("ftp://x", "not a store")):
        with pytest.raises(SystemExit):
            main(["serve", str(tmp_path / "no-run"), "--store", url])  # the store is opened before the models
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"nanomt: error: {url}: {says}"), err


def test_sqlite_survives_a_restart(tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    first = open_store(url)
    first.put("nanomt:k", b"v")
    first.hit("nanomt:rate:x", 1, 60.0)
    first.close()
    again = open_store(url)
    assert again.get("nanomt:k") == b"v" and not again.hit("nanomt:rate:x", 1, 60.0).allowed


@pytest.fixture(scope="module")
def run_dir(toy_corpus, trained):
    return trained(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10))


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


@pytest.fixture(scope="module")
def sentences(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()[:6]


def metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def test_the_cache_answers_as_decoding_does_and_never_for_samples(translator, sentences):
    ask = {"text": sentences[:4], "beam_size": 2}
    with TestClient(create_app(translator, cache_size=0)) as c:
        uncached = c.post("/translate", json=ask).json()["translations"]
        doc = c.post("/translate", json={"q": " ".join(sentences), "source": "src", "target": "tgt"}).json()
    with TestClient(create_app(translator, cache_size=100)) as c:
        first = c.post("/translate", json=ask).json()["translations"]
        assert metric(c, "nanomt_cache_misses_total") == 4 and metric(c, "nanomt_cache_hits_total") == 0
        again = c.post("/translate", json=ask).json()["translations"]
        assert metric(c, "nanomt_cache_hits_total") == 4
        assert first == again == uncached == translator.translate(sentences[:4], beam_size=2)
        for _ in range(2):  # documents (n-best lists, alternatives) too
            lt = c.post("/translate", json={"q": " ".join(sentences), "source": "src", "target": "tgt"}).json()
            assert lt == doc
        hits = metric(c, "nanomt_cache_hits_total")
        assert hits > 4
        c.post("/translate", json={"text": sentences[:4], "temperature": 0.7})
        c.post("/translate", json={"text": sentences[:4], "temperature": 0.7})
        assert metric(c, "nanomt_cache_hits_total") == hits  # samples are neither looked up nor kept
        misses = metric(c, "nanomt_cache_misses_total")
        other = c.post("/translate", json={"text": sentences[:4], "beam_size": 1}).json()["translations"]
        assert other == translator.translate(sentences[:4], beam_size=1)
        assert metric(c, "nanomt_cache_misses_total") == misses + 4  # other settings: another entry


def test_limits_per_key_and_per_address_and_the_whole_servers(translator, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line("k", "k", req_limit=1) + "\n")
    with TestClient(create_app(translator, req_limit=3, char_limit=20, batch_limit=2)) as c:
        res = c.post("/translate", json={"q": ["a"] * 3, "source": "src", "target": "tgt"})
        assert res.status_code == 413 and "limit is 2" in res.text  # --batch-limit
        codes = [c.post("/translate", json={"text": "la."}).status_code for _ in range(3)]
        assert codes == [200, 200, 429]  # a client without a key: the server's --req-limit per address
    with TestClient(create_app(translator, keys_file=str(keys), req_limit=3)) as c:
        codes = [c.post("/translate", json={"text": "la.", "api_key": "k"}).status_code for _ in range(2)]
        assert codes == [200, 429]  # a key's own limit
    trusted = create_app(translator, req_limit=1, char_limit=20, forwarded_allow_ips="testclient")
    with TestClient(trusted) as c:
        behind = lambda ip: c.post("/translate", json={"text": "la."}, headers={"x-forwarded-for": ip})  # noqa: E731
        assert [behind("1.1.1.1").status_code, behind("2.2.2.2").status_code] == [200, 200]
        assert behind("1.1.1.1").status_code == 429  # each client behind the proxy counted on its own
        assert c.post("/translate", json={"text": "a" * 21}).status_code == 413  # --char-limit
        # The nearest address that is no trusted proxy: the one the proxy saw, not what the client wrote before it.
        assert behind("6.6.6.6, 2.2.2.2").status_code == 429
    untrusted = create_app(translator, req_limit=1)
    with TestClient(untrusted) as c:  # the header of a client that is no trusted proxy is not believed
        codes = [c.post("/translate", json={"text": "la."}, headers={"x-forwarded-for": ip}).status_code for ip in "12"]
        assert codes == [200, 429]


def test_two_servers_on_one_sqlite_file_share_downloads_and_survive_a_restart(translator, sentences, tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    files = {"file": ("a.txt", f"{sentences[0]}\n".encode())}
    with TestClient(create_app(translator, store=open_store(url))) as a:
        res = a.post("/translate_file", data={"source": "src", "target": "tgt"}, files=files)
        assert res.status_code == 200, res.text
        path = res.json()["translatedFileUrl"].split("/", 3)[3]
        kept = a.get(f"/{path}").content
    with TestClient(create_app(translator, store=open_store(url))) as b:  # another process, or after a restart
        assert b.get(f"/{path}").content == kept == f"{translator.translate([sentences[0]])[0]}\n".encode()


def test_redis_lost_while_serving_translations_answer_and_it_is_logged_once(translator, sentences, caplog):
    server = start_redis()
    try:
        for fail_closed, code in ((False, 200), (True, 503)):
            app = create_app(translator, store=open_store(server.url), req_limit=100, limits_fail_closed=fail_closed)
            with TestClient(app) as c:
                assert c.post("/translate", json={"text": sentences[:2]}).status_code == 200
                server.stop()
                with caplog.at_level(logging.ERROR, logger="nanomt.serve"):
                    caplog.clear()
                    codes = [c.post("/translate", json={"text": sentences[:2]}).status_code for _ in range(3)]
                assert codes == [code] * 3
                lost = [r for r in caplog.records if "store lost" in r.getMessage()]
                assert len(lost) == 1, caplog.text
                assert c.get("/health").json()["store"] == {"url": server.url, "reachable": False}
                assert c.get("/download_file/x.a.txt").status_code == 503
                if not fail_closed:
                    want = translator.translate(sentences[:2])
                    assert c.post("/translate", json={"text": sentences[:2]}).json()["translations"] == want
                server.start()
    finally:
        server.stop()


def test_a_correction_is_answered_in_place_of_the_model_in_documents_too(translator, sentences):
    with TestClient(create_app(translator)) as c:
        off = c.post("/suggest", json={"q": "a", "s": "b", "source": "src", "target": "tgt"})
        assert off.status_code == 403 and off.json()["error"] == "Suggestions are disabled on this server."
    # The server's own key is trusted: its correction is served at once (anyone else's waits for review).
    app = create_app(translator, store=MemoryStore(), suggestions=True, api_key="k")
    with TestClient(app, headers={"Authorization": "Bearer k"}) as c:
        assert c.get("/frontend/settings").json()["suggestions"] is True
        res = c.post("/suggest", data={"q": f"  {sentences[0]} ", "s": "FIXED.", "source": "src", "target": "tgt"})
        assert res.status_code == 200 and res.json() == {"success": True, "status": "served"}, res.text
        out = c.post("/translate", json={"text": [sentences[0], sentences[1]]}).json()
        assert out["translations"][0] == "FIXED." and out["memory"] == [0]
        assert out["translations"][1] == translator.translate([sentences[1]])[0]
        doc = c.post("/translate", json={"q": f"{sentences[1]} {sentences[0]}", "source": "src", "target": "tgt"})
        assert doc.json()["translatedText"].endswith("FIXED."), doc.text
        html = {"q": f"<p>{sentences[0]}</p>", "source": "src", "target": "tgt", "format": "html"}
        assert c.post("/translate", json=html).json()["translatedText"] == "<p>FIXED.</p>"


def test_memory_export_as_a_corpus_and_tmx_and_import(tmp_path, capsys):
    from nanomt.cli import main
    from nanomt.core.config import SplitConfig
    from nanomt.serve.corrections import TranslationMemory
    from nanomt.serve.store import Layout
    from nanomt.training.data import check_split

    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    tm = TranslationMemory(store, Layout())
    tm.add("de-en", "Guten   Morgen.\t", "Good morning.")
    tm.add("de-en", "A < B & C", "A < B & C, too")
    store.close()
    main(["memory", "export", url, "--format", "tsv", "--out", str(tmp_path / "tm.tsv")])
    lines = sorted((tmp_path / "tm.tsv").read_text().splitlines())
    assert lines == ["A < B & C\tA < B & C, too", "Guten Morgen.\tGood morning."]
    check_split(SplitConfig(tsv=str(tmp_path / "tm.tsv")), "train")  # a corpus data.train takes
    main(["memory", "export", url, "--format", "tmx", "--out", str(tmp_path / "tm.tmx")])
    assert "A &lt; B &amp; C" in (tmp_path / "tm.tmx").read_text()
    other = f"sqlite:///{tmp_path}/other.db"
    open_store(other).close()
    main(["memory", "import", str(tmp_path / "tm.tmx"), "--store", other])
    store = open_store(other)
    again = TranslationMemory(store, Layout())
    found = again.find_many("de-en", [" Guten Morgen. ", "A < B & C", "nope"])
    assert found == ["Good morning.", "A < B & C, too", None]
    store.close()
    (tmp_path / "bad.tmx").write_text("<html/>")
    with pytest.raises(SystemExit):
        main(["memory", "import", str(tmp_path / "bad.tmx"), "--store", other])
    assert "bad.tmx: not a TMX file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["memory", "import", str(tmp_path / "none.tmx"), "--store", other])
    assert capsys.readouterr().err == f"nanomt: error: {tmp_path / 'none.tmx'}: file not found\n"


def test_every_backend_bounds_a_value_in_several_groups_and_deletes_and_counts(store):
    both = (("nanomt:group:one", 2), ("nanomt:group:all", 3))
    for i in range(3):
        store.put(f"nanomt:v:{i}", b"x", bounds=both)
    assert [k for k, _ in store.scan("nanomt:v:")] == ["nanomt:v:1", "nanomt:v:2"]  # the first group's bound
    store.put("nanomt:v:other", b"y", bounds=(("nanomt:group:two", 2), ("nanomt:group:all", 3)))
    assert store.count("nanomt:group:one") == 2 and store.count("nanomt:group:two") == 1
    assert store.delete("nanomt:v:1", ("nanomt:group:one", "nanomt:group:all")) is True
    assert store.delete("nanomt:v:1") is False and store.get("nanomt:v:1") is None
    assert store.count("nanomt:group:one") == 1
    assert [store.hit("nanomt:fail:x", 1, 60.0, count=False).allowed for _ in range(3)] == [True] * 3  # only looks


def test_two_deployments_on_one_redis_keep_apart(translator, sentences, redis_server, tmp_path):
    redis_server.flush()
    keys = tmp_path / "keys"
    keys.write_text(key_line("k", "k", req_limit=2, trusted=True) + "\n")

    def served(namespace: str) -> TestClient:
        store = open_store(redis_server.url)
        app = create_app(translator, store=store, store_namespace=namespace, keys_file=str(keys), suggestions=True)
        return TestClient(app, headers={"Authorization": "Bearer k"})

    fix = {"q": sentences[0], "s": "STAGING.", "source": "src", "target": "tgt"}
    with served("staging") as staging, served("production") as production:
        assert staging.post("/suggest", json=fix).json()["status"] == "served"
        assert staging.post("/translate", json={"text": [sentences[0]]}).json()["translations"] == ["STAGING."]
        res = production.post("/translate", json={"text": [sentences[0]]})  # its own window: the first of two
        assert res.status_code == 200 and res.json()["translations"] == translator.translate([sentences[0]])
        assert staging.post("/translate", json={"text": ["la."]}).status_code == 429
    import redis

    names = {k.decode().split(":", 1)[0] for k in redis.Redis.from_url(redis_server.url).keys("*")}
    assert names == {"staging", "production"}
    with pytest.raises(ValueError, match="store namespace 'a b'"):
        create_app(translator, store_namespace="a b")


def test_one_clients_uploads_never_push_out_anothers(translator, sentences):
    from nanomt.serve.file_routes import KEEP_PER_CLIENT

    app = create_app(translator, access_log=False)
    upload = {"file": ("a.txt", f"{sentences[0]}\n".encode())}
    with TestClient(app, client=("192.0.2.1", 1)) as other, TestClient(app, client=("192.0.2.2", 1)) as busy:
        post = lambda c: c.post("/translate_file", data={"source": "src", "target": "tgt"}, files=upload)  # noqa: E731
        kept = "/" + post(other).json()["translatedFileUrl"].split("/", 3)[3]
        mine = ["/" + post(busy).json()["translatedFileUrl"].split("/", 3)[3] for _ in range(KEEP_PER_CLIENT + 1)]
        assert other.get(kept).status_code == 200  # before: one global group of 32 for everyone
        assert busy.get(mine[0]).status_code == 404 and busy.get(mine[-1]).status_code == 200


def test_a_stores_secrets_are_hidden_and_its_url_can_come_from_the_environment(run_dir, tmp_path, monkeypatch):
    from nanomt.serve.store import redacted

    assert redacted("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redacted("redis://host:6379/0?password=s3cret&db=1") == "redis://host:6379/0?password=***&db=1"
    assert redacted("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"
    import uvicorn

    from nanomt.cli import main

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    monkeypatch.setenv("NANOMT_STORE", f"sqlite:///{tmp_path}/env.db")
    main(["serve", str(run_dir), "--no-access-log"])
    assert seen["app"].state.server.store.url == f"sqlite:///{tmp_path}/env.db"
