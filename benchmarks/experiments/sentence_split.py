"""Sentence splitters on real news text: boundary precision and recall, speed, languages, import cost, weight.

    python -m benchmarks.experiments.sentence_split [--news DIR] [--out FILE]   # benchmarks/results/sentence_split.json

Paragraphs are made from the WMT news test sets (DIR/*.de and DIR/*.en, one segment a line) by joining 2-6
consecutive lines with one space, so the true boundaries are the joins. A splitter's boundaries are the start
offsets of the sentences it returns, after the first; precision and recall count them against the joins, and a
paragraph is recovered when its boundaries are exactly the joins. Two things every splitter pays alike: a line that
itself holds two sentences ("Was soll sie tun, die ČSSD? Die tschechischen ...") turns a right split into a false
positive, and a headline without a full stop hides its join. The `punctuated` rows count only the paragraphs whose
lines all end in sentence-final punctuation, where a boundary is there to be seen. `keeps_text` is the share of
paragraphs whose sentences hold every non-space character of the paragraph, in order (nothing lost or rewritten).

Speed is gold sentences split a second, one thread, the best of 3 passes over the first 500 paragraphs. Import
cost is measured in a fresh interpreter (`--probe NAME`): seconds and resident memory added by importing the
library, building its splitter and splitting one sentence (not for nanomt.documents.sentences).
Weight is the installed size of the distribution's files, and of the distributions it always requires. The
candidates are imported lazily: a missing one is reported as missing, not a failure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from benchmarks.harness import SENTENCE_END, paragraphs
from scripts.common import DEFAULT_NEWS, RESULTS, ROOT, machine, shown, write_results

DEFAULT_OUT = RESULTS / "sentence_split.json"
LANGS = ("de", "en")
SPEED_PARAGRAPHS = 500  # the first paragraphs of news-test2008, about 2,000 sentences

Splitter = Callable[[str], list[str]]


def _sentencex(lang: str) -> Splitter:
    import sentencex

    return lambda text: sentencex.segment(lang, text)


def _pysbd(lang: str) -> Splitter:
    import pysbd

    seg = pysbd.Segmenter(language=lang, clean=False)
    return seg.segment


def _moses(lang: str) -> Splitter:
    from sentence_splitter import SentenceSplitter

    return SentenceSplitter(language=lang).split


def _blingfire(lang: str) -> Splitter:
    import blingfire

    return lambda text: blingfire.text_to_sentences(text).split("\n")


def _nanomt(lang: str) -> Splitter:
    from nanomt.documents.sentences import split_sentences

    return lambda text: split_sentences(text, lang)


# name: (factory, distribution on the package index, module imported)
CANDIDATES: dict[str, tuple[Callable[[str], Splitter], str, str]] = {
    "sentencex": (_sentencex, "sentencex", "sentencex"),
    "pysbd": (_pysbd, "pysbd", "pysbd"),
    "sentence-splitter": (_moses, "sentence-splitter", "sentence_splitter"),
    "blingfire": (_blingfire, "blingfire", "blingfire"),
    "nanomt.documents.sentences": (_nanomt, "", "nanomt.documents.sentences"),
}


def joins(sentences: list[str]) -> set[int]:
    """The start offsets of sentences 2..n in `" ".join(sentences)`."""
    starts, pos = set(), 0
    for s in sentences[:-1]:
        pos += len(s) + 1
        starts.add(pos)
    return starts


def boundaries(text: str, parts: list[str]) -> tuple[set[int], bool]:
    """Start offsets (after the first) of `parts` found in order in `text`; whether they hold all of its text."""
    found, pos = set(), 0
    for part in parts:
        part = part.strip()
        if not part:
            continue
        at = text.find(part, pos)
        if at < 0:
            return found, False
        if at > 0:
            found.add(at)
        pos = at + len(part)
    squeeze = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    return found, squeeze("".join(parts)) == squeeze(text)


def score(split: Splitter, paras: list[list[str]]) -> dict:
    """Boundary precision/recall/F1, paragraphs recovered, text kept."""
    texts = [" ".join(p) for p in paras]
    tp = fp = fn = recovered = kept = 0
    for para, text in zip(paras, texts):
        gold = joins(para)
        found, whole = boundaries(text, split(text))
        tp, fp, fn = tp + len(found & gold), fp + len(found - gold), fn + len(gold - found)
        recovered += found == gold
        kept += whole
    precision, recall = tp / max(1, tp + fp), tp / max(1, tp + fn)
    return {
        "paragraphs": len(paras),
        "boundaries": tp + fn,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(2 * precision * recall / max(1e-9, precision + recall), 4),
        "paragraphs_recovered": round(recovered / len(paras), 4),
        "keeps_text": round(kept / len(paras), 4),
    }


def speed(split: Splitter, paras: list[list[str]], repeats: int = 3) -> int:
    """Gold sentences split a second: the best of `repeats` passes over `paras`, after a warm-up paragraph."""
    texts = [" ".join(p) for p in paras]
    split(texts[0])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for text in texts:
            split(text)
        best = min(best, time.perf_counter() - t0)
    return round(sum(map(len, paras)) / best)


def languages(name: str) -> dict:
    """The languages a candidate has rules for, and what it does with another language code."""
    if name == "pysbd":
        from pysbd.languages import LANGUAGE_CODES

        return {"count": len(LANGUAGE_CODES), "codes": sorted(LANGUAGE_CODES), "unknown_code": "ValueError"}
    if name == "sentence-splitter":
        import sentence_splitter

        prefixes = Path(sentence_splitter.__file__).parent / "non_breaking_prefixes"
        codes = sorted(p.stem for p in prefixes.glob("*.txt"))
        return {"count": len(codes), "codes": codes, "unknown_code": "SentenceSplitterException"}
    if name == "blingfire":
        return {"count": None, "codes": "one model for all languages, no abbreviation lists", "unknown_code": "-"}
    return {
        "count": "about 300 (its documentation)",
        "codes": "rules for a few dozen; other codes fall back along a chain of related languages to English",
        "unknown_code": "English rules",
    }


def weight(dist: str) -> dict:
    """Version, license, installed size (MB) of a distribution's files and of what it requires, its requirements."""
    d = metadata.distribution(dist)
    lic = d.metadata.get("License-Expression") or d.metadata.get("License") or ""
    if lic in ("", "UNKNOWN"):
        lic = "; ".join(c.split(" :: ")[-1] for c in d.metadata.get_all("Classifier") or () if "License ::" in c)
    requires = _requirements(d)
    return {
        "version": d.version,
        "license": lic,
        "installed_mb": _installed_mb(d),
        "requires": requires,
        "requires_installed_mb": round(sum(_installed_mb(metadata.distribution(r)) for r in requires), 2),
    }


