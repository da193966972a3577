"""nanomt's file jobs (POST /file_jobs, GET and DELETE /file_jobs/{id}): a document of 2,000 sentences reports its
progress up to 100% from another replica sharing the store and downloads the bytes of /translate_file; a cancel on
another replica stops the decoding at the next chunk and frees the files pool's thread; a job is its key's; the
bounds on jobs; a long document outlives --timeout as a job; a job whose replica was killed reads failed on the others,
one that waits on a live replica does not."""

import signal
import threading
import time

import pytest
from conftest import tiny_config
from servers import start_server_retrying

from nanomt.decoding.translate import Translator

SERVE_EXTRA = "nanomt serve needs FastAPI, uvicorn, prometheus_client, python-multipart; these tests httpx"
pytest.importorskip("fastapi", reason=SERVE_EXTRA)
pytest.importorskip("httpx", reason=SERVE_EXTRA)
pytest.importorskip("multipart", reason=SERVE_EXTRA)

from fastapi.testclient import TestClient  # noqa: E402

from nanomt.documents import files  # noqa: E402
from nanomt.serve import create_app, file_jobs  # noqa: E402
from nanomt.serve.keys import key_line  # noqa: E402
from nanomt.serve.store import open_store  # noqa: E402

LT = {"source": "src", "target": "tgt"}
ENDED = ("done", "failed", "cancelled")


@pytest.fixture(scope="module")
def translator(toy_corpus, trained):
    return Translator.from_checkpoint(trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60)))


@pytest.fixture(scope="module")
def document(toy_corpus) -> bytes:
    """A plain-text document of 2,000 sentences, one a line."""
    lines = toy_corpus["train.src"].read_text(encoding="utf-8").splitlines()[:2000]
    assert len(lines) == 2000
    return ("\n".join(lines) + "\n").encode()


class Gate:
    """The decoding worker's batches counted, and held (from the `hold_from`-th on) until the gate opens."""

    def __init__(self, app, hold_from: int = 1 << 30, delay: float = 0.0):
        self.engine, self.calls, self.hold_from, self.delay = app.state.engine, 0, hold_from, delay
        self.opened, self.waiting = threading.Event(), threading.Event()
        run = self.engine.run

        def gated(key, items):
            self.calls += 1
            if self.calls >= self.hold_from:
                self.waiting.set()
                assert self.opened.wait(30), "the gate was never opened"
            time.sleep(self.delay)
            return run(key, items)

        self.engine.run = gated

    def open(self) -> None:
        self.opened.set()


def wait_for(condition, timeout: float = 30.0, every: float = 0.01):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return found


def post_job(client, data: bytes, name: str = "doc.txt", **headers):
    return client.post("/file_jobs", data=LT, files={"file": (name, data)}, headers=headers)


def ended(client, job_id: str, seen: list | None = None, **headers) -> dict:
    """The job once it has ended, polled (each answer kept in `seen`)."""

    def status():
        res = client.get(f"/file_jobs/{job_id}", headers=headers)
        assert res.status_code == 200, res.text
        if seen is not None:
            seen.append(res.json())
        return res.json() if res.json()["status"] in ENDED else None

    return wait_for(status)


def synchronous(client, data: bytes, name: str = "doc.txt") -> bytes:
    res = client.post("/translate_file", data=LT, files={"file": (name, data)})
    assert res.status_code == 200, res.text
    return client.get(res.json()["translatedFileUrl"]).content


