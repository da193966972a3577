"""Convert a nanomt checkpoint to CTranslate2, and time CTranslate2 translating a file with it.

    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR                       # convert (float32 weights)
    python -m benchmarks.ct2_convert CHECKPOINT OUT_DIR --src test.de --json  # + translate, time, print JSON

The converter and the decoding are the package's (nanomt/interop/ct2.py: `nanomt export ct2`), with the
checkpoint's decoding settings mapped onto CTranslate2's, so the translations are nanomt's. This process never
imports torch: CTranslate2 in a process that has imported torch ran ~2.5x slower in the baselines' measurements
(two OpenMP runtimes), and `import nanomt` imports torch (so does `ctranslate2.specs`, whenever torch is
installed): the conversion runs in a child process, and this one loads the module from its file on its own (it
imports no other part of nanomt). `benchmarks.speed` runs this as a worker for the `translate` section.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ctranslate2


def load_ct2_module():
    """nanomt/interop/ct2.py as a standalone module: without nanomt/__init__.py, which imports torch."""
    path = Path(__file__).resolve().parent.parent / "nanomt" / "interop" / "ct2.py"
    spec = importlib.util.spec_from_file_location("nanomt_interop_ct2", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and the like look their module up here
    spec.loader.exec_module(module)
    return module


ct2 = load_ct2_module()


def convert(checkpoint: Path, out_dir: Path) -> Path:
    """Write the CTranslate2 model directory for a nanomt checkpoint (float32 weights), in a child process."""
    # ctranslate2.specs imports torch whenever it is installed, so converting here would load it into the process
    # that then times the translation.
    code = "import sys; from nanomt.interop.ct2 import export_ct2; export_ct2(sys.argv[1], sys.argv[2])"
    res = subprocess.run([sys.executable, "-c", code, str(checkpoint), str(out_dir)], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"ct2_convert.py: error: conversion failed: {res.stderr.strip().splitlines()[-1:]}")
    return out_dir


def time_translation(
    ct2_dir: Path,
    checkpoint: Path,
    src_file: Path,
    compute_type: str,
    beam: int,
    length_penalty: float | None,
    reps: int,
) -> dict:
    """Median wall time of translating the whole file (SentencePiece in and out included), after one warm-up."""
    # length_penalty None: the checkpoint's (decode.length_penalty and its kind, as nanomt decodes).
    del checkpoint  # the export holds the tokenizer and the decoding settings
    translator = ct2.Ct2Translator(ct2_dir, device="cpu", compute_type=compute_type, intra_threads=2)
    lines = src_file.read_text(encoding="utf-8").splitlines()

    def run() -> list[str]:
        return translator.translate(lines, beam_size=beam, length_penalty=length_penalty)

    run()  # warm-up
    samples, outputs = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        outputs = run()
        samples.append(time.perf_counter() - t0)
    median = statistics.median(samples)
    return {
        "compute_type": compute_type,
        "beam": beam,
        "length_penalty": translator.decode["length_penalty"] if length_penalty is None else length_penalty,
        "length_penalty_kind": translator.decode["length_penalty_kind"],
        "median_s": median,
        "min_s": min(samples),
        "max_s": max(samples),
        "samples_s": samples,
        "n_sentences": len(lines),
        "sentences_per_s": len(lines) / median,
        "translations": outputs,
    }


def main() -> None:
    """Convert, then optionally translate and time; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--src", type=Path, help="also translate this file and time it")
    p.add_argument("--compute-types", default="float32,int8")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument(
        "--length-penalty",
        type=float,
        default=None,
        help="alpha of the checkpoint's length penalty kind (default: its own)",
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    t0 = time.perf_counter()
    convert(args.checkpoint, args.out_dir)
    report = {"ct2_dir": str(args.out_dir), "convert_s": time.perf_counter() - t0, "version": ctranslate2.__version__}
    report["torch_loaded"] = "torch" in sys.modules  # should stay False: see the module docstring
    if args.src:
        report["runs"] = [
            time_translation(
                args.out_dir, args.checkpoint, args.src, compute_type, args.beam, args.length_penalty, args.reps
            )
            for compute_type in args.compute_types.split(",")
        ]
    print(json.dumps(report) if args.json else f"converted to {args.out_dir}")


if __name__ == "__main__":
    main()
