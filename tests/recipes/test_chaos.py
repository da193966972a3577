"""The chaos run's harness (benchmarks/chaos.py) without its run: Debian's nginx takes its configuration, and its
accounting classes every answer (a 502 from nginx is a lost request, a bad request's expected 4xx is ok)."""

import subprocess
from pathlib import Path

from servers import missing

from benchmarks.chaos import NGINX, NGINX_CONF, Record, summary


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