@pytest.mark.slow  # 4,000 sentences decoded
def test_a_job_reports_rising_progress_from_any_replica_and_downloads_the_synchronous_bytes(
    translator, document, tmp_path, monkeypatch
):
    monkeypatch.setattr(file_jobs, "WRITE_EVERY", 0.02)
    url = f"sqlite:///{tmp_path}/store.db"
    runs, reads = create_app(translator, store=open_store(url)), create_app(translator, store=open_store(url))
    Gate(runs, delay=0.005)  # a batch takes a few milliseconds more: progress is seen between the chunks
    with TestClient(runs) as a, TestClient(reads) as b:
        res = post_job(a, document)
        assert res.status_code == 202, res.text
        job = res.json()
        assert job["status"] == "queued" and job["filename"] == "doc.txt" and len(job["id"]) == 32
        seen = []
        done = ended(b, job["id"], seen)  # the other replica answers the progress, from the store
        assert done["status"] == "done", done
        assert done["sentences_done"] == done["sentences_total"] >= 2000  # 100%
        counts = [s["sentences_done"] for s in seen]
        assert counts == sorted(counts)  # never goes back
        assert any(s["status"] == "running" and 0 < s["sentences_done"] < s["sentences_total"] for s in seen), seen
        assert all(s["sentences_done"] <= s["sentences_total"] for s in seen)
        assert done["translatedFileUrl"].startswith("http://testserver/download_file/")
        assert b.get(done["translatedFileUrl"]).content == synchronous(a, document)


def test_a_cancelled_job_stops_decoding_and_frees_its_worker(translator, document, tmp_path, monkeypatch):
    monkeypatch.setattr(file_jobs, "CHECK_EVERY", 0.02)
    url = f"sqlite:///{tmp_path}/store.db"
    runs, cancels = create_app(translator, store=open_store(url)), create_app(translator, store=open_store(url))
    gate = Gate(runs, hold_from=3)
    jobs, pool = runs.state.file_jobs, runs.state.server.pools.files
    with TestClient(runs) as a, TestClient(cancels) as b:
        job_id = post_job(a, document).json()["id"]
        assert gate.waiting.wait(30)  # the job's third chunk is being decoded
        assert b.get(f"/file_jobs/{job_id}").json()["status"] == "running"
        res = b.delete(f"/file_jobs/{job_id}")  # on the other replica: the flag in the store
        assert res.status_code == 200 and res.json()["status"] == "running", res.text  # until the chunk ends
        wait_for(lambda: jobs.jobs[job_id].stop.is_set())  # the running replica read the flag
        gate.open()
        cancelled = ended(b, job_id)
        assert cancelled["status"] == "cancelled" and "translatedFileUrl" not in cancelled
        assert cancelled["sentences_done"] == 3 * files.CHUNK < cancelled["sentences_total"]
        calls = gate.calls
        assert calls == 3  # the chunk in flight was the last one decoded
        time.sleep(0.2)
        assert gate.calls == calls  # and nothing more is
        assert pool.tasks() == 0 and jobs.running == 0 and not jobs.jobs  # its thread is free again
        assert b.delete(f"/file_jobs/{job_id}").json()["status"] == "cancelled"  # an ended job stays as it is
        # The pool takes the next file, synchronous or a job.
        small = document[: document.index(b"\n", 2000) + 1]
        assert synchronous(a, small)
        again = post_job(a, small).json()["id"]
        assert ended(a, again)["status"] == "done"


def test_a_queued_job_cancelled_never_starts_and_jobs_are_bounded(translator, document, monkeypatch):
    monkeypatch.setattr(file_jobs, "JOBS_PER_CLIENT", 2)
    monkeypatch.setattr(file_jobs, "JOBS_QUEUED", 3)
    app = create_app(translator)
    gate = Gate(app, hold_from=1)
    part = b"".join(document.splitlines(keepends=True)[:300])  # 5 chunks
    with TestClient(app) as c:
        running = post_job(c, part).json()["id"]
        assert gate.waiting.wait(30)
        queued = post_job(c, part).json()["id"]  # one job runs at a time: the files pool has two threads
        assert c.get(f"/file_jobs/{queued}").json()["status"] == "queued"
        res = post_job(c, part)
        assert res.status_code == 429 and res.headers["retry-after"], res.text
        assert res.json()["error"].startswith("2 file jobs of this address are queued or running; the limit is 2")
        monkeypatch.setattr(file_jobs, "JOBS_QUEUED", 2)
        res = post_job(c, part)
        assert res.status_code == 503 and res.headers["retry-after"] and "file jobs" in res.json()["error"], res.text
        res = c.delete(f"/file_jobs/{queued}")
        assert res.status_code == 200 and res.json()["status"] == "cancelled"
        assert c.get(f"/file_jobs/{queued}").json()["status"] == "cancelled"
        gate.open()
        assert ended(c, running)["status"] == "done"
        assert gate.calls == 5  # one batch a chunk of the first job's, none of the second's


