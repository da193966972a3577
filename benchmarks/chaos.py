"""A fleet under faults: two `nanomt serve` replicas behind a real nginx (Debian's, as docs/serving.md deploys it) on
one real Redis, a bounded mixed load, and meanwhile Redis stopped and resumed, each replica restarted with SIGTERM in
turn (a rolling restart) and one killed with SIGKILL.

    python -m benchmarks.chaos [--checkpoint RUN] [--seconds 150]      # benchmarks/results/chaos.json

--clients clients each send one request after another for --seconds: nanomt's /translate (sentences), LibreTranslate's
paragraphs and HTML, files (/translate_file and their download), file jobs (/file_jobs, followed until they end),
anonymous suggestions (kept for review) and bad requests (malformed JSON, a language not served, a body past the
limit: each expects its 4xx). The faults, at shares of the run: Redis SIGSTOP at 15% and SIGCONT at 30%; replica A
SIGTERM at 40%, restarted once it has drained and exited; replica B the same at 58%; replica A SIGKILL at 78%,
restarted. Every request is classed by its answer:
ok (2xx, or the 4xx a bad request expects), failed (any other status, with the status), lost (no answer, or nginx's
502/504: the replica went away with the request). The results file has requests sent, answered, failed and lost by
kind and by phase, latency p50/p99, each replica process's RSS at start, end and most, and what nginx retries.
After the load, every file job is followed until it has ended (done, or failed where its replica stopped or was
killed: nanomt.serve.file_jobs.STALE after its last write), and one left queued or running breaks the bounds.
Without --checkpoint a toy run is trained first (`nanomt demo --steps 60`); --clients and --seconds bound the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import free_port
from scripts.common import NANOMT, RESULTS, machine, shown

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream nanomt {{
    server 127.0.0.1:{a} max_fails=1 fail_timeout=2s;
    server 127.0.0.1:{b} max_fails=1 fail_timeout=2s;
  }}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size 12m;                   # /translate_file takes files up to 10 MiB
    location / {{
      proxy_pass http://nanomt;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_read_timeout 70s;                   # past --timeout, so that a 504 is the server's
      proxy_next_upstream error timeout non_idempotent;   # a failed one to the other replica: POSTs too
      proxy_next_upstream_tries 2;
      add_header X-Upstream $upstream_addr always;
    }}
  }}
}}
"""
RETRIES = (
    "proxy_next_upstream error timeout non_idempotent: nginx passes a request to the other replica when the first "
    "refuses the connection or fails before a byte of its answer (a replica draining after SIGTERM drops the "
    "connections still in its listen backlog; a killed one every connection), POSTs included: every POST of nanomt's "
    "is safe to send twice (a translation has no side effect, a repeated suggestion is one more to review, a repeated "
    "file one more kept for an hour). Without non_idempotent nginx retries only the GETs (downloads) once a request "
    "was sent, and such a POST is a 502. A request whose answer the killed replica had begun is lost either way."
)


