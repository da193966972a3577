"""Property-based tests of every endpoint from the OpenAPI schema the server publishes (schemathesis, in-process): no
server error, every answer as the schema declares it (status, content type, headers, body), no request the schema
declares valid refused as invalid, and every request it declares invalid refused."""

import json

import pytest
from conftest import tiny_config

from nanomt.decoding.translate import Translator

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402

from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.schemas import CROSS_FIELD_RULES  # noqa: E402

MAX_EXAMPLES = 30  # per operation and mode: the whole file in well under a minute on a laptop CPU
REFUSED = (415, 422)  # what a server answers a request it takes for invalid


@pytest.fixture(scope="module")
def translator(toy_corpus, trained):
    return Translator.from_checkpoint(trained(tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10)))


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
    ("POST", "/file_jobs"), ("GET", "/file_jobs/{job_id}"), ("DELETE", "/file_jobs/{job_id}"),
]  # fmt: skip


# What refuses a request the schema declares invalid: schemathesis' statuses, and 413, a request past the server's
# limits (its texts, its characters), which it checks before the rest, as LibreTranslate does (nine texts to a target
# not served are refused for their number).
REFUSALS = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "406", "409",
                                                                  "413", "415", "422", "428", "429", "5xx"]}}}
)  # fmt: skip


@pytest.fixture(scope="module")
def api_schema(client):
    app = client.app
    # From the app's own schema (from_asgi would start and stop the app, and its decoding worker, to fetch it).
    loaded = schemathesis.openapi.from_dict(app.openapi(), config=REFUSALS)
    loaded.app, loaded.location = app, "/openapi.json"
    return loaded


def test_the_list_of_operations_is_the_schemas(api_schema):
    found = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


# What every answer is checked for: no server error, a status code, content type, headers and body the schema
# declares for it; a request the schema declares invalid is refused (negative examples).
CONFORMS = [
    checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
    checks.response_headers_conformance, checks.response_schema_conformance,
]  # fmt: skip
WITH_INPUT = [op for op in OPERATIONS if op[0] == "POST"]  # the others have nothing a negative example can break


def accepted(case, response, path: str) -> None:
    """A schema-valid request is not refused as invalid, but for the rules the schema states in words."""
    body, status = response.text, response.status_code
    if (
        path in ("/translate_file", "/file_jobs") and status == 415
    ):  # a file whose name's suffix, or whose bytes, it cannot read
        assert "unsupported file type" in body or "not UTF-8" in body or "not a valid" in body, body
        return
    if status == 422 and {e["type"] for e in response.json()["detail"]} <= set(CROSS_FIELD_RULES):
        return  # a rule across fields that the schema's description states (x-rules)
    assert status not in REFUSED, f"schema-valid request refused: {case.as_curl_command()}\n{body}"
    if status == 400:  # a pair not served, text the model cannot take: never the form
        assert not response.json()["error"].startswith(("malformed", "invalid")), body


def explicit(api_schema, client, path: str) -> list:
    """Requests valid for the schema that chance would not find, as (case, response): a text file to translate, and
    a translated file's name to download."""
    if path == "/translate_file":
        res = client.post("/translate_file", data={"source": "src", "target": "tgt"}, files={"file": ("a.txt", b"la.")})
        return [(api_schema[path]["POST"].Case(media_type="multipart/form-data", body={}), res)]
    if path == "/file_jobs":
        res = client.post("/file_jobs", data={"source": "src", "target": "tgt"}, files={"file": ("a.txt", b"la.")})
        return [(api_schema[path]["POST"].Case(media_type="multipart/form-data", body={}), res)]
    if path == "/file_jobs/{job_id}":
        job = client.post("/file_jobs", data={"source": "src", "target": "tgt"}, files={"file": ("c.txt", b"la.")})
        job_id = job.json()["id"]
        return [(api_schema[path]["GET"].Case(path_parameters={"job_id": job_id}), client.get(f"/file_jobs/{job_id}"))]
    if path == "/download_file/{name}":
        kept = client.post("/translate_file", data={"source": "src", "target": "tgt"}, files={"file": ("b", b"la.")})
        name = kept.json()["translatedFileUrl"].rsplit("/", 1)[1]
        return [(api_schema[path]["GET"].Case(path_parameters={"name": name}), client.get(f"/download_file/{name}"))]
    return []


@pytest.mark.parametrize("method, path", OPERATIONS)
def test_every_endpoint_answers_what_its_schema_declares_valid(api_schema, client, method, path):
    operation, answered = api_schema[path][method], []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    def check(case):
        response = send(client, case)
        answered.append(response.status_code)
        case.validate_response(response, checks=CONFORMS)
        accepted(case, response, path)

    check()
    for case, response in explicit(api_schema, client, path):
        answered.append(response.status_code)
        case.validate_response(response, checks=CONFORMS)
    assert any(status < 300 for status in answered), answered  # the examples reach the endpoint's work


@pytest.mark.parametrize("method, path", WITH_INPUT)
def test_every_endpoint_refuses_what_its_schema_declares_invalid(api_schema, client, method, path):
    operation, answered = api_schema[path][method], []

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(case=operation.as_strategy(GenerationMode.NEGATIVE))
    def check(case):
        response = send(client, case)
        answered.append(response.status_code)
        case.validate_response(response, checks=[*CONFORMS, checks.negative_data_rejection])

    check()
    # Each example the check found schema-violating was refused; some become valid once serialized (a form's
    # fields are text), so not every answer need be a 4xx, but the examples reach the refusals.
    assert any(400 <= status < 500 for status in answered), answered


def test_the_schema_names_the_served_languages_the_keys_and_every_error(api_schema, client):
    schema = client.app.openapi()
    libre = schema["components"]["schemas"]["LibreTranslateRequest"]["properties"]
    assert libre["source"]["enum"] == ["src", "auto"] and libre["target"]["enum"] == ["tgt"]
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKeyHeader"}
    translate = schema["paths"]["/translate"]["post"]
    assert {"bearer": []} in translate["security"] and {} in translate["security"]  # no key required here
    assert translate["responses"]["429"]["headers"]["Retry-After"]
    assert schema["paths"]["/suggest"]["post"]["responses"]["507"]


def test_the_four_requests_the_fuzzer_found_refused_are_answered(client):
    assert client.post("/translate", json={"text": ["la nuka."], "beam_size": 1.0}).status_code == 200
    assert client.post("/translate", json={"text": ["la."], "beam_size": 1.5}).status_code == 422
    res = client.post("/detect", data={"api_key": "x"})
    assert res.status_code == 422 and "q" in res.json()["error"], res.text  # a form without q: invalid, not a 415
    res = client.post("/translate", json={"q": "la.", "source": "src", "target": ""})
    assert res.status_code == 422 and "target" in res.json()["error"], res.text  # declared: minLength 1
    res = client.post("/translate_file", data={"source": "", "target": ""}, files={"file": ("a.txt", b"la.")})
    assert res.status_code == 422 and "send a JSON body" not in res.text, res.text
