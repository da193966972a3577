"""Pass-through spans with nanomt's models: placeholders the model should copy, against translating around them.

    python -m benchmarks.experiments.passthrough --model toy RUN SRC [--model multi30k RUN SRC ...]
                                     # benchmarks/results/passthrough.json

For each model, the first --sentences lines of SRC (4 words or more) get one span put between two of their words,
in turn a URL, an e-mail address, an emoji and inline code. What the model makes of the sentence without the span
is the reference: a span should cost the rest of the translation nothing. Methods:
- `around` (nanomt.documents.segmentation): span stays in the text and the words either side are translated as units;
- `placeholder_*`: the span is replaced by a placeholder, the sentence translated whole, and the span put back where
  the placeholder comes out: `unk` a character outside every vocabulary (SentencePiece's <unk>, decoded as ⁇),
  `number` the digits 42, `name` a made-up capitalised word; a span comes back only where the placeholder appears
  exactly once in the output.
Reported per method: `restored` (the share of sentences whose span comes back byte-identical), and, on the output
with the span (or placeholder) taken out, chrF and exact match against the reference. Greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from sacrebleu.metrics import CHRF

from nanomt import Translator
from nanomt.documents.segmentation import translate_texts
from scripts.common import RESULTS, machine, shown, write_results

DEFAULT_OUT = RESULTS / "passthrough.json"
SPANS = {
    "url": ["https://example.com/docs/page-1.html", "www.example.org/news?id=7", "http://a.b-c.de/x_y"],
    "email": ["info@example.org", "max.mustermann@firma.de", "help+desk@mail.example.com"],
    "emoji": ["😀", "👍🏽", "🇩🇪", "❤️"],
    "code": ["`config.yaml`", "`x = f(y)`", "`--beam 5`"],
}
PLACEHOLDERS = {"unk": "\ue000", "number": "42", "name": "Zolrak"}


def with_spans(lines: list[str], seed: int) -> list[tuple[str, str, str, str]]:
    """(kind, span, text without it, text with it between two words) for every line, the kinds in turn."""
    rng = random.Random(seed)
    kinds = list(SPANS)
    out = []
    for i, line in enumerate(lines):
        kind = kinds[i % len(kinds)]
        span = rng.choice(SPANS[kind])
        words = line.split()
        at = rng.randint(1, len(words) - 1)
        out.append((kind, span, line, " ".join(words[:at] + [span] + words[at:])))
    return out


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def score(outputs: list[str], restored: list[bool], refs: list[str]) -> dict:
    """Restored share, chrF and exact match of the outputs (span taken out) against the references."""
    return {
        "restored": round(sum(restored) / len(restored), 4),
        "chrf": round(CHRF().corpus_score(outputs, [refs]).score, 2),
        "exact": round(sum(o == r for o, r in zip(outputs, refs)) / len(refs), 4),
    }


def measure(translator: Translator, cases: list[tuple[str, str, str, str]]) -> dict:
    """Every method on the cases of one model, overall and per kind of span."""
    greedy = lambda texts: translator.translate(texts, beam_size=1)  # noqa: E731
    refs = [squeeze(t) for t in greedy([plain for _, _, plain, _ in cases])]
    results = {}
    around = translate_texts([text for *_, text in cases], lambda units: [[(t, 0.0)] for t in greedy(units)])
    results["around"] = [
        (squeeze(r.text.replace(span, " ")), r.text.count(span) == 1) for r, (_, span, *_) in zip(around, cases)
    ]
    for name, mark in PLACEHOLDERS.items():
        outs = greedy([text.replace(span, mark) for _, span, _, text in cases])
        shown = "\u2047" if name == "unk" else mark  # SentencePiece decodes <unk> as ⁇
        results[f"placeholder_{name}"] = [(squeeze(o.replace(shown, " ")), o.count(shown) == 1) for o in outs]
    report = {}
    for method, rows in results.items():
        outputs, restored = [o for o, _ in rows], [r for _, r in rows]
        report[method] = {"all": score(outputs, restored, refs)}
        for kind in SPANS:
            idx = [i for i, case in enumerate(cases) if case[0] == kind]
            report[method][kind] = score([outputs[i] for i in idx], [restored[i] for i in idx], [refs[i] for i in idx])
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs=3, action="append", metavar=("NAME", "RUN", "SRC"), required=True)
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    models = {}
    for name, run, src in args.model:
        lines = [s.strip() for s in Path(src).read_text(encoding="utf-8").splitlines()]
        lines = [s for s in lines if len(s.split()) >= 4][: args.sentences]
        report = measure(Translator.from_checkpoint(run), with_spans(lines, args.seed))
        models[name] = {"checkpoint": shown(run), "src": shown(src), "sentences": len(lines), "methods": report}
        print(name, json.dumps({m: r["all"] for m, r in report.items()}), flush=True)
    out = {
        "measures": "pass-through spans: translated around against placeholders, greedy (module docstring)",
        "spans": SPANS,
        "placeholders": {k: v.encode("unicode_escape").decode() for k, v in PLACEHOLDERS.items()},
        "models": models,
        "machine": machine(),
    }
    write_results(args.out, out)


if __name__ == "__main__":
    main()