@dataclass
class Replica:
    """One `nanomt serve` process of the fleet, and its memory over its life."""

    name: str
    port: int
    args: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    lives: list[dict] = field(default_factory=list)
    signalled: float = 0.0  # time.monotonic() of the last signal, and of the exit it caused
    exited: float = 0.0

    def start(self) -> None:
        import httpx

        cmd = [*NANOMT, "serve", *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"replica {self.name} exited:\n{self.log.read_text()[-2000:]}")
            try:
                ready = httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=2).status_code == 200
                if ready and self.proc.poll() is None:  # this process answered, not another on its port
                    rss = rss_mb(self.proc.pid)
                    self.lives.append({"pid": self.proc.pid, "rss_start_mb": rss, "rss_max_mb": rss})
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"replica {self.name} was not ready in 120 s")

    def sample(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self.lives:
            life = self.lives[-1]
            rss = rss_mb(self.proc.pid)
            life["rss_end_mb"], life["rss_max_mb"] = rss, max(life["rss_max_mb"], rss)

    def stop(self, sig: int) -> dict:
        """Send `sig`, wait for the exit; how it ended."""
        self.sample()
        start = time.monotonic()
        self.proc.send_signal(sig)
        status = self.proc.wait(90)
        self.signalled, self.exited = start, time.monotonic()
        ended = {"signal": signal.Signals(sig).name, "exit_status": status, "seconds": round(self.exited - start, 2)}
        self.lives[-1]["ended"] = ended
        self.proc = None
        return ended


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class Requests:
    """What the clients send: each kind a function of (client, rng) -> (method, path, keywords, expected status)."""

    def __init__(self, sentences: list[str]):
        self.sentences = sentences

    def pick(self, rng: random.Random) -> tuple[str, tuple]:
        kind = rng.choices(list(KINDS), weights=[KINDS[k] for k in KINDS])[0]
        return kind, getattr(self, kind)(rng)

    def text(self, rng):
        return "POST", "/translate", {"json": {"text": rng.sample(self.sentences, 2)}}, 200

    def paragraph(self, rng):
        body = {"q": " ".join(rng.sample(self.sentences, 3)), "source": "src", "target": "tgt", "format": "text"}
        return "POST", "/translate", {"json": body}, 200

    def html(self, rng):
        words = rng.sample(self.sentences, 2)
        body = {"q": f"<p>{words[0]} <b>{words[1]}</b></p>", "source": "src", "target": "tgt", "format": "html"}
        return "POST", "/translate", {"json": body}, 200

    def form(self, rng, path: str, lines: int, expected: int):
        """A plain-text file of `lines` sentences posted as LibreTranslate's /translate_file form is."""
        data = "\n".join(rng.sample(self.sentences, lines)).encode()
        return "POST", path, {"data": {"source": "src", "target": "tgt"}, "files": {"file": ("a.txt", data)}}, expected

    def file(self, rng):
        return self.form(rng, "/translate_file", 4, 200)

    def file_job(self, rng):
        return self.form(rng, "/file_jobs", 20, 202)

    def suggestion(self, rng):
        body = {"q": rng.choice(self.sentences), "s": "A suggestion.", "source": "src", "target": "tgt"}
        return "POST", "/suggest", {"json": body}, 200

    def bad(self, rng):
        return rng.choice(
            [
                (
                    "POST",
                    "/translate",
                    {"content": b'{"text": ["la', "headers": {"content-type": "application/json"}},
                    400,
                ),
                ("POST", "/translate", {"json": {"q": "la.", "source": "xx", "target": "tgt"}}, 400),
                ("POST", "/translate", {"json": {"text": ["a" * 300_000]}}, 413),
            ]
        )


KINDS = {"text": 40, "paragraph": 20, "html": 10, "file": 8, "file_job": 4, "suggestion": 5, "bad": 13}
JOB_ENDS = ("done", "failed", "cancelled")
LOST = (502, 504)  # nginx's: the replica went away with the request, or never answered
SETTLE_S = 120.0  # the most a job is followed after the load: a killed replica's reads failed after file_jobs.STALE


@dataclass
class Record:
    kind: str
    phase: str
    status: int | None  # None: no answer at all
    expected: int
    start: float  # time.monotonic() when it was sent
    seconds: float
    upstream: str = ""  # the replica (or replicas, where nginx passed it on) that answered, as nginx says
    error: str = ""  # where no answer came: the client's error

    @property
    def outcome(self) -> str:
        if self.status is None or self.status in LOST:
            return "lost"
        return "ok" if self.status == self.expected else "failed"


class Load:
    """The clients, the phase each request was sent in, and what came back."""

    def __init__(self, url: str, requests: Requests, clients: int, seed: int = 0):
        self.url, self.requests, self.clients, self.seed = url, requests, clients, seed
        self.phase, self.records, self.stopping = "steady", [], threading.Event()
        self.jobs: dict[str, dict] = {}  # each file job's id and its status as last read

    def client(self, c: int) -> None:
        import httpx

        rng = random.Random(self.seed * 1000 + c)
        with httpx.Client(base_url=self.url, timeout=90) as http:
            while not self.stopping.is_set():
                kind, (method, path, kw, expected) = self.requests.pick(rng)
                if kind == "file_job":  # each client its own address, as its jobs are bounded by it
                    kw = {**kw, "headers": {"X-Forwarded-For": f"10.0.0.{c + 1}"}}
                self.send(http, kind, method, path, kw, expected)
                time.sleep(rng.uniform(0.0, 0.01))

    def send(self, http, kind, method, path, kw, expected) -> None:
        import httpx

        phase, start = self.phase, time.monotonic()
        status, upstream, error = None, "", ""
        try:
            res = http.request(method, path, **kw)
            status, upstream = res.status_code, res.headers.get("x-upstream", "")
            if kind == "file" and status == 200:  # and its download, through either replica
                link = res.json()["translatedFileUrl"].split("/", 3)[3]
                self.send(http, "download", "GET", f"/{link}", {}, 200)
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}"[:200]
        self.records.append(Record(kind, phase, status, expected, start, time.monotonic() - start, upstream, error))
        if kind == "file_job" and status == 202:  # the job's wait is not its request's latency
            self.jobs[res.json()["id"]] = res.json()
            self.follow(http, res.json()["id"], self.stopping.is_set)

    def follow(self, http, job_id: str, stop) -> None:
        """Read the job every 0.2 s until it has ended or stop() (a read the fleet fails to answer is read again)."""
        import httpx

        while self.jobs[job_id]["status"] not in JOB_ENDS and not stop():
            time.sleep(0.2)
            try:
                res = http.get(f"/file_jobs/{job_id}")
                if res.status_code == 200:
                    self.jobs[job_id] = res.json()
            except httpx.HTTPError:
                pass

    def settle(self, seconds: float) -> float:
        """Follow every job still queued or running until all have ended or `seconds` have passed; the wait."""
        import httpx

        start = time.monotonic()
        over = lambda: time.monotonic() - start > seconds  # noqa: E731
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for job_id in list(self.jobs):
                self.follow(http, job_id, over)
        return time.monotonic() - start

    def run(self, faults) -> None:
        with ThreadPoolExecutor(self.clients + 1) as ex:
            for c in range(self.clients):
                ex.submit(self.client, c)
            try:
                faults(self)
            finally:
                self.stopping.set()


