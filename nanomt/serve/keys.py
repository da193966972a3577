"""API keys and their limits, as LibreTranslate has them: a keys file (hashed at rest) and a per-key rate limiter.

The keys file holds one key a line, as its SHA-256 hash, with optional per-key limits:

    # name and limits are optional; a limit left out is the server's default
    sha256:<64 hex digits>  name=alice  req_limit=60  char_limit=5000
    sha256:<64 hex digits>  name=batch-jobs  req_limit=none
    sha256:<64 hex digits>  name=reviewer  trusted=yes

req_limit is requests per minute (a sliding window of 60 s), char_limit characters per request; `none` means no
limit. trusted=yes: the key's corrections (POST /suggest) answer every user at once; anyone else's wait for review.
Keys are random tokens (`new_key`), so one unsalted SHA-256 is enough to keep them unreadable at rest while a
request's key is found with one hash; `python -m nanomt.serve.keys new|hash` writes the lines.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

HASH_PREFIX = "sha256:"
HASH_RE = re.compile(r"sha256:([0-9a-f]{64})")
NAME_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
FIELDS = ("name", "req_limit", "char_limit", "trusted")
WINDOW_S = 60.0  # req_limit counts requests per minute


class KeysFileError(ValueError):
    """A keys file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Limits:
    """What one client may do: requests per minute and characters per request (None: no limit)."""

    req_limit: int | None = None
    char_limit: int | None = None

    def __post_init__(self):
        for name in ("req_limit", "char_limit"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")

    def allows_chars(self, chars: int) -> bool:
        """Whether a request of `chars` characters is within char_limit."""
        return self.char_limit is None or chars <= self.char_limit


@dataclass(frozen=True)
class ApiKey:
    """One key of the file: a name for logs and metrics (never the key), the key's hash, its limits, and whether its
    corrections are trusted."""

    name: str
    digest: bytes  # SHA-256 of the key
    limits: Limits
    trusted: bool = False


def new_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The form a key takes in the keys file: 'sha256:' and the hex digest of its UTF-8 bytes."""
    return HASH_PREFIX + _digest(key).hex()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def key_line(
    key: str, name: str | None = None, req_limit: int | str | None = None, char_limit=None, trusted: bool = False
) -> str:
    """The keys file line of a plain key, with the limits given (those left out are the server's defaults; "none":
    no limit), trusted=yes for a key whose corrections answer every user."""
    fields = [hash_key(key)]
    given = (("name", name), ("req_limit", req_limit), ("char_limit", char_limit), ("trusted", "yes" * trusted))
    fields += [f"{k}={v}" for k, v in given if v]
    return "  ".join(fields)


class KeyRing:
    """The keys of a keys file; `find` answers a presented key with its own entry, and nothing else."""

    def __init__(self, keys: list[ApiKey]):
        self._keys = tuple(keys)

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, path: str | Path, default: Limits = Limits()) -> KeyRing:
        """Read a keys file; limits a line leaves out are `default`'s. Raises KeysFileError naming file and line."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeysFileError(f"{path}: no such keys file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise KeysFileError(f"{path}: cannot read the keys file ({e.__class__.__name__})") from None
        keys: list[ApiKey] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                key = _parse_line(line, default)
            except ValueError as e:
                raise KeysFileError(f"{path}:{number}: {e}") from None
            for other in keys:
                if other.digest == key.digest or other.name == key.name:
                    what = "key" if other.digest == key.digest else f"name {key.name!r}"
                    raise KeysFileError(f"{path}:{number}: the same {what} as an earlier line")
            keys.append(key)
        if not keys:
            raise KeysFileError(f"{path}: no keys (one 'sha256:<hex> [name=...] [req_limit=N] [char_limit=N]' a line)")
        return cls(keys)

    def find(self, presented: str | None) -> ApiKey | None:
        """The entry of the presented key, or None; every entry is compared, in constant time, whatever matches."""
        if not presented:
            return None
        digest, found = _digest(presented), None
        for key in self._keys:  # no early exit: the time taken does not tell which entry matched
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found


def _parse_line(line: str, default: Limits) -> ApiKey:
    """One non-empty line of a keys file."""
    first, *rest = line.split()
    match = HASH_RE.fullmatch(first)
    if match is None:
        if first.startswith(HASH_PREFIX):
            raise ValueError("the hash must be 'sha256:' and 64 lowercase hex digits")
        raise ValueError(
            "a line starts with a key's hash ('sha256:<hex>'), not the key itself: "
            "write it with `python -m nanomt.serve.keys hash`"
        )
    fields: dict[str, str] = {}
    for item in rest:
        name, sep, value = item.partition("=")
        if not sep or name not in FIELDS:
            raise ValueError(f"unknown field {item!r} (fields: {', '.join(f + '=...' for f in FIELDS)})")
        if name in fields:
            raise ValueError(f"{name} given twice")
        fields[name] = value
    name = fields.get("name", f"key-{match.group(1)[:8]}")
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"name {name!r}: use 1-64 letters, digits and _ . @ -")
    limits = Limits(
        req_limit=_limit(fields, "req_limit", default.req_limit),
        char_limit=_limit(fields, "char_limit", default.char_limit),
    )
    trusted = fields.get("trusted", "no")
    if trusted not in ("yes", "no"):
        raise ValueError(f"trusted={trusted}: yes or no")
    return ApiKey(name=name, digest=bytes.fromhex(match.group(1)), limits=limits, trusted=trusted == "yes")


def _limit(fields: dict[str, str], name: str, default: int | None) -> int | None:
    """A limit field: a positive integer, 'none' (no limit), or the default when absent."""
    if name not in fields:
        return default
    value = fields[name]
    if value == "none":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{name}={value}: a positive integer, or none for no limit")
    return int(value)


def _limit_arg(text: str) -> int | str:
    """A limit flag: an integer, or the keys file's own word `none` (no limit)."""
    if text == "none":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive integer, or none for no limit") from None


def main(argv: list[str] | None = None) -> None:
    """`python -m nanomt.serve.keys new|hash`: write a keys file line for a new key, or for a key read from stdin."""
    p = argparse.ArgumentParser(prog="python -m nanomt.serve.keys", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("new", "make a random key; print it and its line"), ("hash", "the line of a key on stdin")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--name", default=None, help="the key's name in logs and metrics")
        s.add_argument(
            "--trusted", action="store_true", help="its corrections (POST /suggest) answer every user without review"
        )
        for flag, what in (("--req-limit", "requests per minute"), ("--char-limit", "characters per request")):
            s.add_argument(flag, type=_limit_arg, default=None, help=f"{what}, or none (default: the server's)")
    args = p.parse_args(argv)
    if args.name is not None and not NAME_RE.fullmatch(args.name):
        p.error(f"--name {args.name!r}: use 1-64 letters, digits and _ . @ -")
    try:
        Limits(*(None if v == "none" else v for v in (args.req_limit, args.char_limit)))
    except ValueError as e:
        p.error(str(e).replace("_", "-"))
    if args.command == "new":
        key = new_key()
        print(f"key (give it to the client; it is not stored): {key}", file=sys.stderr)
    else:
        key = sys.stdin.readline().strip()
        if not key:
            p.error("no key on stdin")
    print(key_line(key, args.name, args.req_limit, args.char_limit, args.trusted))


if __name__ == "__main__":
    main()
