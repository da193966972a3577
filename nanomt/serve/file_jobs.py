"""nanomt's file jobs: a long document translated after the request that sent it has been answered, its progress
asked for as it goes (LibreTranslate's POST /translate_file answers only once the file is translated, within
--timeout).

    POST   /file_jobs           /translate_file's form (file, source, target, api_key): 202 and the job, queued
    GET    /file_jobs/{job_id}  the job: status (queued, running, done, failed, cancelled), sentences done of all,
                                the error of a failed one, and once done translatedFileUrl (/download_file/NAME)
    DELETE /file_jobs/{job_id}  cancel it: a queued job never starts, a running one stops at its next chunk of
                                files.CHUNK sentences and frees its thread (it reads "cancelled" once it has)

A job runs on the replica that took it, on a thread of the files pool (nanomt.serve.workers), at most one fewer at
once than the pool has threads, so that /translate_file always finds one; the others wait in the replica's queue
(JOBS_QUEUED in all, JOBS_PER_CLIENT a client). No deadline bounds a job, only each of its model calls
(JOB_CALL_SECONDS, asked again while the decoding queue is full). Its record lives in the store: JSON, kept an hour
from its last write (as the translated file is), written when the job is taken, as it goes (at most every WRITE_EVERY
seconds), at least every HEARTBEAT seconds while it is queued or running, and when it ends (again every HEARTBEAT
seconds while the store cannot take it: only this replica knows how the job ended), so that every replica sharing the
store answers its progress. A queued or running record unwritten for STALE seconds is a replica's that
stopped without ending it (killed, out of memory, its machine gone): every replica answers it as failed (503), where
it would otherwise read "running" until the store drops it. A DELETE on any replica sets the job's cancel flag in
the store, which the replica running it reads every CHECK_EVERY seconds (at once where the DELETE reached that
replica). With keys (--api-key, --keys-file) a job is its client's: another key's GET or DELETE,
or one without a key, finds nothing (404); without keys, the job's id (128 random bits) is what reaches it, as a
translated file's name is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Literal

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nanomt.documents import files, formats
from nanomt.serve.access import SECURITY, presented_key
from nanomt.serve.documents import Route, Stalled
from nanomt.serve.errors import errors
from nanomt.serve.file_routes import (
    KEEP_SECONDS,
    TranslatedFiles,
    Upload,
    dropped,
    file_body,
    file_refusal,
    read_upload,
)

log = logging.getLogger("nanomt.serve")

JOBS_QUEUED = 32  # jobs queued or running on one replica, every client's together
JOBS_PER_CLIENT = 4  # and one client's
KEEP_PER_CLIENT = 64  # job records one client has in the store, its oldest dropped first
KEEP_JOBS = 4096  # and every client's together
JOB_CALL_SECONDS = 600.0  # the most one model call of a job (a chunk of sentences) waits, at least --timeout
WRITE_EVERY = 0.25  # seconds between two writes of a running job's progress, at least
CHECK_EVERY = 0.5  # seconds between two reads of its cancel flag, at least
HEARTBEAT = 5.0  # seconds: a queued or running job's record is written at least this often, progress or not
STALE = 60.0  # seconds unwritten after which a queued or running record is a stopped replica's (clocks may differ)
JOB_ID = re.compile(r"[0-9a-f]{32}")
Status = Literal["queued", "running", "done", "failed", "cancelled"]
ENDED = ("done", "failed", "cancelled")


class Cancelled(Exception):
    """Raised from a job's progress callback, in its pool thread, once the job is cancelled: the file stops there."""


@dataclass
class Record:
    """A job as the store keeps it (JSON); `client` and the times are never shown."""

    id: str
    client: str
    filename: str
    status: str = "queued"
    sentences_done: int = 0
    sentences_total: int = 0
    error: str | None = None
    error_code: int | None = None  # the HTTP status /translate_file would have answered the failure with
    download: str | None = None  # the translated file's name, once done (GET /download_file/NAME)
    created: float = 0.0  # time.time()
    updated: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> Record | None:
        try:
            found = json.loads(data)
            return cls(**{f.name: found[f.name] for f in fields(cls) if f.name in found})
        except (ValueError, TypeError, KeyError):
            return None

    def end(self, status: str, error: str | None = None, code: int | None = None, download: str | None = None):
        self.status, self.error, self.error_code, self.download = status, error, code, download

    def orphaned(self, now: float) -> bool:
        """Whether the replica that took the job stopped before ending it: queued or running, and not written for
        STALE seconds, where its replica writes it every HEARTBEAT."""
        return self.status not in ENDED and now - self.updated > STALE


