"""Request bodies bounded as they stream: a chunked body past the limit is a 413 before it is kept (the server's
memory stays flat), a file has its own limit (--file-limit, 10 MiB by default, as the page says), and uploads spooled
while a form is read are removed."""

import io
import os
import select
import socket
import time

import numpy as np
import pytest
from servers import rss_bytes, start_server_retrying, stop

pytest.importorskip("fastapi")
docx = pytest.importorskip("docx")
httpx = pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.decoding.translate import Translator  # noqa: E402
from nanomt.documents import files  # noqa: E402
from nanomt.serve import create_app  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402

LT = {"source": "src", "target": "tgt"}
MB = 2**20


@pytest.fixture(scope="module")
def run_dir(served_run):
    return served_run


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    proc, url, log = start_server_retrying(run_dir, tmp_path_factory.mktemp("bodies-server"), ["--no-access-log"])
    yield proc, url
    stop(proc)


def send_chunked(url: str, path: str, total: int, chunk: int = 256 * 1024) -> tuple[int | None, int]:
    """POST `total` bytes of a JSON-looking body with Transfer-Encoding: chunked, stopping when the server answers
    (or closes); the status it answered (None: no answer) and the bytes sent."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sock.sendall(head.encode())
    block, sent = b'{"text": ["' + b"a" * (chunk - 11), 0
    try:
        while sent < total:
            if select.select([sock], [], [], 0)[0]:
                break  # the server has answered before the body ended
            sock.sendall(f"{len(block):x}\r\n".encode() + block + b"\r\n")
            sent += len(block)
        else:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        answer = sock.recv(65536).decode("latin-1")
    except (ConnectionResetError, TimeoutError):
        answer = ""
    finally:
        sock.close()
    status = int(answer.split()[1]) if answer.startswith("HTTP/1.1") else None
    return status, sent


@pytest.mark.slow  # a real nanomt serve process
def test_a_chunked_body_past_the_limit_is_a_413_before_it_is_kept(server):
    proc, url = server
    httpx.post(f"{url}/translate", json={"text": ["la nuka."]}, timeout=30)  # the process at its working size
    before = rss_bytes(proc.pid)
    status, sent = send_chunked(url, "/translate", 40 * MB)
    grown = rss_bytes(proc.pid) - before
    assert status == 413, (status, sent)
    assert grown < 20 * MB, (sent, grown)  # read and dropped: before, 40 MB buffered (152 MB of RSS)
    # Said up front in Content-Length, it is refused before a byte of it is read.
    res = httpx.post(f"{url}/translate", content=b"x" * (2 * MB), headers={"content-type": "application/json"})
    assert res.status_code == 413 and "limit" in res.json()["error"]
    assert httpx.post(f"{url}/translate", json={"text": ["la nuka."]}, timeout=30).status_code == 200


@pytest.mark.slow  # a real nanomt serve process
def test_a_refused_body_is_read_to_its_end_so_the_answer_reaches_a_proxy(server):
    """As nginx sends it (HTTP/1.0, Connection: close, Content-Length): the whole body, then the answer is read. A
    server that closed at once, unread data left, reset the connection: nginx lost the 413 and said 502."""
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            body = b'{"text": ["' + b"a" * (2 * MB) + b'"]}'
            head = "POST /translate HTTP/1.0\r\nConnection: close\r\nContent-Type: application/json\r\n"
            sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def picture_docx(paragraphs: list[str], picture_bytes: int) -> bytes:
    """A Word file with these paragraphs and one picture of random pixels (which no zip compresses)."""
    from PIL import Image

    side = int((picture_bytes / 3) ** 0.5)
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG", compress_level=1)
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    document.add_picture(io.BytesIO(png.getvalue()))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_docx_near_the_file_limit_with_a_picture_translates(run_dir, lines):
    data = picture_docx(lines[:3], int(9.5 * MB))
    assert 9 * MB < len(data) < files.MAX_FILE_BYTES
    translator = Translator.from_checkpoint(run_dir)
    with TestClient(create_app(translator, access_log=False)) as client:
        before = open_files()
        res = client.post("/translate_file", data=LT, files={"file": ("report.docx", data)})
        assert res.status_code == 200, res.text  # a 413 before: the body limit was 6 x --max-chars + 64 KiB
        got = client.get("/" + res.json()["translatedFileUrl"].split("/", 3)[3])
        document = docx.Document(io.BytesIO(got.content))
        assert [p.text for p in document.paragraphs if p.text] == translator.translate(lines[:3])
        assert len(document.inline_shapes) == 1  # the picture kept
        assert open_files() <= before  # the spooled upload is gone
        res = client.post("/translate_file", data=LT, files={"file": ("big.docx", data + b"\0" * (MB))})
        assert res.status_code == 413 and "limit" in res.json()["error"], res.text
    with TestClient(create_app(translator, access_log=False, file_limit=MB)) as client:
        res = client.post("/translate_file", data=LT, files={"file": ("report.docx", data)})
        assert res.status_code == 413 and f"{MB + 65_536:,}" in res.json()["error"], res.text


def test_a_file_form_is_read_by_hand_and_refused_in_the_api_shape(run_dir, lines):
    with TestClient(create_app(Translator.from_checkpoint(run_dir), access_log=False)) as client:
        res = client.post("/translate_file", data=LT)
        assert res.status_code == 422 and "file" in res.json()["error"], res.text
        res = client.post("/translate_file", data={**LT, "file": "not a file"})
        assert res.status_code == 422 and "a file is expected" in res.json()["error"], res.text
        res = client.post("/translate_file", data={"source": "src"}, files={"file": ("a.txt", b"la.")})
        assert res.status_code == 422 and "target" in res.json()["error"], res.text
        res = client.post("/translate_file", json={"source": "src", "target": "tgt"})
        assert res.status_code == 415 and "multipart/form-data" in res.json()["error"], res.text
        start = time.monotonic()
        res = client.post("/translate_file", data=LT, files={"file": ("a.txt", f"{lines[0]}\n".encode())})
        assert res.status_code == 200 and time.monotonic() - start < 30, res.text


def test_the_page_states_the_servers_file_limit(run_dir):
    translator = Translator.from_checkpoint(run_dir)
    for limit in (None, MB):
        with TestClient(create_app(translator, access_log=False, file_limit=limit)) as client:
            page = client.get("/").text
            assert f'data-max-file-bytes="{limit or files.MAX_FILE_BYTES}"' in page


def test_a_wrong_header_key_is_refused_before_the_upload_is_spooled(run_dir, tmp_path, monkeypatch):
    from starlette.requests import Request

    keys = tmp_path / "keys"
    keys.write_text(key_line("right", "someone") + "\n")
    forms, form = [], Request.form
    monkeypatch.setattr(Request, "form", lambda self, **kw: forms.append(kw) or form(self, **kw))
    upload = {"file": ("a.txt", b"la nuka.\n" * 400_000)}  # 3.6 MB: spooled to disk, were the form read
    with TestClient(create_app(Translator.from_checkpoint(run_dir), keys_file=str(keys), access_log=False)) as c:
        res = c.post("/translate_file", data=LT, files=upload, headers={"Authorization": "Bearer wrong"})
        assert res.status_code == 403 and forms == [], res.text  # before: the form was read, then the key checked
        res = c.post("/translate_file", data=LT, files={"file": ("a.txt", b"la.")}, headers={"X-API-Key": "right"})
        assert res.status_code == 200 and len(forms) == 1, res.text
        res = c.post("/translate_file", data={**LT, "api_key": "right"}, files={"file": ("a.txt", b"la.")})
        assert res.status_code == 200, res.text  # a key in the form: read with it, then checked
