"""`nanomt memory export|import`: a server's translation memory (corrections sent to /suggest) out as a corpus (TSV)
or TMX, and TMX files in."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def memory(args: argparse.Namespace) -> None:
    from nanomt.serve.breaker import Guarded
    from nanomt.serve.store import TranslationMemory, memory_tmx, memory_tsv, open_store, read_tmx

    store = open_store(args.store)
    try:
        tm = TranslationMemory(Guarded(store))
        if args.action == "export":
            entries = [e for e in tm.entries() if args.pair is None or e["pair"] == args.pair]
            pairs = sorted({e["pair"] for e in entries})
            if args.format == "tsv" and len(pairs) > 1:
                held = ", ".join(pairs)
                raise ValueError(f"{args.store} holds corrections of {held}: a TSV corpus is one pair, give --pair")
            text = memory_tsv(entries) if args.format == "tsv" else memory_tmx(entries)
            if args.out:
                Path(args.out).write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
            print(f"{len(entries)} corrections exported", file=sys.stderr)
        else:
            path = Path(args.file)
            units = read_tmx(path.read_text(encoding="utf-8"), str(path))
            for pair, source, translation in units:
                if args.pair is None or pair == args.pair:
                    tm.add(pair, source, translation)
            print(f"{len(units)} corrections imported into {args.store}", file=sys.stderr)
    finally:
        store.close()
