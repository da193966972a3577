"""API keys and limits (nanomt.serve.keys): keys file, lookups in constant time, the per-minute limiter of every store
(memory, SQLite, a real Redis) on a fake clock against a brute-force reference."""

from __future__ import annotations

import hashlib
import io
import random

import pytest

from nanomt.serve import keys
from nanomt.serve.keys import WINDOW_S, KeyRing, KeysFileError, Limits, hash_key, key_line, new_key
from nanomt.serve.store import MemoryStore
from nanomt.serve.store import memory as memory_store


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------------------------------------
# The keys file.
# ---------------------------------------------------------------------------------------------------------

# Keys that are prefixes, suffixes and case variants of each other: none may find another's entry.
PLAIN = ["alpha-key", "alpha-key2", "ALPHA-KEY", "2alpha-key", "b"]


def write(tmp_path, text: str):
    path = tmp_path / "keys.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def ring(tmp_path) -> KeyRing:
    lines = ["# the team's keys", ""]
    for i, key in enumerate(PLAIN):
        lines.append(f"{hash_key(key)}  name=k{i}  req_limit={10 + i}  char_limit={100 * (i + 1)}  # comment")
    return KeyRing.load(write(tmp_path, "\n".join(lines) + "\n"))


def test_hash_is_sha256_hex_of_the_utf8_key():
    assert hash_key("s3cret") == "sha256:" + hashlib.sha256(b"s3cret").hexdigest()
    assert hash_key("Schlüssel") == "sha256:" + hashlib.sha256("Schlüssel".encode()).hexdigest()


def test_each_key_finds_its_own_entry_and_no_other(ring):
    for i, key in enumerate(PLAIN):
        found = ring.find(key)
        assert found is not None and found.name == f"k{i}"
        assert found.limits == Limits(req_limit=10 + i, char_limit=100 * (i + 1))
    for wrong in ["", None, "alpha", "alpha-key ", "c", hash_key("alpha-key"), hash_key("alpha-key")[7:]]:
        assert ring.find(wrong) is None, wrong


def test_every_lookup_compares_every_entry_with_compare_digest(ring, monkeypatch):
    """Constant time: the match's position (first, last, none) does not change what is compared, nor how."""
    calls = []

    def spy(a, b):
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    for presented in [PLAIN[0], PLAIN[-1], "no such key"]:
        calls.clear()
        ring.find(presented)
        assert len(calls) == len(PLAIN)
        assert {b for _, b in calls} == {hashlib.sha256(k.encode()).digest() for k in PLAIN}
        assert {a for a, _ in calls} == {hashlib.sha256(presented.encode()).digest()}


def test_limits_left_out_are_the_defaults(tmp_path):
    text = f"{hash_key('a')}\n{hash_key('b')} req_limit=none\n{hash_key('c')} char_limit=7 name=c\n"
    ring = KeyRing.load(write(tmp_path, text), default=Limits(req_limit=30, char_limit=500))
    assert ring.find("a").limits == Limits(30, 500)
    assert ring.find("a").name == "key-" + hashlib.sha256(b"a").hexdigest()[:8]
    assert ring.find("b").limits == Limits(None, 500)
    assert ring.find("c").limits == Limits(30, 7)


