"""Golden decoding outputs: beam search, greedy and sampling on fixed random models, recorded once, required equal.

tests/decoding/test_decode_golden.py recomputes every case and requires the same tokens and scores. This file records
them from whichever nanomt the import finds, so PYTHONPATH decides which code runs: record from a clean export of the
commit whose decoding is trusted, not from a working tree, e.g. from the repository root

    mkdir DIR && git archive HEAD | tar -x -C DIR
    cd DIR && PYTHONPATH=. python REPO/tests/decode_golden.py --out REPO/tests/data/decode_golden.json

(DIR: an empty directory; REPO: this repository's root). The file records the commit of REPO's HEAD.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch
from conftest import KEPT, TIED_VOCAB, decoding, max_len_fn, random_src, random_transformer, tokens

import nanomt
from nanomt.core.model import Transformer, prune_output
from nanomt.decoding.beam import beam_search
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.greedy import greedy
from nanomt.decoding.sample import sample

V = 24
LENGTHS = [7, 3, 5, 1, 6, 8, 2, 4]
MAX_LEN = 12
PENALTIES = [("gnmt", 0.6), ("gnmt", 1.0), ("average", 0.6), ("average", 1.0), ("none", 1.0)]
SAMPLING = {
    "plain": {},
    "t1.5": {"temperature": 1.5},
    "k5": {"top_k": 5},
    "p0.8": {"top_p": 0.8},
    "t0.7_k8_p0.9": {"temperature": 0.7, "top_k": 8, "top_p": 0.9},
}
MODELS = ("plain", "short", "ensemble", "pruned")
GOLDEN = Path(__file__).parent / "data" / "decode_golden.json"

Case = Callable[[], list[list[dict]]]  # per sentence, its hypotheses: {"tokens", "score", "log_prob"}


def restricted_transformer(seed: int) -> Transformer:
    """random_transformer's network with restrict_output, scoring conftest.KEPT (and PAD) only."""
    base = random_transformer(seed, TIED_VOCAB)
    model = Transformer(dataclasses.replace(base.cfg, restrict_output=True)).eval()
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing == ["output_mask"] and not unexpected
    model.set_output_vocab(KEPT)
    return model


@functools.cache
def models() -> dict:
    """The fixed random models and their source batches (pruned_src for the pruned model's vocabulary)."""
    return {
        "plain": random_transformer(2, V),
        "short": random_transformer(2, V, max_positions=12),  # budgets above 12 are cut to its positions
        "ensemble": Ensemble([random_transformer(2, V), random_transformer(5, V, d_model=16, layers=1)]),
        "pruned": prune_output(restricted_transformer(1)),
        "src": random_src(LENGTHS, extra_pad=2, vocab=V),
        "pruned_src": random_src(LENGTHS, seed=3, extra_pad=2, vocab=TIED_VOCAB),
    }


def fingerprint() -> dict:
    """Sums of the fixtures' weights and sources: if these moved, the golden outputs describe other models."""
    m = models()
    sums = {name: float(sum(p.detach().double().sum() for p in m[name].parameters())) for name in MODELS}
    return {**sums, "src": m["src"].tolist(), "pruned_src": m["pruned_src"].tolist()}


def tokens_only(fn: Callable[[dict], list[list[int]]]) -> Case:
    """A case of one token list per sentence (greedy, sampling): scored 0."""
    return lambda: [[{"tokens": t, "score": 0.0, "log_prob": 0.0}] for t in fn(models())]


