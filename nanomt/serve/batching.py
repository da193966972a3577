"""Dynamic batching for the server: a bounded queue of jobs and one worker that decodes them in shared batches.

Jobs with equal keys may share a batch: the worker waits a short while (max_wait) after the oldest waiting job
for more of its kind, takes every waiting job of that kind up to a token budget, runs them as one call and hands
each job its own slice of the results. Nothing here knows about HTTP or models: `run(key, items)` does the work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

log = logging.getLogger("nanomt.serve")


class QueueFull(Exception):
    """The queue holds as many jobs as it may: try again later."""


class Closed(Exception):
    """The batcher is shutting down and takes no new jobs."""


class JobTimeout(Exception):
    """The job's deadline passed before the worker reached it; its items were never decoded."""


@dataclass(eq=False)
class Job:
    """Items (sentences) to run together with other jobs of the same key; `future` gets their results, in order."""

    key: Hashable
    items: list
    tokens: int
    deadline: float | None = None  # time.monotonic() after which the job is dropped
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now > self.deadline


@dataclass(frozen=True)
class Batch:
    """What one run of the worker decoded: for metrics and logs."""

    key: Hashable
    jobs: int
    items: int
    tokens: int
    seconds: float


class Batcher:
    """A bounded FIFO of jobs and a single worker thread that runs them in batches of one key."""

    def __init__(
        self,
        run: Callable[[Hashable, list], list],
        max_tokens: int,
        max_wait: float = 0.005,
        max_queue: int = 256,
        on_batch: Callable[[Batch], None] | None = None,
        shared: bool = True,
    ):
        """shared=False: every job is a batch of its own (each request decoded alone, as behind one lock)."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0, got {max_wait}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.run, self.max_tokens, self.max_wait, self.max_queue = run, max_tokens, max_wait, max_queue
        self.on_batch, self.shared = on_batch, shared
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._worker: threading.Thread | None = None
        self._batch_since: float | None = None  # when the batch being decoded started (None: none is)

    def depth(self) -> int:
        """Jobs waiting (not counting the batch being decoded)."""
        return len(self._queue)

    def full(self) -> bool:
        return len(self._queue) >= self.max_queue

    @property
    def closing(self) -> bool:
        return self._closing

    def start(self) -> None:
        with self._cond:
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="nanomt-batcher", daemon=True)
                self._worker.start()

    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def stalled(self, seconds: float) -> bool:
        """Whether the worker has been on one batch for longer than `seconds`, or a job has waited that long."""
        now, since, queue = time.monotonic(), self._batch_since, self._queue
        return (since is not None and now - since > seconds) or bool(queue and now - queue[0].arrived > seconds)

    def submit(self, key: Hashable, items: list, tokens: int, timeout: float | None = None) -> Job:
        """Queue a job, or raise QueueFull (at once) or Closed; its future gets run's results for its items."""
        self.start()
        job = Job(key, list(items), tokens)
        if timeout is not None:
            job.deadline = job.arrived + timeout
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are waiting; the limit is {self.max_queue}")
            self._queue.append(job)
            self._cond.notify()
        return job

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, finish every queued one, then stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    def _drop_dead(self, now: float) -> None:
        """Remove cancelled jobs and fail expired ones (caller holds the lock)."""
        live = deque()
        for job in self._queue:
            if job.future.cancelled():
                continue
            if job.expired(now):
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(JobTimeout("the request timed out in the queue"))
                continue
            live.append(job)
        self._queue = live

    def _next_batch(self) -> list[Job] | None:
        """Block until a batch is due; None when closing and nothing is left."""
        with self._cond:
            while True:
                self._drop_dead(time.monotonic())
                if not self._queue:
                    if self._closing:
                        return None
                    self._cond.wait()
                    continue
                first = self._queue[0]
                same = [j for j in self._queue if j.key == first.key] if self.shared else [first]
                wait = first.arrived + self.max_wait - time.monotonic()
                # Wait for more of the oldest job's kind, unless its budget is full or the server drains.
                if wait > 0 and self.shared and not self._closing and sum(j.tokens for j in same) < self.max_tokens:
                    self._cond.wait(wait)
                    continue
                taken, tokens = [], 0
                for job in same:  # FIFO: the oldest first; the first one always goes, however large
                    if taken and tokens + job.tokens > self.max_tokens:
                        break
                    taken.append(job)
                    tokens += job.tokens
                self._queue = deque(j for j in self._queue if j not in taken)
                # A job cancelled (timed out) since the last look is dropped here, never decoded.
                return [j for j in taken if j.future.set_running_or_notify_cancel()]

    def _loop(self) -> None:
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            if not jobs:
                continue
            items = [x for j in jobs for x in j.items]
            start = time.perf_counter()
            self._batch_since = time.monotonic()
            try:
                results = self.run(jobs[0].key, items)
                if len(results) != len(items):
                    raise RuntimeError(f"{len(results)} results for {len(items)} items")
            except Exception as e:  # every waiting request gets the failure; the worker goes on
                for j in jobs:
                    j.future.set_exception(e)
                continue
            finally:
                self._batch_since = None
            seconds = time.perf_counter() - start
            at = 0
            for j in jobs:
                j.future.set_result(results[at : at + len(j.items)])
                at += len(j.items)
            if self.on_batch is not None:
                try:
                    self.on_batch(Batch(jobs[0].key, len(jobs), len(items), sum(j.tokens for j in jobs), seconds))
                except Exception:  # metrics must never stop the worker
                    log.exception("on_batch failed")