@pytest.mark.parametrize(
    "line, problem",
    [
        ("my-plain-key name=a", "not the key itself"),
        ("sha256:abc", "64 lowercase hex digits"),
        (hash_key("a").upper().replace("SHA256", "sha256"), "64 lowercase hex digits"),
        (f"{hash_key('a')} colour=blue", "unknown field 'colour=blue'"),
        (f"{hash_key('a')} req_limit", "unknown field 'req_limit'"),
        (f"{hash_key('a')} req_limit=ten", "req_limit=ten: a positive integer"),
        (f"{hash_key('a')} char_limit=0", "char_limit=0: a positive integer"),
        (f"{hash_key('a')} req_limit=-5", "req_limit=-5: a positive integer"),
        (f"{hash_key('a')} req_limit=1 req_limit=2", "req_limit given twice"),
        (f"{hash_key('a')} name=a/b", "name 'a/b'"),
        (f"{hash_key('x')} name=first", "the same key as an earlier line"),
        (f"{hash_key('y')} name=first", "the same name 'first' as an earlier line"),
    ],
)
def test_a_malformed_line_is_one_error_naming_file_and_line(tmp_path, line, problem):
    path = write(tmp_path, f"# keys\n{hash_key('x')} name=first\n{line}\n")
    with pytest.raises(KeysFileError) as e:
        KeyRing.load(path)
    message = str(e.value)
    assert message.startswith(f"{path}:3: ") and problem in message and "\n" not in message


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_a_file_without_keys_is_refused(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(KeysFileError, match=f"^{path}: no keys"):
        KeyRing.load(path)


def test_missing_or_binary_file_is_one_line(tmp_path):
    with pytest.raises(KeysFileError, match="no such keys file"):
        KeyRing.load(tmp_path / "absent.txt")
    path = tmp_path / "binary"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(KeysFileError, match="cannot read the keys file"):
        KeyRing.load(path)


def test_key_lines_and_the_command_write_loadable_lines(tmp_path, monkeypatch, capsys):
    key = new_key()
    assert len(key) >= 43 and key != new_key()
    keys.main(["new", "--name", "ops", "--req-limit", "5"])
    out, err = capsys.readouterr()
    made = err.split(": ")[-1].strip()
    monkeypatch.setattr("sys.stdin", io.StringIO("piped-key\n"))
    keys.main(["hash", "--char-limit", "9"])
    piped = capsys.readouterr().out
    path = write(tmp_path, out + piped + key_line(key, "third") + "\n")
    ring = KeyRing.load(path, default=Limits(60, 1000))
    assert ring.find(made).name == "ops" and ring.find(made).limits == Limits(5, 1000)
    assert ring.find("piped-key").limits == Limits(60, 9)
    assert ring.find(key).name == "third" and made not in path.read_text()
    with pytest.raises(SystemExit):
        keys.main(["new", "--req-limit", "0"])


def test_the_command_takes_none_the_files_own_word_for_no_limit(tmp_path, capsys):
    keys.main(["new", "--name", "batch-jobs", "--req-limit", "none", "--char-limit", "7"])
    out, err = capsys.readouterr()
    assert out.strip().endswith("name=batch-jobs  req_limit=none  char_limit=7")
    ring = KeyRing.load(write(tmp_path, out), default=Limits(60, 1000))
    assert ring.find(err.split(": ")[-1].strip()).limits == Limits(None, 7)  # none: no limit, not the default
    with pytest.raises(SystemExit):
        keys.main(["new", "--req-limit", "nothing"])


def test_chars_per_request():
    assert Limits(char_limit=10).allows_chars(10) and not Limits(char_limit=10).allows_chars(11)
    assert Limits().allows_chars(10**9)
    with pytest.raises(ValueError, match="char_limit"):
        Limits(char_limit=0)


# ---------------------------------------------------------------------------------------------------------
# The limiter.
# ---------------------------------------------------------------------------------------------------------


def reference_decisions(times: list[float], limit: int) -> list[tuple[bool, int]]:
    """Brute force: accept iff fewer than `limit` accepted requests lie in (t - 60, t]; a refusal waits the fewest
    whole seconds after which a request would be accepted."""
    accepted: list[float] = []

    def room(t: float) -> bool:
        return sum(1 for a in accepted if t - 60 < a <= t) < limit

    out = []
    for t in times:
        if room(t):
            accepted.append(t)
            out.append((True, 0))
        else:
            wait = next(s for s in range(1, 62) if sum(1 for a in accepted if a > t + s - 60) < limit)
            out.append((False, wait))
    return out


def limiter_of(kind: str, clock: FakeClock, request, tmp_path):
    """The counter of a store of this kind, reading `clock`."""
    if kind == "memory":
        return MemoryStore(clock)
    if kind == "sqlite":
        from nanomt.serve.store.sqlite import SqliteStore

        return SqliteStore(str(tmp_path / "limits.db"), clock=clock)
    from nanomt.serve.store.redis import RedisStore

    server = request.getfixturevalue("redis_server")
    server.flush()
    return RedisStore(server.url, clock=clock)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
@pytest.mark.parametrize("limit, seed", [(1, 0), (3, 1), (5, 2), (20, 3)])
def test_limiter_equals_the_brute_force_reference(kind, limit, seed, request, tmp_path):
    rng = random.Random(seed)
    clock = FakeClock(0.0)
    limiter = limiter_of(kind, clock, request, tmp_path)
    times, t = [], 0.0
    while len(times) < 400:  # bursts of up to twice the limit, then pauses; times on and off whole seconds
        for _ in range(rng.randint(1, 2 * limit)):
            t += rng.choice([0.0, 0.25, 1.0, 2.5])
            times.append(t)
        t += rng.choice([3.5, 7.0, 29.75, 60.0, 61.0])
    got = []
    for t in times:
        clock.now = t
        d = limiter.hit("alice", limit, WINDOW_S)
        got.append((d.allowed, d.retry_after))
    assert got == reference_decisions(times, limit)
    assert sum(a for a, _ in got) > limit and not all(a for a, _ in got)


def test_retry_after_is_honest():
    """Refused at t with Retry-After s: refused again before t + s - 1, allowed at t + s."""
    clock = FakeClock()
    limiter = MemoryStore(clock)
    for _ in range(3):
        assert limiter.hit("k", 3, WINDOW_S).allowed
        clock.now += 10.4
    refused = limiter.hit("k", 3, WINDOW_S)
    assert not refused.allowed and refused.retry_after == 29  # the first of 3 leaves the window at +60 s
    start = clock.now
    clock.now = start + refused.retry_after - 1
    assert not limiter.hit("k", 3, WINDOW_S).allowed
    clock.now = start + refused.retry_after
    assert limiter.hit("k", 3, WINDOW_S).allowed


def test_clients_are_counted_apart():
    clock = FakeClock()
    limiter = MemoryStore(clock)
    assert limiter.hit("a", 1, WINDOW_S).allowed and not limiter.hit("a", 1, WINDOW_S).allowed
    assert limiter.hit("b", 1, WINDOW_S).allowed


def test_idle_clients_are_forgotten(monkeypatch):
    monkeypatch.setattr(memory_store, "SWEEP_EVERY", 100)
    clock = FakeClock()
    limiter = MemoryStore(clock)
    for i in range(99):
        limiter.hit(f"10.0.0.{i}", 5, WINDOW_S)
    assert len(limiter._windows) == 99
    clock.now += 61
    limiter.hit("later", 5, WINDOW_S)  # the 100th check sweeps the idle ones
    assert len(limiter._windows) == 1