def faults(redis: subprocess.Popen, replicas: list[Replica], seconds: float, events: list[dict]):
    """The schedule of faults (see the module's docstring), run while the load runs; each event recorded."""
    start = time.monotonic()

    def at(share: float) -> None:
        time.sleep(max(0.0, start + share * seconds - time.monotonic()))

    def event(what: str, **kw) -> None:
        events.append({"at": time.monotonic(), "at_s": round(time.monotonic() - start, 2), "what": what, **kw})

    def run(load: Load) -> None:
        at(0.15)
        load.phase = "redis_paused"
        redis.send_signal(signal.SIGSTOP)
        event("redis SIGSTOP")
        at(0.30)
        redis.send_signal(signal.SIGCONT)
        event("redis SIGCONT")
        load.phase = "steady"
        for share, replica in ((0.40, replicas[0]), (0.58, replicas[1])):
            at(share)
            load.phase = "rolling_restart"
            ended = replica.stop(signal.SIGTERM)
            event(f"replica {replica.name} SIGTERM", **ended)
            replica.start()
            event(f"replica {replica.name} ready again")
            load.phase = "steady"
        at(0.78)
        load.phase = "sigkill"
        ended = replicas[0].stop(signal.SIGKILL)
        window = (replicas[0].signalled, replicas[0].exited)
        event(f"replica {replicas[0].name} SIGKILL", replica=replicas[0].port, window=window, **ended)
        replicas[0].start()
        event(f"replica {replicas[0].name} ready again")
        load.phase = "steady"
        at(1.0)

    return run


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    s = sorted(values)
    pick = lambda q: round(s[min(len(s) - 1, int(q * len(s)))], 3)  # noqa: E731
    return {"p50_s": pick(0.5), "p99_s": pick(0.99), "max_s": round(s[-1], 3)}


def summary(records: list[Record]) -> dict:
    """Sent, answered, ok, failed (by status) and lost, in all, by kind and by phase; latencies."""

    def count(rs: list[Record]) -> dict:
        outcomes = Counter(r.outcome for r in rs)
        failed = Counter(str(r.status) for r in rs if r.outcome == "failed")
        return {
            "sent": len(rs), "answered": sum(r.status is not None for r in rs), "ok": outcomes["ok"],
            "failed": outcomes["failed"], "failed_by_status": dict(sorted(failed.items())), "lost": outcomes["lost"],
            **percentiles([r.seconds for r in rs if r.outcome != "lost"]),
        }  # fmt: skip

    by_kind, by_phase = defaultdict(list), defaultdict(list)
    for r in records:
        by_kind[r.kind].append(r)
        by_phase[r.phase].append(r)
    return {
        "all": count(records),
        "by_kind": {k: count(v) for k, v in sorted(by_kind.items())},
        "by_phase": {k: count(v) for k, v in sorted(by_phase.items())},
    }


