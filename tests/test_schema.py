"""Property-based tests of every endpoint from the OpenAPI schema the server publishes (schemathesis, in-process): no
server error, and no request the schema declares valid is refused as invalid."""

import json

import pytest
from conftest import tiny_config

from nanomt.core.config import config_from_dict
from nanomt.decoding.translate import Translator
from nanomt.training.train import train

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402

from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.schemas import CROSS_FIELD_RULES  # noqa: E402

MAX_EXAMPLES = 30  # per operation and mode: the whole file in well under a minute on a laptop CPU
REFUSED = (415, 422)  # what a server answers a request it takes for invalid


@pytest.fixture(scope="module")
def translator(toy_corpus, tmp_path_factory):
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10))
    return Translator.from_checkpoint(train(cfg, tmp_path_factory.mktemp("schema") / "run"))


def make_app(translator):
    # Small limits keep the fuzzed requests fast; past them the answer is the 413 the schema lists.
    return create_app(translator, max_sentences=4, max_chars=200, timeout=20.0, suggestions=True)


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(make_app(translator)) as c:  # the app's decoding worker runs for every example
        yield c


def send(client, case):
    """A generated case through the in-process client (httpx's keywords from schemathesis's requests' ones)."""
    kw = case.as_transport_kwargs(base_url="http://testserver")
    files = [(k, (name, v if isinstance(v, bytes) else str(v).encode())) for k, (name, v) in kw.get("files") or []]
    data = kw.get("data")
    content = json.dumps(kw["json"]).encode() if "json" in kw else data if isinstance(data, (bytes, str)) else None
    if kw.get("cookies"):
        client.cookies.update(kw["cookies"])
    return client.request(
        kw["method"], kw["url"], headers=kw["headers"], params=kw.get("params") or None, content=content,
        data=data if isinstance(data, dict) else None, files=files or None,
    )  # fmt: skip


# Every operation of the schema (the first test checks that the list is whole).
OPERATIONS = [
    ("POST", "/translate"), ("POST", "/attention"), ("GET", "/languages"), ("POST", "/detect"),
    ("POST", "/suggest"), ("GET", "/frontend/settings"), ("POST", "/translate_file"),
    ("GET", "/download_file/{name}"), ("GET", "/health"), ("GET", "/ready"),
]  # fmt: skip


@pytest.fixture(scope="module")
def api_schema(client):
    app = client.app
    # From the app's own schema (from_asgi would start and stop the app, and its decoding worker, to fetch it).
    loaded = schemathesis.openapi.from_dict(app.openapi())
    loaded.app, loaded.location = app, "/openapi.json"
    return loaded


def test_the_list_of_operations_is_the_schemas(api_schema):
    found = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


@pytest.mark.parametrize("method, path", OPERATIONS)
def test_every_endpoint_answers_what_its_schema_declares_valid(api_schema, client, method, path):
    operation, answered = api_schema[path][method], []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    def check(case):
        response = send(client, case)
        body, status = response.text, response.status_code
        answered.append(status)
        assert status < 500, f"{case.method} {case.path}: {status} {body}"
        if path == "/translate_file" and status == 415:  # a file type not translated: its name's suffix
            assert "unsupported file type" in body, body
            return
        if status == 422 and {e["type"] for e in response.json()["detail"]} <= set(CROSS_FIELD_RULES):
            return  # a rule across fields that the schema's description states (x-rules)
        assert status not in REFUSED, f"schema-valid request refused: {case.as_curl_command()}\n{body}"
        if status == 400:  # a language not served, text the model cannot take: never the form
            assert not response.json()["error"].startswith(("malformed", "invalid")), body

    check()
    # Random names are no file to download, no file type and no language pair served: those are refused.
    if path not in ("/download_file/{name}", "/translate_file", "/suggest"):
        assert any(status < 300 for status in answered), answered  # the examples reach the endpoint's work


def test_the_four_requests_the_fuzzer_found_refused_are_answered(client):
    assert client.post("/translate", json={"text": ["la nuka."], "beam_size": 1.0}).status_code == 200
    assert client.post("/translate", json={"text": ["la."], "beam_size": 1.5}).status_code == 422
    res = client.post("/detect", data={"api_key": "x"})
    assert res.status_code == 422 and "q" in res.json()["error"], res.text  # a form without q: invalid, not a 415
    res = client.post("/translate", json={"q": "la.", "source": "src", "target": ""})
    assert res.status_code == 422 and "target" in res.json()["error"], res.text  # declared: minLength 1
    res = client.post("/translate_file", data={"source": "", "target": ""}, files={"file": ("a.txt", b"la.")})
    assert res.status_code == 422 and "send a JSON body" not in res.text, res.text