class FileJob(BaseModel):
    """A file job, as GET /file_jobs/{job_id} answers it."""

    id: str = Field(description="the job's id: GET or DELETE /file_jobs/{id}")
    status: Status = Field(description="queued, running, then done, failed or cancelled")
    filename: str = Field(description="the uploaded file's name")
    sentences_done: int = Field(description="sentences translated so far (through a pivot, each model's count)")
    sentences_total: int = Field(description="sentences in all, once the file is read (0 before)")
    error: str | None = Field(default=None, description="why a failed job failed, in one line")
    error_code: int | None = Field(
        default=None, description="a failed job's HTTP status, as /translate_file would have answered it"
    )
    translatedFileUrl: str | None = Field(  # LibreTranslate's spelling, as /translate_file's
        default=None, description="once done: the translated file, kept an hour (GET /download_file/NAME)"
    )


class Records:
    """Job records and cancel flags in the server's store (each call one round trip: run it through server.io)."""

    def __init__(self, store, layout):
        self.store, self.layout = store, layout

    def put(self, id_: str, client: str, data: bytes) -> bool:
        group = self.layout.group
        bounds = ((group(f"jobs:{client}"), KEEP_PER_CLIENT), (group("jobs"), KEEP_JOBS))
        return self.store.put(self.layout.job(id_), data, KEEP_SECONDS, bounds)

    def get(self, id_: str) -> tuple[Record | None, bool] | None:
        """The record and whether the job's cancel flag is set; None while the store is down."""
        if self.store.down:
            return None
        found, flag = self.store.get_many([self.layout.job(id_), self.layout.job_cancel(id_)])
        return (None if found is None else Record.decode(found)), flag is not None

    def cancel(self, id_: str) -> bool:
        return self.store.put(self.layout.job_cancel(id_), b"1", KEEP_SECONDS)

    def cancelled(self, id_: str) -> bool:
        return self.store.get(self.layout.job_cancel(id_)) is not None


class Job:
    """A job this replica runs: its record, its file until it starts, its progress as the pool's thread hears it,
    and its stop (set by a DELETE here, or once the replica reads the store's cancel flag)."""

    def __init__(self, record: Record, route: Route, upload: Upload):
        self.record, self.route = record, route
        self.data, self.fmt, self.max_chars = upload.data, upload.fmt, upload.client.limits.char_limit
        self.stop = threading.Event()
        self.saving = asyncio.Lock()  # one write of the record at a time, each of its state when it is made
        self._lock = threading.Lock()
        self.done = self.total = 0

    def heard(self, done: int, total: int) -> None:
        """The file's progress callback, in its pool thread: sentences done never go back; Cancelled once stopped."""
        with self._lock:
            self.done = max(self.done, done)
            self.total = max(total, self.done)
        if self.stop.is_set():
            raise Cancelled(f"file job {self.record.id} cancelled")

    def progress(self) -> tuple[int, int]:
        with self._lock:
            return self.done, self.total


