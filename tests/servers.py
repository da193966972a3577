"""Real processes for the tests that need them: `nanomt serve` started as an operator starts it, and a real
redis-server on a free port (paused and resumed by the fault tests).

A real component that cannot be had is a skip with one line saying how to get it, except where the environment
says every component must be there (NANOMT_REQUIRE_COMPONENTS=1, as .ci/run sets it): there it is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

NANOMT_SERVE = ["-m", "nanomt.cli", "serve"]
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def missing(what: str) -> None:
    """Skip the test for a real component that is not here, or fail it where every component must be."""
    if os.environ.get("NANOMT_REQUIRE_COMPONENTS") == "1":
        pytest.fail(f"{what} (NANOMT_REQUIRE_COMPONENTS=1: every real component must be installed)")
    pytest.skip(what)


def metric(exposition: str, name: str) -> float:
    """A sample's value in a Prometheus text exposition (/metrics), 0 where the server has none yet."""
    for line in exposition.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """A process's resident memory."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class RedisServer:
    """A real redis-server on a free port, in memory only; stopped, paused and resumed by the fault tests."""

    def __init__(self):
        self.port, self.proc = free_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections stay open, nothing answers), as behind a dead NAT."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def flush(self) -> None:
        import redis

        redis.Redis(port=self.port).flushall()


def start_redis() -> RedisServer:
    """A running redis-server, or the test skipped (failed where components are required) with one line why."""
    try:
        import redis  # noqa: F401
    except ImportError:
        missing("the redis client library is not installed (pip install redis)")
    if not shutil.which(REDIS_SERVER):
        missing("no redis-server binary (Debian: apt-get install redis-server)")
    return RedisServer().start()


def stop(proc: subprocess.Popen) -> None:
    """Terminate a process; kill it if it lingers."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


def start_server(run_dir, log_path: Path, args=(), env: dict | None = None) -> tuple[subprocess.Popen, str] | None:
    """`nanomt serve RUN ARGS` on a free port once it answers /health, or None if another process took the port."""
    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, *NANOMT_SERVE, str(run_dir), "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            if "address already in use" in log_path.read_text().lower():
                return None
            pytest.fail(f"server exited: {log_path.read_text()}")
        if time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"server not up in 120 s: {log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def start_server_retrying(run_dir, log_dir: Path, args=(), env=None) -> tuple[subprocess.Popen, str, Path]:
    """start_server, on another port when one was taken between choosing and binding it; the process, URL, log."""
    for attempt in range(5):
        log = log_dir / f"server-{attempt}.log"
        started = start_server(run_dir, log, args, env)
        if started:
            return (*started, log)
    pytest.fail("every free port was taken before the server could bind it")