def toy_run(tmp: Path) -> Path:
    """A toy model trained for the run (the load's answers need no quality)."""
    subprocess.run([*NANOMT, "demo", "--steps", "60", "--out", str(tmp / "demo")], check=True, capture_output=True)
    return tmp / "demo" / "run"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=None, help="the run to serve (default: a toy run trained first)")
    p.add_argument("--sentences", type=Path, default=None, help="source sentences (default: the toy pair's test set)")
    p.add_argument("--seconds", type=float, default=150.0, help="how long the load runs (the faults at its shares)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default %(default)s)")
    p.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = p.parse_args(argv)
    for binary in (REDIS, NGINX):
        if not Path(binary).is_file():
            raise SystemExit(f"{binary} not found: apt-get install redis-server nginx")
    with tempfile.TemporaryDirectory(prefix="nanomt-chaos-") as tmp_name:
        tmp = Path(tmp_name)
        result = chaos(args, tmp)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"requests": result["requests"]["all"], "bounds": result["bounds"]}, indent=1))


def chaos(args: argparse.Namespace, tmp: Path) -> dict:
    run = args.checkpoint or toy_run(tmp)
    sentences_file = args.sentences or (tmp / "demo" / "data" / "test.src")
    sentences = [s for s in sentences_file.read_text().splitlines() if s.strip()][:200]
    redis_port, *ports, nginx_port = distinct_ports(4)
    redis = subprocess.Popen(
        [REDIS, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--maxmemory", "256mb", "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    store = f"redis://127.0.0.1:{redis_port}/0"
    serve = [str(run), "--store", store, "--suggestions", "--req-limit", "100000", "--timeout", "20"]
    serve += ["--forwarded-allow-ips", "127.0.0.1", "--no-access-log"]
    replicas = [Replica(name, port, serve, tmp / f"replica-{name}.log") for name, port in zip("ab", ports)]
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir()
    os.chmod(tmp, 0o777)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.chmod(tmp / sub, 0o777)  # nginx's workers run unprivileged
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, a=ports[0], b=ports[1], port=nginx_port))
    nginx = None
    try:
        time.sleep(0.3)
        for replica in replicas:
            replica.start()
        nginx = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp)], stderr=subprocess.DEVNULL)
        wait_for(f"http://127.0.0.1:{nginx_port}/ready")
        load, events = Load(f"http://127.0.0.1:{nginx_port}", Requests(sentences), args.clients), []
        sampler = threading.Thread(target=sample_rss, args=(replicas, load.stopping), daemon=True)
        sampler.start()
        started = time.monotonic()
        load.run(faults(redis, replicas, args.seconds, events))
        wall = time.monotonic() - started
        settled = load.settle(SETTLE_S)
        for replica in replicas:
            replica.stop(signal.SIGTERM)
    finally:
        redis.send_signal(signal.SIGCONT)  # a stopped Redis cannot act on SIGTERM
        for proc in (nginx, redis):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        for replica in replicas:
            if replica.proc is not None:
                replica.proc.kill()
    return report(args, run, load, events, replicas, wall, settled)


def distinct_ports(n: int) -> list[int]:
    """n free local ports, no two the same (a port freed after a look may be the next look's)."""
    found: list[int] = []
    while len(found) < n:
        port = free_port()
        found += [] if port in found else [port]
    return found