class FileJobs:
    """One replica's file jobs (see the module's docstring)."""

    def __init__(self, server, routed, kept: TranslatedFiles):
        self.server, self.routed, self.kept = server, routed, kept
        self.records = Records(server.store, server.layout)
        self.jobs: dict[str, Job] = {}  # this replica's, queued or running
        self.ending: dict[str, Job] = {}  # this replica's that ended while the store could not take their end
        self.queue: deque[Job] = deque()
        self.running = 0
        self.at_once = max(1, server.pools.files.threads - 1)
        self.call_seconds = max(JOB_CALL_SECONDS, server.config.timeout or 0.0)
        self._tasks: set[asyncio.Task] = set()
        self._beat: asyncio.Task | None = None

    def busy(self) -> HTTPException | None:
        if len(self.jobs) >= JOBS_QUEUED:
            message = f"server busy: {len(self.jobs)} file jobs are queued or running; the limit is {JOBS_QUEUED}"
            return HTTPException(503, message, headers={"Retry-After": "10"})
        return None

    async def submit(self, request: Request) -> Record:
        """A job for the request's file, queued; the form's refusals as /translate_file's, a 429 past the client's
        jobs, a 503 past the replica's or while the store cannot keep the record."""
        full = self.busy()
        if full is not None:  # refused before the upload is spooled
            await dropped(request)
            raise full
        upload = await read_upload(request, self.server)
        route = self.routed(request, upload.source, upload.target)
        full = self.busy()
        if full is not None:
            raise full
        client = upload.client
        mine = sum(job.record.client == client.id for job in self.jobs.values())
        if mine >= JOBS_PER_CLIENT:
            whose = "this key" if client.keyed else "this address"
            message = (f"{mine} file jobs of {whose} are queued or running; the limit is {JOBS_PER_CLIENT}: "
                       "wait for one to end, or cancel one")  # fmt: skip
            raise HTTPException(429, message, headers={"Retry-After": "5"})
        route.detach(self.call_seconds)
        now = time.time()
        record = Record(uuid.uuid4().hex, client.id, upload.name, created=now, updated=now)
        job = Job(record, route, upload)
        self.jobs[record.id] = job  # counted from here on, while the record is written
        if not await self.server.io(self.records.put, record.id, record.client, record.encode(), fallback=False):
            del self.jobs[record.id]
            raise HTTPException(503, "the job cannot be kept: the store is unreachable", headers={"Retry-After": "5"})
        self.queue.append(job)
        self._start()
        return record

    def _start(self) -> None:
        """Start queued jobs while fewer than `at_once` run; the queue's heartbeat while any job waits."""
        while self.queue and self.running < self.at_once:
            job = self.queue.popleft()
            self.running += 1
            self._spawn(self._run(job))
        if self.queue and (self._beat is None or self._beat.done()):
            self._beat = self._spawn(self._keep_queued())

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)  # a reference, so that the task is not collected while it runs
        task.add_done_callback(self._tasks.discard)
        return task

    async def _keep_queued(self) -> None:
        """Write every queued job's record each HEARTBEAT seconds while any waits (a running one writes its own)."""
        while self.queue:
            await asyncio.sleep(HEARTBEAT)
            for job in list(self.queue):
                await self._save(job)

    async def _save(self, job: Job) -> bool:
        async with job.saving:  # two writes in flight at once could land in either order
            record = job.record
            if record.status != "done":  # a done job's counts are its whole file's
                record.sentences_done, record.sentences_total = job.progress()
            record.updated = time.time()
            data = record.encode()
            return await self.server.io(self.records.put, record.id, record.client, data, fallback=False)

    async def _run(self, job: Job) -> None:
        try:
            await self._work(job)
        except asyncio.CancelledError:  # the server stops: the pool's thread stops at its next chunk
            job.stop.set()
            job.record.end("failed", "the server stopped before the file was translated", 503)
            raise
        finally:
            self.running -= 1
            self.jobs.pop(job.record.id, None)
            try:
                self._start()
                await self._write_end(job)
            except (Exception, asyncio.CancelledError):  # the loop is closing: nothing more starts or is kept
                pass

    async def _write_end(self, job: Job) -> None:
        """The ended job's record written, again every HEARTBEAT seconds while the store cannot take it (for as long
        as the store would have kept it): a record left queued or running would read as a stopped replica's."""
        deadline = time.monotonic() + KEEP_SECONDS
        if await self._save(job):
            return
        self.ending[job.record.id] = job
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(HEARTBEAT)
                if await self._save(job):
                    return
        finally:
            del self.ending[job.record.id]

    async def _work(self, job: Job) -> None:
        """Run the job to its end; its record holds how it ended (the caller writes it)."""
        record = job.record
        if job.stop.is_set() or await self.server.io(self.records.cancelled, record.id, fallback=False):
            record.end("cancelled")
            return
        record.status = "running"
        await self._save(job)
        task = asyncio.ensure_future(job.route.file(job.data, job.fmt, job.max_chars, job.heard))
        job.data = None  # the task holds the file now, until it ends
        written, checked = (0, 0), time.monotonic()
        saved = checked
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WRITE_EVERY)
                if task.done():
                    break
                if job.progress() != written or time.monotonic() - saved >= HEARTBEAT:
                    written, saved = job.progress(), time.monotonic()
                    await self._save(job)
                if time.monotonic() - checked >= CHECK_EVERY:
                    checked = time.monotonic()
                    if await self.server.io(self.records.cancelled, record.id, fallback=False):
                        job.stop.set()
            translated = task.result()
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its end is nobody's to hear
            raise
        except Cancelled:
            record.end("cancelled")
            return
        except files.FileError as e:
            refusal = file_refusal(record.filename, e)
            record.end("failed", refusal.detail, refusal.status_code)
            return
        except HTTPException as e:  # the decoding queue full past the call's bound, the server stopping
            record.end("failed", str(e.detail), e.status_code)
            return
        except Stalled as e:
            record.end("failed", str(e), 504)
            return
        except Exception as e:
            log.exception("file job %s failed", record.id)
            record.end("failed", f"internal server error: {type(e).__name__}", 500)
            return
        done, total = job.progress()
        record.sentences_done = record.sentences_total = max(done, total)
        stored = await self.server.io(self.kept.add, record.filename, translated, job.fmt, record.client, fallback=None)
        if stored is None:
            record.end("failed", "the translated file cannot be kept: the store is unreachable", 503)
        else:
            record.end("done", download=stored)

    async def find(self, request: Request, job_id: str) -> tuple[Record, bool]:
        """The request's client's job and whether its cancel flag is set: a 404 for an id that is no job of its
        client's (with keys), a 503 while the store is unreachable."""
        found = (None, False)
        if JOB_ID.fullmatch(job_id):  # any other text is no job's id, and never a key of the store
            found = await self.server.io(self.records.get, job_id, fallback=None)
        if found is None:
            raise HTTPException(503, "the store is unreachable: retry later", headers={"Retry-After": "5"})
        record, flagged = found
        if job_id in self.ending:  # ended here; the store's record is older
            record = self.ending[job_id].record
        access = self.server.access
        if record is not None and access.key_required:
            client = access.identify(request, presented_key(request, None))
            record = record if client is not None and client.id == record.client else None
        if record is None:
            raise HTTPException(404, f"{job_id}: no such file job (or no longer kept)")
        if flagged and record.status == "queued":  # it never starts
            record.status = "cancelled"
        elif job_id not in self.jobs and record.orphaned(time.time()):
            stopped = f"the replica running the job stopped before it ended (no word from it in {STALE:g} s)"
            record.end("failed", stopped, 503)
        return record, flagged

    async def cancel(self, request: Request, job_id: str) -> Record:
        record, flagged = await self.find(request, job_id)
        if record.status in ENDED:
            return record
        if not flagged and not await self.server.io(self.records.cancel, job_id, fallback=False):
            raise HTTPException(503, "the store is unreachable: retry later", headers={"Retry-After": "5"})
        job = self.jobs.get(job_id)
        if job is not None:
            job.stop.set()
            if job in self.queue:  # never started: ended here
                self.queue.remove(job)
                del self.jobs[job_id]
                job.record.end("cancelled")
                await self._save(job)
                record.status = "cancelled"
        return record


