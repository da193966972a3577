"""The sentence cache's key: unambiguous (a text holding NUL or a separator reads as no other request), and every
thing a translation depends on separates entries (glossary, prefix, beam, the shortlist's table, int8), each seen on
the miss counter; with --cache-per-key each client has a cache of its own."""

import shutil

import pytest
from servers import metric

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from nanomt.decoding import shortlist as sl  # noqa: E402
from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.serve import ModelSet, ModelSpec, create_app  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402
from nanomt.serve.store import open_store  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(served_run):
    return served_run


def counter(client, name: str) -> float:
    return metric(client.get("/metrics").text, f"nanomt_cache_{name}_total")


def misses_of(client, body: dict) -> tuple[list[str], float]:
    """The translations of a request and the cache misses it added."""
    before = counter(client, "misses")
    res = client.post("/translate", json=body)
    assert res.status_code == 200, res.text
    return res.json()["translations"], counter(client, "misses") - before


def test_a_text_holding_nul_and_the_separators_never_reads_as_another_request(run_dir, lines, toy_corpus):
    translator = Translator.from_checkpoint(run_dir)
    prefix = toy_corpus["test.tgt"].read_text().split()[0]
    planted = f"{lines[0]}\0prefix\0{prefix}"
    with TestClient(create_app(translator, access_log=False)) as client:
        client.post("/translate", json={"text": [planted]})  # before: its key was the prefixed request's
        got, missed = misses_of(client, {"text": [lines[0]], "prefix": [prefix]})
        assert missed == 1 and got == translator.translate([lines[0]], prefixes=[prefix])
        assert got[0].startswith(prefix)


def test_every_setting_a_translation_depends_on_is_its_own_entry(run_dir, lines, toy_corpus):
    translator = Translator.from_checkpoint(run_dir)
    word = toy_corpus["test.tgt"].read_text().split()[1]  # a target word the vocabulary can write
    text, glossary = lines[1], [[lines[1].split()[0], word]]
    with TestClient(create_app(translator, access_log=False)) as client:
        assert misses_of(client, {"text": [text], "beam_size": 2})[1] == 1
        assert misses_of(client, {"text": [text], "beam_size": 2})[1] == 0  # the same request: a hit
        for other in ({"beam_size": 1}, {"glossary": glossary}, {"prefix": [word]}):
            assert misses_of(client, {"text": [text], **other})[1] == 1, other  # before: beam 1 was not checked


def with_shortlist(run_dir, where, frequent: int):
    """A copy of the run (without its checkpoints) with a shortlist allowing `frequent` ids in every batch."""
    copy = shutil.copytree(run_dir, where, ignore=shutil.ignore_patterns("checkpoints"))
    tokenizer = Translator.from_checkpoint(copy).tokenizer.fingerprint()
    sl.Shortlist({}, tuple(range(4, 4 + frequent)), tokenizer).save(copy)
    return copy


def test_a_rebuilt_shortlist_and_int8_are_other_entries_of_a_store_that_outlives_the_server(run_dir, lines, tmp_path):
    url, text = f"sqlite:///{tmp_path}/store.db", {"text": [lines[2]], "shortlist": True}
    run = with_shortlist(run_dir, tmp_path / "run", 60)

    def served(int8: bool = False):
        models = ModelSet.read([ModelSpec(str(run), "src", "tgt")], "en", None, "cpu", int8)
        return TestClient(create_app(models, store=open_store(url), access_log=False))

    with served() as client:
        assert misses_of(client, text)[1] == 1
    with served() as client:  # after a restart: the store remembers
        assert misses_of(client, text)[1] == 0
    sl.Shortlist({}, tuple(range(4, 30)), Translator.from_checkpoint(run).tokenizer.fingerprint()).save(run)
    with served() as client:  # the same weights, another table: before, the old table's entry was served
        got, missed = misses_of(client, text)
        assert missed == 1 and got == Translator.from_checkpoint(run).translate(text["text"], shortlist=True)
    with served(int8=True) as client:
        assert misses_of(client, text)[1] == 1


def test_with_cache_per_key_no_client_can_tell_what_another_translated(run_dir, lines, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line("key-a", "a") + "\n" + key_line("key-b", "b") + "\n")
    translator = Translator.from_checkpoint(run_dir)
    body = {"text": [lines[3]]}
    with TestClient(create_app(translator, keys_file=str(keys), cache_per_key=True, access_log=False)) as client:
        as_key = lambda key: {**body, "api_key": key}  # noqa: E731
        assert misses_of(client, as_key("key-a"))[1] == 1
        assert misses_of(client, as_key("key-b"))[1] == 1  # b's own cache: a's sentence is no hit for b
        assert misses_of(client, as_key("key-a"))[1] == 0
    with TestClient(create_app(translator, keys_file=str(keys), access_log=False)) as client:
        assert misses_of(client, {**body, "api_key": "key-a"})[1] == 1
        assert misses_of(client, {**body, "api_key": "key-b"})[1] == 0  # one cache for all, by default
