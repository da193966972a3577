"""`nanomt memory ACTION STORE`: a server's translation memory (corrections sent to /suggest). export: the served
corrections as a corpus (TSV) or TMX; import: a TMX file's units served; pending: the suggestions awaiting review;
approve|reject ID...: serve or drop them; list: the served corrections; delete ID...: stop serving them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def memory(args: argparse.Namespace) -> None:
    from nanomt.serve.corrections import TranslationMemory
    from nanomt.serve.store import Layout, StoreDown, open_store, redacted

    url = args.store
    store = open_store(url)  # unreachable: a StoreError naming it, in one line
    try:
        tm = TranslationMemory(store, Layout(args.namespace))
        ACTIONS[args.action](tm, args, redacted(url))
    except StoreDown as e:
        raise ValueError(f"{e}: nothing was {'written' if args.action == 'export' else 'changed'}") from None
    finally:
        store.close()


def export(tm, args, url: str) -> None:
    from nanomt.serve.corrections import memory_tmx, memory_tsv

    entries = [e for e in tm.entries() if args.pair is None or e["pair"] == args.pair]
    pairs = sorted({e["pair"] for e in entries})
    if args.format == "tsv" and len(pairs) > 1:
        raise ValueError(f"{url} holds corrections of {', '.join(pairs)}: a TSV corpus is one pair, give --pair")
    text = memory_tsv(entries) if args.format == "tsv" else memory_tmx(entries)
    if args.out:
        write_atomically(Path(args.out), text)
    else:
        sys.stdout.write(text)
    print(f"{len(entries)} corrections exported from {url}", file=sys.stderr)


def write_atomically(path: Path, text: str) -> None:
    """The whole file or the old one, never half of it: written beside it, synced, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def import_(tm, args, url: str) -> None:
    from nanomt.serve.corrections import read_tmx

    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    units = [u for u in read_tmx(path.read_text(encoding="utf-8"), str(path)) if args.pair in (None, u[0])]
    statuses = [tm.add(pair, source, translation) for pair, source, translation in units]
    if "full" in statuses:
        print(f"{statuses.count('full')} units not imported: the memory holds as many as it may", file=sys.stderr)
    print(f"{statuses.count('served')} corrections imported into {url}", file=sys.stderr)


def show(entries: list[dict], as_json: bool) -> None:
    """One entry a line: its id, pair, sender, source and translation (tab-separated), or JSON lines."""
    for e in entries:
        flat = lambda text: " ".join(text.split())  # noqa: E731
        line = (
            json.dumps(e, ensure_ascii=False)
            if as_json
            else "\t".join([e["id"], e["pair"], e.get("by", ""), flat(e["source"]), flat(e["translation"])])
        )
        print(line)


def pending(tm, args, url: str) -> None:
    found = [e for e in tm.pending() if args.pair in (None, e["pair"])]
    show(found, args.json)
    print(f"{len(found)} suggestions await review in {url}", file=sys.stderr)


def listed(tm, args, url: str) -> None:
    found = sorted((e for e in tm.entries() if args.pair in (None, e["pair"])), key=lambda e: e.get("at", 0))
    show(found, args.json)
    print(f"{len(found)} corrections served from {url}", file=sys.stderr)


def each(verb: str, act):
    """An action on ids: every id acted on, or one line naming those that are not there (exit status 1)."""

    def run(tm, args, url: str) -> None:
        results = {id_: act(tm, id_) for id_ in args.ids}
        done = [i for i, r in results.items() if r not in (None, False, "full")]
        print(f"{len(done)} {verb} in {url}", file=sys.stderr)
        full = [i for i, r in results.items() if r == "full"]
        if full:
            raise ValueError(f"not approved, the memory holds as many corrections as it may: {' '.join(full)}")
        missing = [i for i, r in results.items() if r in (None, False)]
        if missing:
            raise ValueError(f"no such {'correction' if verb == 'deleted' else 'suggestion'}: {' '.join(missing)}")

    return run


ACTIONS = {
    "export": export,
    "import": import_,
    "pending": pending,
    "list": listed,
    "approve": each("approved", lambda tm, i: tm.approve(i)),
    "reject": each("rejected", lambda tm, i: tm.reject(i)),
    "delete": each("deleted", lambda tm, i: tm.delete(i)),
}