def _requirements(d: metadata.Distribution) -> list[str]:
    """The names of the distributions `d` needs always (not for an extra)."""
    return [re.split(r"[\s;(<>=!~\[]", r, maxsplit=1)[0] for r in d.requires or () if "extra ==" not in r]


def _installed_mb(d: metadata.Distribution) -> float:
    return round(sum((f.size or 0) for f in d.files or ()) / 2**20, 2)


def _rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def probe(name: str) -> dict:
    """Seconds and resident MB that importing the candidate, building its splitter and one split add."""
    rss0, t0 = _rss_mb(), time.perf_counter()
    CANDIDATES[name][0]("de")("Das ist ein Satz. Und noch einer.")
    return {"import_s": round(time.perf_counter() - t0, 3), "import_rss_mb": round(_rss_mb() - rss0, 1)}


def probe_fresh(name: str) -> dict:
    """`probe` in a new interpreter, so nothing is imported already."""
    cmd = [sys.executable, "-m", "benchmarks.experiments.sentence_split", "--probe", name]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run(news: Path) -> dict:
    """Every available candidate on both languages' paragraphs, all and punctuated."""
    data = {lang: paragraphs(news, lang) for lang in LANGS}
    punctuated = {lang: [p for p in ps if all(SENTENCE_END.search(s) for s in p)] for lang, ps in data.items()}
    results = {}
    for name, (factory, dist, module) in CANDIDATES.items():
        if not available(module):
            results[name] = {"missing": True}
            continue
        row = {"languages": languages(name), "package": weight(dist), **probe_fresh(name)} if dist else {}
        for lang in LANGS:
            split = factory(lang)
            row[lang] = {"all": score(split, data[lang]), "punctuated": score(split, punctuated[lang])}
            row[lang]["sentences_per_s"] = speed(split, data[lang][:SPEED_PARAGRAPHS])
            print(name, lang, json.dumps(row[lang]), flush=True)
        results[name] = row
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--news", type=Path, default=DEFAULT_NEWS)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--probe", choices=sorted(CANDIDATES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return
    results = run(args.news)
    out = {
        "measures": "sentence splitters on paragraphs of 2-6 consecutive WMT news test lines (module docstring)",
        "news": shown(args.news),
        "files": {lang: sorted(p.name for p in args.news.glob(f"*.{lang}")) for lang in LANGS},
        "splitters": results,
        "machine": machine(),
    }
    write_results(args.out, out)


if __name__ == "__main__":
    main()