def shown(request: Request, record: Record) -> dict:
    """A record as the API answers it."""
    out = {k: getattr(record, k) for k in ("id", "status", "filename", "sentences_done", "sentences_total")}
    if record.status == "failed":
        out.update(error=record.error, error_code=record.error_code)
    if record.status == "done" and record.download:
        out["translatedFileUrl"] = f"{request.base_url}download_file/{record.download}"
    return out


def job_body(server) -> dict:
    """POST /file_jobs's request body in the OpenAPI schema: /translate_file's form, its languages named."""
    body = file_body(", ".join(formats.FORMATS))
    models = server.models
    sources = models.sources()
    targets = sorted({t for s in sources for t in models.targets(s)})
    for content in body["content"].values():
        content["schema"]["properties"]["source"]["enum"] = list(sources)
        content["schema"]["properties"]["target"]["enum"] = targets
    return body


def add_routes(app: FastAPI, server, routed, kept: TranslatedFiles) -> FileJobs:
    """POST /file_jobs, GET and DELETE /file_jobs/{job_id}; `routed` and `kept` as /translate_file's."""
    jobs = FileJobs(server, routed, kept)
    ways = [{name: []} for name in SECURITY]
    security = ways if server.key_required else [{}, *ways]
    app.state.file_jobs = jobs
    answer = {"response_model": FileJob, "response_model_exclude_none": True}

    @app.post(
        "/file_jobs",
        status_code=202,
        responses=errors(400, 403, 413, 415, 422, 429, 503),
        openapi_extra={"requestBody": job_body(server), "security": security},
        **answer,
    )
    async def file_job(request: Request) -> dict:
        """Translate a file as a job, keeping its formatting: answered at once (202) with the job's id; GET
        /file_jobs/{id} tells its progress and, once done, the translated file's URL. A job runs however long the
        file takes (/translate_file answers within the server's timeout)."""
        record = await jobs.submit(request)
        return shown(request, record)

    @app.get("/file_jobs/{job_id}", responses=errors(404, 503), openapi_extra={"security": security}, **answer)
    async def file_job_status(request: Request, job_id: str) -> dict:
        """A file job's status and progress, from any replica sharing the store (with keys, the same key's only)."""
        record, _ = await jobs.find(request, job_id)
        return shown(request, record)

    @app.delete("/file_jobs/{job_id}", responses=errors(404, 503), openapi_extra={"security": security}, **answer)
    async def cancel_file_job(request: Request, job_id: str) -> dict:
        """Cancel a file job: a queued one never starts; a running one stops at its next chunk of sentences (its
        status turns cancelled then). A job that has ended is answered as it is."""
        return shown(request, await jobs.cancel(request, job_id))

    return jobs
