"""The chaos run's harness (benchmarks/chaos.py) without its run: Debian's nginx takes its configuration, and its
accounting classes every answer (a 502 from nginx is a lost request, a bad request's expected 4xx is ok) and every
file job (one left queued or running is counted against the bounds)."""

import subprocess
from pathlib import Path

from servers import missing

from benchmarks.chaos import NGINX, NGINX_CONF, Record, file_jobs, summary


def test_nginx_takes_the_chaos_runs_configuration(tmp_path):
    if not Path(NGINX).is_file():
        missing("no nginx binary (Debian: apt-get install nginx)")
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / sub).mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp_path, a=18001, b=18002, port=18000))
    out = subprocess.run([NGINX, "-t", "-c", str(conf), "-p", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0 and "syntax is ok" in out.stderr, out.stderr


def test_every_answer_is_classed_by_kind_and_phase():
    records = [
        Record("text", "steady", 200, 200, 0.0, 0.1),
        Record("bad", "steady", 413, 413, 0.0, 0.01),  # the 4xx a bad request expects: ok
        Record("file", "redis_paused", 503, 200, 1.0, 0.5),  # answered, failed
        Record("text", "sigkill", 502, 200, 2.0, 0.2),  # nginx's: the replica went away with it
        Record("text", "sigkill", None, 200, 2.0, 0.3),  # no answer at all
    ]
    got = summary(records)
    assert {k: got["all"][k] for k in ("sent", "answered", "ok", "failed", "lost")} == {
        "sent": 5, "answered": 4, "ok": 2, "failed": 1, "lost": 2,
    }  # fmt: skip
    assert got["all"]["failed_by_status"] == {"503": 1}
    assert got["by_phase"]["sigkill"]["lost"] == 2 and got["by_kind"]["bad"]["ok"] == 1


def test_file_jobs_are_counted_by_how_they_ended_and_those_left_unended():
    stopped = "the replica running the job stopped before it ended (no word from it in 60 s)"
    jobs = {
        "a": {"status": "done"},
        "b": {"status": "failed", "error": stopped},
        "c": {"status": "failed", "error": stopped},
        "d": {"status": "failed", "error": "the server stopped before the file was translated"},
        "e": {"status": "running"},
        "f": {"status": "queued"},
    }
    got = file_jobs(jobs, 12.34)
    assert got["by_status"] == {"done": 1, "failed": 3, "queued": 1, "running": 1}
    assert got["failed_by_error"] == {stopped: 2, "the server stopped before the file was translated": 1}
    assert got["unended"] == 2 and got["sent"] == 6 and got["followed_after_the_load_s"] == 12.3
