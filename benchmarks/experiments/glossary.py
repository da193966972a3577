"""A glossary on Multi30k test2016: how many translations contain their terms, BLEU with and without it, speed.

    python -m benchmarks.experiments.glossary --checkpoint runs/multi30k_de_en --data ../shared/data/multi30k

The glossary is made from the references, as a user's terminology would be: German nouns (capitalized words of 4+
letters seen 5+ times in the training sources) are paired with the English word they co-occur with most in the
training pairs (Dice coefficient >= 0.3, an English word of 3+ letters seen 5+ times); a pair is kept when, in every
test2016 pair whose source holds the German word, the reference holds the English one. Each test sentence then
asks for the English terms of the German nouns it contains (nanomt.decoding.glossary.required_terms).

Measured at beam 5, in one process: BLEU and chrF of test2016 without and with the glossary; among the sentences
that ask for terms, the share whose translation contains every one of them (the terms as words, case-sensitive);
sentences/s without and with the glossary on those sentences, and seconds a sentence by the number of terms it asks
for. Writes benchmarks/results/glossary.json with the commit.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import re
import time
from pathlib import Path

import torch

from nanomt.decoding.glossary import required_terms
from nanomt.decoding.translate import Translator
from nanomt.training.metrics import score
from scripts.common import DEFAULT_DATA, DEFAULT_RUN, RESULTS, ROOT, git

WORD = re.compile(r"\w+")


def words(line: str) -> set[str]:
    return set(WORD.findall(line))


def lexicon(src: list[str], tgt: list[str]) -> dict[str, str]:
    """German noun -> the English word of its highest Dice coefficient over the training pairs."""
    de_count, en_count, both = collections.Counter(), collections.Counter(), collections.Counter()
    for s, t in zip(src, tgt):
        nouns = {w for w in words(s) if w[:1].isupper() and len(w) >= 4}
        english = {w for w in words(t.lower()) if len(w) >= 3}
        de_count.update(nouns)
        en_count.update(english)
        both.update((n, e) for n in nouns for e in english)
    best: dict[str, tuple[float, str]] = {}
    for (n, e), c in both.items():
        if de_count[n] >= 5 and en_count[e] >= 5:
            dice = 2 * c / (de_count[n] + en_count[e])
            if dice >= 0.3 and dice > best.get(n, (0.0, ""))[0]:
                best[n] = (dice, e)
    return {n: e for n, (_, e) in best.items()}


def test_glossary(lex: dict[str, str], src: list[str], ref: list[str]) -> tuple[tuple[str, str], ...]:
    """The pairs whose English word is in the reference of every test pair whose source holds the German word."""
    kept = []
    for n, e in sorted(lex.items()):
        holding = [r for s, r in zip(src, ref) if n in words(s)]
        if holding and all(e in words(r.lower()) for r in holding):
            kept.append((n, e))
    return tuple(kept)


def contains_terms(translation: str, terms: list[str]) -> bool:
    return all(t in words(translation.lower()) for t in terms)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_RUN)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "glossary.json")
    args = p.parse_args()
    torch.set_num_threads(2)
    read = lambda name: (args.data / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    lex = lexicon(read("train.de"), read("train.en"))
    src, ref = read("test2016.de"), read("test2016.en")
    glossary = test_glossary(lex, src, ref)
    terms = [required_terms(glossary, s) for s in src]
    asked = [i for i, t in enumerate(terms) if t]
    translator = Translator.from_checkpoint(args.checkpoint)
    plain, plain_s = timed(lambda: translator.translate(src, beam_size=args.beam))
    constrained, constrained_s = timed(lambda: translator.translate(src, beam_size=args.beam, glossary=glossary))
    subset = [src[i] for i in asked]
    _, subset_plain_s = timed(lambda: translator.translate(subset, beam_size=args.beam))
    by_terms = collections.defaultdict(list)
    for i in asked[:300]:  # seconds a sentence by its number of terms, one sentence a call
        _, s = timed(lambda i=i: translator.translate([src[i]], beam_size=args.beam, glossary=glossary))
        by_terms[len(terms[i])].append(s)
    alone = collections.defaultdict(list)
    for i in asked[:300]:
        _, s = timed(lambda i=i: translator.translate([src[i]], beam_size=args.beam))
        alone[len(terms[i])].append(s)
    missed = [i for i in asked if not contains_terms(constrained[i], terms[i])]
    results = {
        "what": "Multi30k test2016 with a glossary of reference nouns (module docstring): term coverage, BLEU "
        "and chrF without and with it, speed; beam " + str(args.beam),
        "checkpoint": Path(args.checkpoint).resolve().relative_to(ROOT).as_posix()
        if Path(args.checkpoint).resolve().is_relative_to(ROOT)
        else Path(args.checkpoint).name,
        "glossary_entries": len(glossary),
        "glossary_sample": [list(pair) for pair in glossary[:20]],
        "sentences": len(src),
        "sentences_asking_terms": len(asked),
        "terms_asked": sum(len(t) for t in terms),
        "coverage_plain": round(sum(contains_terms(plain[i], terms[i]) for i in asked) / len(asked), 4),
        "coverage_glossary": round(1 - len(missed) / len(asked), 4),
        "missed": [{"index": i, "source": src[i], "terms": terms[i], "translation": constrained[i]} for i in missed],
        "plain": {k: round(v, 2) for k, v in vars(score(plain, ref)).items() if isinstance(v, float)},
        "glossary": {k: round(v, 2) for k, v in vars(score(constrained, ref)).items() if isinstance(v, float)},
        "seconds_whole_set": {"plain": round(plain_s, 2), "glossary": round(constrained_s, 2)},
        "sentences_per_s_asking_sentences": {
            "plain": round(len(asked) / subset_plain_s, 2),
        },
        "seconds_a_sentence_alone_by_terms": {
            str(n): {
                "plain": round(sum(alone[n]) / len(alone[n]), 4),
                "glossary": round(sum(by_terms[n]) / len(by_terms[n]), 4),
                "sentences": len(by_terms[n]),
            }
            for n in sorted(by_terms)
        },
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "commit": git("rev-parse", "HEAD"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "missed"}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