def wait_for(url: str, seconds: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {seconds:g} s")


def sample_rss(replicas: list[Replica], stopping: threading.Event) -> None:
    while not stopping.wait(1.0):
        for replica in replicas:
            replica.sample()


def file_jobs(jobs: dict[str, dict], settled: float) -> dict:
    """The file jobs by how they ended, the failed ones by their error, and those left queued or running."""
    ends = Counter(job["status"] for job in jobs.values())
    errors = Counter(job.get("error", "") for job in jobs.values() if job["status"] == "failed")
    unended = sum(ends[s] for s in ends if s not in JOB_ENDS)
    return {"sent": len(jobs), "by_status": dict(sorted(ends.items())), "failed_by_error": dict(errors.most_common()),
            "unended": unended, "followed_after_the_load_s": round(settled, 1)}  # fmt: skip


def report(args, run: Path, load: Load, events: list[dict], replicas: list[Replica], wall: float, settled: float):
    records = load.records
    requests = summary(records)
    jobs = file_jobs(load.jobs, settled)
    phases = requests["by_phase"]
    killed = next(e for e in events if e["what"].endswith("SIGKILL"))
    # In flight at the kill: sent before the replica was gone, answered (or not) after the signal. Those on the killed
    # replica may be lost; no other request may be (nginx passes a refused connection to the other replica).
    signalled, exited = killed["window"]
    flying = [r for r in records if r.start <= exited and r.start + r.seconds >= signalled]
    lost = [r for r in records if r.outcome == "lost"]
    # A 502 names the replica that failed it; a request whose answer the replica had begun has none (nginx cuts it).
    elsewhere = [r for r in lost if r not in flying or (r.upstream and f":{killed['replica']}" not in r.upstream)]
    lives = [{"replica": r.name, **life} for r in replicas for life in r.lives]
    growth = max(life["rss_max_mb"] - life["rss_start_mb"] for life in lives)  # each process, over its life
    bounds = {
        "lost_in_rolling_restart": phases.get("rolling_restart", {}).get("lost", 0),
        "lost_while_redis_paused": phases.get("redis_paused", {}).get("lost", 0),
        "lost_at_sigkill": sum(r.outcome == "lost" for r in flying),
        "in_flight_at_sigkill": len(flying),
        "lost_but_not_in_flight_on_the_killed_replica": len(elsewhere),
        "p99_while_redis_paused_s": phases.get("redis_paused", {}).get("p99_s"),
        "rss_growth_mb_most": round(growth, 1),
        "rss_growth_bound_mb": 150.0,
        "file_jobs_unended": jobs["unended"],
    }
    bounds["held"] = (
        bounds["lost_in_rolling_restart"] == 0
        and bounds["lost_while_redis_paused"] == 0
        and bounds["lost_but_not_in_flight_on_the_killed_replica"] == 0
        and (bounds["p99_while_redis_paused_s"] or 0) < 15.0
        and growth < bounds["rss_growth_bound_mb"]
        and jobs["unended"] == 0
    )
    origin = events[0]["at"] - events[0]["at_s"]
    lost_requests = [
        {"kind": r.kind, "phase": r.phase, "sent_at_s": round(r.start - origin, 3), "seconds": round(r.seconds, 3),
         "status": r.status, "upstream": r.upstream, "error": r.error}
        for r in lost
    ]  # fmt: skip
    return {
        "what": "two nanomt serve replicas behind nginx on one Redis under a mixed load while Redis is stopped and "
        "resumed, each replica restarted with SIGTERM in turn, and one killed with SIGKILL (benchmarks/chaos.py)",
        "command": "python -m benchmarks.chaos"
        + (f" --checkpoint {shown(run)}" if args.checkpoint else "")
        + f" --seconds {args.seconds:g} --clients {args.clients}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "setup": {
            "replicas": 2,
            "clients": args.clients,
            "seconds": round(wall, 1),
            "checkpoint": shown(run) if args.checkpoint else "a toy run trained for it (nanomt demo --steps 60)",
            "nginx": version([NGINX, "-v"]),
            "redis": version([REDIS, "--version"]),
            "redis_policy": "maxmemory 256mb, maxmemory-policy noeviction",
            "kinds": KINDS,
        },  # fmt: skip
        "faults": [{k: v for k, v in e.items() if k not in ("at", "replica", "window")} for e in events],
        "requests": requests,
        "lost_requests": lost_requests,
        "file_jobs": jobs,
        "replicas": lives,
        "nginx_retries": RETRIES,
        "bounds": bounds,
    }


def version(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().splitlines()[0]


if __name__ == "__main__":
    sys.exit(main())
