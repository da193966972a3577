"""Prometheus metrics of the server (per model where a batch is decoded), and the access log of every request."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from nanomt.serve.batching import Batch

access_log = logging.getLogger("nanomt.access")


class ServerMetrics:
    """Prometheus metrics of one app, in a registry of its own (several apps may live in one process)."""

    def __init__(self, queue_depth):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "nanomt_requests", "HTTP requests answered, by route, method and status", ["route", "method", "status"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "nanomt_request_duration_seconds", "time from request to response, by route", ["route"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip
        Gauge("nanomt_queue_depth", "requests waiting for the decoder", registry=r).set_function(queue_depth)
        sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
        self.batch_sentences = Histogram("nanomt_batch_sentences", "sentences a batch", buckets=sizes, registry=r)
        self.batch_requests = Histogram("nanomt_batch_requests", "requests a batch", buckets=sizes, registry=r)
        self.sentences = Counter("nanomt_sentences", "sentences decoded", registry=r)
        self.tokens = Counter("nanomt_source_tokens", "source tokens decoded (with EOS)", registry=r)
        self.decode_seconds = Counter("nanomt_decode_seconds", "seconds the model spent decoding", registry=r)
        per_model = {"labelnames": ["model"], "registry": r}
        self.model_sentences = Counter("nanomt_model_sentences", "sentences decoded, by model", **per_model)
        self.model_seconds = Counter("nanomt_model_decode_seconds", "seconds spent decoding, by model", **per_model)
        self.loaded = Gauge("nanomt_model_loaded", "whether a model is in memory (1) or not (0)", **per_model)
        self.loads = Counter("nanomt_model_loads", "times a model was loaded", **per_model)
        self.cache_hits = Counter("nanomt_cache_hits", "sentences answered from the sentence cache", registry=r)
        self.cache_misses = Counter("nanomt_cache_misses", "sentences looked up in the cache and decoded", registry=r)
        self.memory_hits = Counter("nanomt_memory_hits", "sentences answered with a stored correction", registry=r)
        self.window = 60.0
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, sentences, tokens) of recent batches
        self._lock = threading.Lock()
        rate = Gauge(
            "nanomt_throughput", "decoded per second over the last minute", ["unit"], registry=r
        )  # fmt: skip
        rate.labels("sentences").set_function(lambda: self._rate(1))
        rate.labels("tokens").set_function(lambda: self._rate(2))

    def batch(self, b: Batch) -> None:
        """A batch the worker decoded (its key a nanomt.serve.jobs.JobKey, naming the model)."""
        self.batch_sentences.observe(b.items)
        self.batch_requests.observe(b.jobs)
        self.sentences.inc(b.items)
        self.tokens.inc(b.tokens)
        self.decode_seconds.inc(b.seconds)
        self.model_sentences.labels(b.key.model).inc(b.items)
        self.model_seconds.labels(b.key.model).inc(b.seconds)
        with self._lock:
            self._recent.append((time.monotonic(), b.items, b.tokens))

    def _rate(self, field: int) -> float:
        with self._lock:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - self.window:
                self._recent.popleft()
            return sum(x[field] for x in self._recent) / self.window

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def add_observer(app: FastAPI, metrics: ServerMetrics) -> None:
    """Count, time and log (one JSON line) every request."""
    routes = {getattr(r, "path", "") for r in app.routes}

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            seconds = time.perf_counter() - start
            path = request.url.path
            route = path if path in routes else "other"
            metrics.requests.labels(route, request.method, str(status)).inc()
            metrics.latency.labels(route).observe(seconds)
            if access_log.isEnabledFor(logging.INFO):
                entry = {
                    "ts": round(time.time(), 3),
                    "client": request.client.host if request.client else None,
                    "method": request.method,
                    "path": path,
                    "status": status,
                    "ms": round(1000 * seconds, 1),
                    "sentences": getattr(request.state, "sentences", None),
                    "user_agent": request.headers.get("user-agent"),
                }
                access_log.info(json.dumps(entry, ensure_ascii=False))


def json_logs(enabled: bool = True) -> None:
    """Access logs as one JSON object a line on stderr (uvicorn's own access log is off), or none at all."""
    if not enabled:  # the command line's root logger takes INFO: without this the lines would reach it
        access_log.disabled = True
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False
