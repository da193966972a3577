"""The SQLite store's hygiene: two processes writing one file at once lose nothing, idle clients' rate rows are
swept, reads never wait for another process's write, and opening a large store does not scan it."""

import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from nanomt.serve.store import StoreError, open_store
from nanomt.serve.store import sqlite as sqlite_store
from nanomt.serve.store.sqlite import SqliteStore

WRITER = """
import sys
from nanomt.serve.store import open_store
store, me = open_store(sys.argv[1]), sys.argv[2]
for i in range(int(sys.argv[3])):
    assert store.hit("nanomt:rate:shared", 10**9, 3600.0).allowed
    store.put(f"nanomt:v:{me}:{i}", b"x", bounds=(("nanomt:group:all", 10**9),))
"""


@pytest.mark.slow  # two Python processes
def test_two_processes_writing_one_file_at_once_lose_nothing(tmp_path):
    url, n = f"sqlite:///{tmp_path}/store.db", 300
    open_store(url).close()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, url, me, str(n)], stderr=subprocess.PIPE, text=True)
        for me in ("a", "b")
    ]
    for proc in procs:
        assert proc.wait(120) == 0, proc.stderr.read()  # no "database is locked"
    store = open_store(url)
    assert store.count("nanomt:group:all") == 2 * n and len(store.scan("nanomt:v:")) == 2 * n
    assert not store.hit("nanomt:rate:shared", 2 * n, 3600.0, count=False).allowed  # every hit of both counted
    assert store.hit("nanomt:rate:shared", 2 * n + 1, 3600.0, count=False).allowed


def test_idle_clients_rate_rows_are_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store, "SWEEP_EVERY", 50)
    now = [0.0]
    store = SqliteStore(str(tmp_path / "store.db"), clock=lambda: now[0])
    for i in range(49):
        store.hit(f"nanomt:rate:ip:10.0.0.{i}", 5, 60.0)
    now[0] = 61.0
    store.hit("nanomt:rate:later", 5, 60.0)  # the 50th sweeps every client's past rows
    rows = sqlite3.connect(tmp_path / "store.db").execute("SELECT DISTINCT client FROM hits").fetchall()
    assert rows == [("nanomt:rate:later",)]  # before: a row for every client ever seen, forever


def test_reads_never_wait_for_another_processs_write(tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    store = open_store(url)
    store.put("nanomt:k", b"v")
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    try:
        start = time.monotonic()
        assert store.get("nanomt:k") == b"v" and store.scan("nanomt:") == [("nanomt:k", b"v")]
        assert time.monotonic() - start < 1.0  # before: every read took the write lock and waited for it
    finally:
        other.execute("ROLLBACK")


def test_opening_a_store_reads_its_schema_not_its_whole_file(tmp_path, monkeypatch):
    path = tmp_path / "store.db"
    store = open_store(f"sqlite:///{path}")
    for i in range(2000):
        store.put(f"nanomt:cache:{i}", bytes(4096))
    store.close()
    statements, connect = [], sqlite3.connect

    def traced(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(sqlite_store.sqlite3, "connect", traced)
    open_store(f"sqlite:///{path}").close()
    assert not [s for s in statements if "check" in s.lower()], statements  # before: PRAGMA quick_check, every page
    monkeypatch.undo()
    path.write_bytes(b"not a database " * 1000)
    with pytest.raises(StoreError, match="cannot use it"):
        open_store(f"sqlite:///{path}")


def test_many_threads_of_one_process_share_the_store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    errors = []

    def work(me: int):
        try:
            for i in range(50):
                store.put(f"nanomt:t:{me}:{i}", b"x")
                assert store.get(f"nanomt:t:{me}:{i}") == b"x"
        except Exception as e:  # noqa: BLE001 - every thread's failure reported
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(store.scan("nanomt:t:")) == 200