def cases() -> dict[str, Case]:
    """Every recorded case, by name."""
    out: dict[str, Case] = {}
    for k in range(1, 6):
        for kind, alpha in PENALTIES:
            out[f"beam{k}_{kind}_{alpha}"] = _beam("plain", "src", k, length_penalty=alpha, length_penalty_kind=kind)
    out["beam4_nbest2"] = _beam("plain", "src", 4, n_best=2)
    out["beam3_min_len4"] = _beam("plain", "src", 3, min_len=4)
    out["beam4_max_len_fn"] = _beam("plain", "src", 4, max_len=max_len_fn(1.2, 3), length_penalty=0.6)
    out["beam4_late_stop_gnmt"] = _beam("plain", "src", 4, early_stopping=False)
    out["beam3_late_stop_average"] = _beam("plain", "src", 3, length_penalty_kind="average", early_stopping=False)
    out["beam3_capped_at_positions"] = _beam("short", "src", 3, max_len=50)
    out["ensemble_beam3"] = _beam("ensemble", "src", 3)
    out["pruned_beam3"] = _beam("pruned", "pruned_src", 3, min_len=2)
    out["pruned_beam8"] = _beam("pruned", "pruned_src", 8, n_best=4)  # 2k = 16 > the 12 scored ids
    out["greedy"] = tokens_only(lambda m: tokens(greedy(m["plain"], m["src"], decoding(MAX_LEN))))
    out["greedy_min_len3"] = tokens_only(lambda m: tokens(greedy(m["plain"], m["src"], decoding(MAX_LEN, min_len=3))))
    out["greedy_max_len_fn"] = tokens_only(lambda m: tokens(greedy(m["plain"], m["src"], decoding(max_len_fn(0.5, 2)))))
    out["greedy_ensemble"] = tokens_only(lambda m: tokens(greedy(m["ensemble"], m["src"], decoding(MAX_LEN))))
    out["greedy_pruned"] = tokens_only(lambda m: tokens(greedy(m["pruned"], m["pruned_src"], decoding(MAX_LEN))))
    for name, settings in SAMPLING.items():
        for seed in (0, 1):
            out[f"sample_{name}_seed{seed}"] = _sample("plain", "src", seed, **settings)
    out["sample_min_len2_seed3"] = _sample("plain", "src", 3, min_len=2)
    out["sample_ensemble_seed0"] = _sample("ensemble", "src", 0)
    out["sample_pruned_seed0"] = _sample("pruned", "pruned_src", 0, temperature=1.5)
    return out


def _beam(model: str, src: str, k: int, max_len=MAX_LEN, n_best: int | None = None, **kwargs) -> Case:
    def run() -> list[list[dict]]:
        m = models()
        hyps = beam_search(m[model], m[src], decoding(max_len, k, n_best=n_best or k, **kwargs))
        return [[{"tokens": h.tokens, "score": h.score, "log_prob": h.log_prob} for h in hs] for hs in hyps]

    return run


def _sample(model: str, src: str, seed: int, **kwargs) -> Case:
    return tokens_only(lambda m: tokens(sample(m[model], m[src], decoding(MAX_LEN, seed=seed, **kwargs))))


def compute() -> dict[str, list[list[dict]]]:
    """Every case's outputs, on one thread (so sums are added in one order)."""
    torch.set_num_threads(1)
    return {name: case() for name, case in cases().items()}


def git_commit() -> str:
    """The commit of this file's repository: the recorded code's, when recorded from its export."""
    res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    return res.stdout.strip() or "unknown"


def write(outputs: dict, path: Path) -> None:
    """One case a line, floats to 7 decimals (the test compares scores to 1e-5)."""

    def rounded(case: list[list[dict]]) -> list[list[dict]]:
        return [[{**h, "score": round(h["score"], 7), "log_prob": round(h["log_prob"], 7)} for h in s] for s in case]

    head = {
        "what": "beam_search, greedy and sample outputs (tokens, scores, log-probs) of decode_golden.py's cases",
        "commit": git_commit(),
        "fingerprint": fingerprint(),
    }
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in head.items()]
    cases_ = [f"    {json.dumps(k)}: {json.dumps(rounded(v), separators=(',', ':'))}" for k, v in outputs.items()]
    text = "{\n" + ",\n".join(lines) + ',\n  "cases": {\n' + ",\n".join(cases_) + "\n  }\n}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=GOLDEN, help=f"the JSON file to write (default {GOLDEN.name})")
    args = p.parse_args(argv)
    print(f"recording with nanomt from {Path(nanomt.__file__).parent}")
    write(compute(), args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
