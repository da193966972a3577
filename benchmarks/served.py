"""A `nanomt serve` process for a benchmark: started on a free local port, ready once /ready answers, stopped.

Imports neither torch nor nanomt, so a benchmark that must keep torch out of its own process can use it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(serve_args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """`nanomt serve SERVE_ARGS` on a free local port, its output in `log`; the process and its URL once ready."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "nanomt.cli", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"nanomt serve exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"nanomt serve was not ready in 300 s:\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains), then SIGKILL after a minute."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
