"""The server's thread pools: each kind of blocking work on a pool of its own, so that no thread ever waits on work
that needs a thread of its own pool, and every wait ends at the request's deadline.

    documents   segmenting and joining paragraphs and HTML; a thread waits on its decodes, which need the event loop,
                the store pool and the batcher's worker, never a documents thread
    files       the same for uploaded files, two at a time (a .docx is parsed whole in memory)
    store       round trips to the store (SQLite, Redis): waits on nothing of the server's
    work        language detection and hashing: CPU only, waits on nothing

A pool holds at most threads + queue tasks (one more is Busy at once: a 503); a task whose deadline passed while it
waited is never started (Expired: a 504); a task that waited longer than `stall` seconds marks its pool stalled, so
that /ready answers 503 and a balancer takes the replica out while it cannot make progress.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout


class Busy(Exception):
    """A pool holds as many tasks as it may: try again later."""


class Expired(Exception):
    """The request's deadline passed before its work was done."""


class Pool:
    """A fixed number of threads for one kind of work, with a bounded number of tasks and deadlines."""

    def __init__(self, name: str, threads: int, queue: int):
        if threads < 1 or queue < 0:
            raise ValueError(f"pool {name}: threads must be >= 1 and queue >= 0, got {threads}, {queue}")
        self.name, self.threads, self.capacity = name, threads, threads + queue
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix=f"nanomt-{name}")
        self._lock = threading.Lock()
        self._waiting: dict[int, float] = {}  # task -> when it was queued, until a thread takes it
        self._running: dict[int, float] = {}  # task -> when a thread took it
        self._ids = itertools.count()

    def tasks(self) -> int:
        """Tasks queued or running."""
        return len(self._waiting) + len(self._running)

    def oldest(self, now: float | None = None) -> float:
        """Seconds the longest-waiting task has waited for a thread (0 when none waits)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return max((now - t for t in self._waiting.values()), default=0.0)

    def submit(self, fn, *args, deadline: float | None = None) -> Future:
        """fn(*args) on a thread of the pool, unless its deadline passes first; Busy when the pool is full."""
        with self._lock:
            if len(self._waiting) + len(self._running) >= self.capacity:
                raise Busy(f"{self.capacity} {self.name} tasks are queued or running; the limit is {self.capacity}")
            task = next(self._ids)
            self._waiting[task] = time.monotonic()

        def run():
            with self._lock:
                self._running[task] = self._waiting.pop(task, time.monotonic())
            if deadline is not None and time.monotonic() > deadline:
                raise Expired(f"the {self.name} task waited past its deadline")
            return fn(*args)

        def done(_):
            with self._lock:
                self._waiting.pop(task, None)  # cancelled before a thread took it
                self._running.pop(task, None)

        future = self._executor.submit(run)
        future.add_done_callback(done)
        return future

    async def run(self, fn, *args, deadline: float | None = None):
        """Await fn(*args) on the pool until `deadline` (time.monotonic()); Expired past it, Busy when full."""
        future = self.submit(fn, *args, deadline=deadline)
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            future.cancel()  # not started yet: it never will be
            raise Expired(f"the {self.name} work did not end within the request's time") from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def wait(future: Future, deadline: float | None):
    """A future's result, waited for in a pool's thread until `deadline`; Expired (and the future cancelled) past it.
    The only blocking wait a pool's thread makes."""
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        return future.result(timeout)
    except FutureTimeout:
        future.cancel()
        raise Expired("the request's time ran out while its sentences were being translated") from None


class Pools:
    """The pools of one server (see the module's docstring for what runs on each)."""

    # A documents thread mostly waits on its decodes, so many may: the more documents wait together, the fuller the
    # batches their sentences share. Files and the CPU's own work are few at a time.
    def __init__(self, documents: int = 16, files: int = 2, store: int = 8, work: int = 2, queue: int = 64):
        self.documents = Pool("documents", documents, queue)
        self.files = Pool("files", files, queue)
        self.store = Pool("store", store, queue)
        self.work = Pool("work", work, queue)

    def __iter__(self):
        return iter((self.documents, self.files, self.store, self.work))

    def stalled(self, stall: float) -> list[str]:
        """The pools with a task that has waited longer than `stall` seconds for a thread."""
        now = time.monotonic()
        return [p.name for p in self if p.oldest(now) > stall]

    def close(self) -> None:
        for pool in self:
            pool.close()
