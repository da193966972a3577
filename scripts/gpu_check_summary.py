"""The figures of one scripts/gpu_check.sh run, gathered from its results directory into gpu_check.json.

    python -m scripts.gpu_check_summary RESULTS_DIR [--test2016 JSON] [--minutes N] [--failed STEP ...]
        [--seconds STEP=S ...]

Reads what the script's steps wrote there (cuda_tests.xml, gpu_step.json, multi30k_metrics.jsonl, gpu_decode.json)
and `nanomt evaluate --json`'s report of test2016 (--test2016); a missing file is reported as missing, not guessed.
Names the commit, the device and the date; no path in it is absolute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from scripts.common import git


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def tests(path: Path) -> dict | None:
    """pytest's JUnit XML: counts and the names of the tests that failed or were skipped."""
    if not path.is_file():
        return None
    cases = ET.parse(path).getroot().iter("testcase")
    out = {"passed": [], "failed": [], "skipped": []}
    for case in cases:
        kind = next(
            (
                k
                for k, tag in (("failed", "failure"), ("failed", "error"), ("skipped", "skipped"))
                if case.find(tag) is not None
            ),
            "passed",
        )
        out[kind].append(case.get("name"))
    return {"passed": len(out["passed"]), "failed": out["failed"], "skipped": out["skipped"], "names": out["passed"]}


def training(metrics: Path, test: dict | None, minutes: float) -> dict | None:
    """The Multi30k run: steps, tokens/s (median of its log rows), its validation BLEUs and test2016's."""
    if not metrics.is_file():
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    logged = [r for r in rows if "tokens_per_s" in r]
    evals = [r for r in rows if "valid_bleu" in r]
    return {
        "config": "configs/multi30k_de_en.yaml",
        "max_minutes": minutes,
        "steps": max((r["step"] for r in rows), default=0),
        "tokens_per_s_median": round(statistics.median(r["tokens_per_s"] for r in logged), 1) if logged else None,
        "valid_bleu_greedy": [(r["step"], r["valid_bleu"]) for r in evals],
        "test2016": {k: test[k] for k in ("beam_size", "bleu", "chrf", "bleu_signature", "sentences_per_s")}
        if test
        else None,
    }


def gpu_step(report: dict | None) -> dict | None:
    if report is None:
        return None
    rows = report["results"]
    keys = ("step_ms", "target_tokens_per_s", "mfu", "step_memory_gib", "speedup_vs_nanomt")
    out = {name: {k: r.get(k) for k in keys} for name, r in rows.items()}
    if "marian" in rows and "nanomt" in rows:
        out["nanomt_x_marian"] = round(rows["marian"]["step_ms"] / rows["nanomt"]["step_ms"], 3)
    extra = {k: report.get(k) for k in ("target_tokens_per_step", "padding_fraction_padded", "skipped")}
    return {"shape": report["shape"], "precision": report["precision"], **extra, **out}


def decoding(report: dict | None) -> dict | None:
    if report is None:
        return None
    return {
        key: {
            "nanomt_tokens_per_s": r["nanomt"]["tokens_per_s"],
            "hf_tokens_per_s": r["hf"]["tokens_per_s"],
            "nanomt_x_hf": r["nanomt_x_hf"],
            "sentences_identical_to_hf": r["sentences_identical_to_hf"],
        }
        for key, r in report["rows"].items()
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--test2016", type=Path, default=None, help="nanomt evaluate --json's report")
    p.add_argument("--minutes", type=float, default=None, help="the training's max_minutes")
    p.add_argument("--failed", nargs="*", default=[], help="the steps that failed")
    p.add_argument("--seconds", nargs="*", default=[], help="STEP=SECONDS, each step's wall time")
    args = p.parse_args(argv)
    d = args.results
    step_report, decode_report = read_json(d / "gpu_step.json"), read_json(d / "gpu_decode.json")
    summary = {
        "what": "scripts/gpu_check.sh: the CUDA tests, the training step, a Multi30k training, decoding beside "
        "Hugging Face generate",
        "device": (step_report or decode_report or {}).get("device"),
        "date": time.strftime("%Y-%m-%d"),
        "commit": git("rev-parse", "HEAD") or None,  # None where git is missing
        "failed_steps": args.failed,
        "seconds": {k: int(v) for k, v in (s.split("=", 1) for s in args.seconds)},
        "cuda_tests": tests(d / "cuda_tests.xml"),
        "gpu_step": gpu_step(step_report),
        "multi30k": training(
            d / "multi30k_metrics.jsonl", read_json(args.test2016) if args.test2016 else None, args.minutes
        ),
        "decoding": decoding(decode_report),
    }
    (d / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
