"""Documents on the server: LibreTranslate's paragraphs, HTML, alternatives and files; nanomt's split, scores, cut."""

import io

import pytest
from conftest import tiny_config

from nanomt.decoding.translate import Translator
from nanomt.documents import translation as dt

SERVE_EXTRA = "nanomt serve needs FastAPI, uvicorn, prometheus_client, python-multipart; these tests httpx"
pytest.importorskip("fastapi", reason=SERVE_EXTRA)
pytest.importorskip("httpx", reason=SERVE_EXTRA)
pytest.importorskip("multipart", reason=SERVE_EXTRA)

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.documents import files, formats  # noqa: E402
from nanomt.serve import create_app  # noqa: E402

LT = {"source": "src", "target": "tgt"}


@pytest.fixture(scope="module")
def translator(toy_corpus, trained):
    return Translator.from_checkpoint(trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60)))


@pytest.fixture(scope="module")
def lines(toy_corpus):
    return toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:40]


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(create_app(translator, max_chars=200_000)) as c:
        yield c


def test_libretranslate_splits_paragraphs_and_keeps_their_shape(client, translator, lines):
    text = f"{lines[0]} {lines[1]}\n\n  {lines[2]}\n"
    res = client.post("/translate", json={"q": text, **LT})
    t0, t1, t2 = translator.translate(lines[:3])
    assert res.status_code == 200 and res.json() == {"translatedText": f"{t0} {t1}\n\n  {t2}\n"}
    # URLs and emojis come back byte-identical, and an emoji ends no sentence
    text = f"{lines[3]} 🙂 https://example.org/x?a=1&b=2 {lines[4]}"
    out = client.post("/translate", json={"q": text, **LT}).json()["translatedText"]
    assert "🙂 https://example.org/x?a=1&b=2 " in out


def test_libretranslate_alternatives(client, translator, lines):
    res = client.post("/translate", json={"q": lines[5], "alternatives": 2, **LT}).json()
    best = translator.translate([lines[5]])[0]
    assert res["translatedText"] == best
    assert 1 <= len(res["alternatives"]) <= 2 and best not in res["alternatives"]
    listed = client.post("/translate", json={"q": lines[5:7], "alternatives": 1, **LT}).json()
    assert [len(a) for a in listed["alternatives"]] == [1, 1]
    assert "alternatives" not in client.post("/translate", json={"q": lines[5], **LT}).json()
    assert client.post("/translate", json={"q": lines[5], "alternatives": 4, **LT}).status_code == 422


def test_libretranslate_html_tags_go_around_the_aligned_words(client, translator, lines):
    words = lines[7].split()
    doc = f'<div><p>{words[0]} <b class="x">{" ".join(words[1:])}</b></p><code>{lines[8]}</code></div>'
    out = client.post("/translate", json={"q": doc, "format": "html", **LT}).json()["translatedText"]
    assert out.startswith("<div><p>") and out.endswith(f"</p><code>{lines[8]}</code></div>")
    assert out.count('<b class="x">') == 1 and out.count("</b>") == 1
    align, n_best, source = dt.for_translator(translator)
    assert out == dt.html([doc], align, n_best, source)[0]


def test_nanomt_api_split_scores_and_cut(client, translator, lines):
    res = client.post("/translate", json={"text": [f"{lines[0]} {lines[1]}"], "split": True, "scores": True}).json()
    assert res["translations"] == [" ".join(translator.translate(lines[:2]))]
    [(_, s0)], [(_, s1)] = translator.translate_n_best(lines[:2])
    assert res["scores"] == [pytest.approx(s0 + s1, abs=1e-3)]
    long = ", ".join(line.rstrip(".") for line in lines * 3) + "."
    assert translator.count_tokens([long])[0] > 63
    res = client.post("/translate", json={"text": [lines[0], long]}).json()
    assert res["cut"] == [1] and res["translations"][1] == translator.translate([long])[0]
    assert client.post("/translate", json={"text": [lines[0]]}).json().get("cut") is None
    bad = client.post("/translate", json={"text": [lines[0]], "split": True, "prefix": ["x"]})
    assert bad.status_code == 422 and "split" in bad.json()["error"]


def word_file(text: str) -> bytes:
    docx = pytest.importorskip("docx")
    doc = docx.Document()
    doc.add_paragraph(text)
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


@pytest.mark.parametrize("suffix", [".txt", ".html", ".md", ".srt", ".docx"])
def test_translate_file_round_trips(client, translator, lines, suffix):
    text = f"{lines[9]} {lines[10]}"
    data = {
        ".txt": f"{text}\n\n{lines[11]}\n".encode(),
        ".html": f"<p>{text}</p>".encode(),
        ".md": f"# {lines[11]}\n\n{text}\n".encode(),
        ".srt": f"1\n00:00:01,000 --> 00:00:02,000\n{text}\n\n".encode(),
        ".docx": word_file(text) if suffix == ".docx" else b"",
    }[suffix]
    res = client.post("/translate_file", data=LT, files={"file": (f"doc{suffix}", data)})
    assert res.status_code == 200, res.text
    url = res.json()["translatedFileUrl"]
    assert url.startswith("http") and url.endswith(f"doc{suffix}")
    got = client.get(url)
    assert got.status_code == 200 and got.headers["content-type"].startswith(
        formats.MEDIA_TYPES[formats.FORMATS[suffix]].split(";")[0]
    )
    t9, t10 = translator.translate(lines[9:11])
    if suffix == ".docx":
        import docx

        assert docx.Document(io.BytesIO(got.content)).paragraphs[0].text == f"{t9} {t10}"
    else:
        assert f"{t9} {t10}" in got.content.decode()


def test_translate_file_errors(client, lines, monkeypatch):
    post = lambda name, data, **form: client.post(  # noqa: E731
        "/translate_file", data={**LT, **form}, files={"file": (name, data)}
    )
    assert post("a.pdf", b"%PDF").status_code == 415
    assert post("a.docx", b"not a zip").status_code == 415
    assert "error" in post("a.docx", b"not a zip").json()
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 10)
    assert post("a.txt", b"x" * 11).status_code == 413
    monkeypatch.undo()
    assert post("a.txt", b"").status_code == 200  # an empty document gives an empty document
    assert post("a.txt", lines[0].encode(), source="xx").status_code == 400
    assert client.get("/download_file/nothing.txt").status_code == 404
    assert client.get("/frontend/settings").json()["filesTranslation"] is True