def held_replicas(translator, document: bytes, tmp_path, monkeypatch):
    """Two replicas on one SQLite store, a heartbeat of 0.05 s and a stale bound of 0.5 s; the running one's second
    batch held at a gate; a part of the document of 300 sentences (5 chunks)."""
    monkeypatch.setattr(file_jobs, "HEARTBEAT", 0.05)
    monkeypatch.setattr(file_jobs, "STALE", 0.5)
    url = f"sqlite:///{tmp_path}/store.db"
    runs, reads = create_app(translator, store=open_store(url)), create_app(translator, store=open_store(url))
    return runs, reads, Gate(runs, hold_from=2), b"".join(document.splitlines(keepends=True)[:300])


def test_a_job_waiting_on_a_live_replica_is_kept_alive_past_stale(translator, document, tmp_path, monkeypatch):
    """Neither a chunk that takes long nor a place in the queue reads as a stopped replica on another one."""
    runs, reads, gate, part = held_replicas(translator, document, tmp_path, monkeypatch)
    with TestClient(runs) as a, TestClient(reads) as b:
        running = post_job(a, part).json()["id"]
        assert gate.waiting.wait(30)  # its second chunk held: no progress from here on
        queued = post_job(a, part).json()["id"]  # one job runs at a time
        time.sleep(1.5)  # three times STALE
        for job_id, status in ((running, "running"), (queued, "queued")):
            res = b.get(f"/file_jobs/{job_id}")
            assert res.status_code == 200 and res.json()["status"] == status, res.text
        gate.open()
        assert ended(b, running)["status"] == ended(b, queued)["status"] == "done"


def test_a_jobs_end_missed_by_a_store_outage_is_written_once_the_store_is_back(
    translator, document, tmp_path, monkeypatch
):
    """A job that ends while its replica cannot reach the store is not left running (nor read as a stopped replica's):
    the replica writes its end once the store answers again."""
    runs, reads, gate, part = held_replicas(translator, document, tmp_path, monkeypatch)
    cannot_keep = "the translated file cannot be kept: the store is unreachable"
    with TestClient(runs) as a, TestClient(reads) as b:
        job_id = post_job(a, part).json()["id"]
        assert gate.waiting.wait(30)
        store = runs.state.server.store
        store.down = True  # the running replica's breaker open: nothing it writes reaches the store
        gate.open()
        wait_for(lambda: job_id not in runs.state.file_jobs.jobs)  # ended, its end unwritten
        time.sleep(1.0)  # twice STALE
        store.down = False

        def written():
            job = b.get(f"/file_jobs/{job_id}").json()
            return job if job["status"] == "failed" and job["error"] == cannot_keep else None

        assert wait_for(written, timeout=10)["error_code"] == 503
        assert a.get(f"/file_jobs/{job_id}").json()["error"] == cannot_keep


@pytest.mark.slow
def test_a_killed_replicas_job_reads_failed_on_the_others(
    translator, toy_corpus, trained, document, tmp_path, monkeypatch
):
    """A replica killed mid-job never writes its end: the others answer the job failed once STALE has passed since
    its last write, where the record would read running (or queued) until the store dropped it an hour later."""
    import httpx

    url = f"sqlite:///{tmp_path}/store.db"
    run = trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))
    proc, base, log = start_server_retrying(run, tmp_path, ["--store", url, "--no-access-log"])
    try:
        res = httpx.post(f"{base}/file_jobs", data=LT, files={"file": ("doc.txt", document * 10)}, timeout=60)
        assert res.status_code == 202, res.text
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    job_id = res.json()["id"]
    with TestClient(create_app(translator, store=open_store(url))) as b:
        found = b.get(f"/file_jobs/{job_id}").json()
        assert found["status"] in ("queued", "running"), (found, log.read_text())  # killed before its end
        monkeypatch.setattr(file_jobs, "STALE", 1.0)  # the reader's bound (a minute by default)
        failed = ended(b, job_id)
        assert failed["status"] == "failed" and failed["error_code"] == 503, failed
        assert failed["error"] == "the replica running the job stopped before it ended (no word from it in 1 s)"
        assert b.delete(f"/file_jobs/{job_id}").json()["status"] == "failed"  # an ended job stays as it is


def test_a_job_is_its_keys_own(translator, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(key_line("alice-key", "alice") + "\n" + key_line("bob-key", "bob") + "\n")
    alice, bob = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
    with TestClient(create_app(translator, keys_file=str(keys))) as c:
        assert post_job(c, b"la nuka korat.\n").status_code == 403
        job_id = post_job(c, b"la nuka korat.\n", **alice).json()["id"]
        assert ended(c, job_id, **alice)["status"] == "done"
        for headers in (bob, {}, {"Authorization": "Bearer wrong"}):
            assert c.get(f"/file_jobs/{job_id}", headers=headers).status_code == 404
            assert c.delete(f"/file_jobs/{job_id}", headers=headers).status_code == 404
        res = c.get("/file_jobs/not-an-id", headers=alice)
        assert res.status_code == 404 and "no such file job" in res.json()["error"]


def test_jobs_are_a_503_while_the_store_is_unreachable(translator):
    app = create_app(translator)
    with TestClient(app) as c:
        job_id = post_job(c, b"la nuka korat.\n").json()["id"]
        assert ended(c, job_id)["status"] == "done"
        app.state.server.store.down = True  # the breaker open
        for res in (c.get(f"/file_jobs/{job_id}"), c.delete(f"/file_jobs/{job_id}"), post_job(c, b"la.\n")):
            assert res.status_code == 503 and res.headers["retry-after"] and "store" in res.json()["error"], res.text
        app.state.server.store.down = False
        assert c.get(f"/file_jobs/{job_id}").json()["status"] == "done"


def test_a_file_that_cannot_be_translated_fails_its_job_as_the_synchronous_call_refuses_it(translator):
    with TestClient(create_app(translator)) as c:
        assert post_job(c, b"%PDF", "a.xyz").status_code == 415  # refused at once, as /translate_file does
        assert c.post("/file_jobs", data={**LT, "source": "auto"}, files={"file": ("a.txt", b"x")}).status_code == 400
        assert c.post("/file_jobs", data={**LT, "target": "xx"}, files={"file": ("a.txt", b"x")}).status_code == 400
        job_id = post_job(c, b"not a zip archive", "broken.docx").json()["id"]
        failed = ended(c, job_id)
        assert failed["status"] == "failed" and failed["error_code"] == 415, failed
        assert failed["error"].startswith("broken.docx: ") and "\n" not in failed["error"]
        sync = c.post("/translate_file", data=LT, files={"file": ("broken.docx", b"not a zip archive")})
        assert (sync.status_code, sync.json()["error"]) == (415, failed["error"])
        assert post_job(c, b"").status_code == 202  # an empty document: an empty file, as /translate_file's


@pytest.mark.slow  # 2,000 sentences decoded
def test_a_long_document_outlives_the_request_timeout_as_a_job(translator, document):
    """What /translate_file cannot do within --timeout, a job does: no request waits for it."""
    app = create_app(translator, timeout=0.3, max_chars=1000)  # the body's bound is the file's, not --max-chars'
    with TestClient(app) as c:
        res = c.post("/translate_file", data=LT, files={"file": ("doc.txt", document)})
        assert res.status_code == 504, res.text
        res = post_job(c, document)
        assert res.status_code == 202, res.text
        done = ended(c, res.json()["id"])
        assert done["status"] == "done" and done["sentences_done"] >= 2000


def test_the_schema_describes_the_job_routes(translator):
    schema = create_app(translator, keys_file=None).openapi()
    post = schema["paths"]["/file_jobs"]["post"]
    assert "202" in post["responses"] and {"429", "503"} <= set(post["responses"])
    assert post["responses"]["429"]["headers"]["Retry-After"]
    form = post["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    assert form["source"]["enum"] == ["src"] and form["target"]["enum"] == ["tgt"]
    job = schema["components"]["schemas"]["FileJob"]["properties"]
    assert set(job["status"]["enum"]) == {"queued", "running", "done", "failed", "cancelled"}
    assert {"get", "delete"} <= set(schema["paths"]["/file_jobs/{job_id}"])
