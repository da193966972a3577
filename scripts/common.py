"""What the recipes (scripts/) and the benchmarks (benchmarks/) share: the repository's paths and the shared data's,
a results file's machine, commit and relative paths, `nanomt train` in a process of its own on the Multi30k files,
and the recipes' choices on val (checkpoint, beam and length penalty) and test numbers (`nanomt evaluate`).

One module for both, beside the recipes: a benchmark runs what a recipe runs (its config, its data, its training)
and writes a results file as a recipe does, so what they share is the recipes' ground and the benchmarks import it
from here. Recipes and benchmarks import the package and this module, never each other; what only benchmarks share
(timing, worker processes, servers) is benchmarks/harness.py. Importing this module imports neither torch nor
nanomt: a process that must stay without torch (a CTranslate2 worker) imports it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NANOMT = [sys.executable, "-m", "nanomt.cli"]
SHARED_DATA = ROOT.parent / "shared" / "data"  # multi30k/ and news/, beside the checkout
DEFAULT_DATA = SHARED_DATA / "multi30k"  # train, val, test2016 .de/.en
DEFAULT_NEWS = SHARED_DATA / "news"  # the WMT news test sets, .de/.en
DEFAULT_SRC = DEFAULT_DATA / "test2016.de"
DEFAULT_CONFIG = ROOT / "configs" / "multi30k_de_en.yaml"
DEFAULT_RUN = ROOT / "runs" / "multi30k_de_en"  # the recipe's run directory
RESULTS = ROOT / "benchmarks" / "results"
RECIPE_RESULTS = ROOT / "scripts" / "results"


def shown(path: str | Path) -> str:
    """A path as a results file names it: relative to the repository, never absolute, and as it was reached (a
    linked ../shared stays ../shared, not its target's place on this machine)."""
    return os.path.relpath(os.path.abspath(path), ROOT)


def relative_paths(obj):
    """`obj` (JSON-like) with every absolute path in it made relative to the repository."""
    if isinstance(obj, dict):
        return {k: relative_paths(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relative_paths(v) for v in obj]
    if isinstance(obj, str) and os.path.isabs(obj):
        return shown(obj)
    return obj


def git(*args: str) -> str:
    """The output of a git command in the repository ('' where git is missing)."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> dict:
    """CPU model, threads, versions and the git commit (and whether the tree differed from it), for a results file."""
    import torch

    from nanomt.core.runtime import cpu_has_bf16_kernels

    return {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "bf16_kernels": cpu_has_bf16_kernels(),  # train.precision=auto: bf16 if true, else fp32
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sacrebleu": metadata.version("sacrebleu"),
        "sentencepiece": metadata.version("sentencepiece"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def write_results(path: Path, result: dict, indent: int = 2) -> None:
    """A results file: `result` as JSON (UTF-8, its folder made if need be); says where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {shown(path)}")


def data_overrides(data: Path) -> list[str]:
    """--set arguments pointing a config at the Multi30k files in `data` (train, val, test2016 .de/.en)."""
    files = {"train": "train", "valid": "val", "test": "test2016"}
    return [
        f"data.{split}.{side}={data / f'{name}.{lang}'}"
        for split, name in files.items()
        for side, lang in (("src", "de"), ("tgt", "en"))
    ]


def run_training(config: Path, run_dir: Path, overrides: list[str], log: Path | None = None) -> None:
    """`nanomt train`, in a subprocess so its threads and memory are its own; its output to `log` if given."""
    cmd = [*NANOMT, "train", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        cmd += ["--set", o]
    if log is None:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        return
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT)


def training_summary(run_dir: Path) -> dict:
    """Steps, epochs, wall seconds, mean tokens/s and the validation curve, from the run's metrics.jsonl."""
    from nanomt.training.metrics_log import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    logged, evals = [r for r in rows if "loss" in r], [r for r in rows if "valid_bleu" in r]
    return {
        "steps": max(r["step"] for r in rows),  # the last step may come after the last log row
        "epochs": max(r["epoch"] for r in rows),
        "train_wall_seconds": max(r["elapsed_s"] for r in rows),
        # None for a run shorter than one log interval (a smoke test)
        "tokens_per_s": round(sum(r["tokens_per_s"] for r in logged) / len(logged), 1) if logged else None,
        "best_valid_greedy_bleu": max((r["valid_bleu"] for r in evals), default=None),
        "valid_greedy_bleu_curve": [(r["step"], r["elapsed_s"], r["valid_bleu"]) for r in evals],
    }


# Choices on val and the test numbers of the Multi30k recipes (multi30k, distill).


def with_decoding(src: Path, out: Path, beam: int, length_penalty: float) -> Path:
    """A complete checkpoint dir at `out` whose config carries the chosen decoding settings."""
    from nanomt.core import checkpoint as ckpt
    from nanomt.core.config import load_config

    config_path, tokenizer_dir = ckpt.find_run_files(src)
    cfg = load_config(config_path)
    cfg = dataclasses.replace(
        cfg, decode=dataclasses.replace(cfg.decode, beam_size=beam, length_penalty=length_penalty)
    )
    state = ckpt.read_weights(src / ckpt.WEIGHTS)
    return ckpt.write_checkpoint_dir(out, cfg, tokenizer_dir, state)


def val_bleu(path: Path, data: Path, beam: int, length_penalty: float | None = None) -> float:
    """BLEU of a checkpoint on val, the only split used for choices."""
    from nanomt.decoding.translate import Translator
    from nanomt.training.evaluate import evaluate

    kwargs = {} if length_penalty is None else {"length_penalty": length_penalty}
    translator = Translator.from_checkpoint(path)
    report = evaluate(translator, data / "val.de", data / "val.en", beam_size=beam, **kwargs)
    return report["bleu"]


def choose_checkpoint(run_dir: Path, data: Path, work: Path) -> tuple[Path, list[dict]]:
    """Best-BLEU weights, the last step, and averages of the last N checkpoints, compared on val with beam 5."""
    from nanomt.core import checkpoint as ckpt

    steps = ckpt.step_dirs(run_dir)
    candidates = {"best_valid_bleu": run_dir, "last": steps[-1][1]}
    for n in (4, 8, 12):
        if len(steps) >= n:
            candidates[f"average_last_{n}"] = ckpt.average_checkpoints([p for _, p in steps[-n:]], work / f"avg{n}")
    table = []
    for name, path in candidates.items():
        table.append({"checkpoint": name, "val_bleu_beam5": round(val_bleu(path, data, 5), 2)})
        print(table[-1], flush=True)
    best = max(table, key=lambda r: r["val_bleu_beam5"])
    return candidates[best["checkpoint"]], table


def choose_decoding(path: Path, data: Path) -> tuple[int, float, list[dict]]:
    """Beam size and GNMT length penalty, chosen on val."""
    table = []
    for beam, lp in ((5, 0.6), (5, 1.0), (5, 1.4), (5, 1.8), (5, 2.2), (8, 1.4), (3, 1.4)):
        table.append({"beam": beam, "length_penalty": lp, "val_bleu": round(val_bleu(path, data, beam, lp), 2)})
        print(table[-1], flush=True)
    best = max(table, key=lambda r: r["val_bleu"])
    return best["beam"], best["length_penalty"], table


def nanomt_evaluate(path: Path, data: Path, split: str = "test2016", int8: bool = False) -> dict:
    """`nanomt evaluate --json` on a split: the number in the results."""
    cmd = [
        *NANOMT,
        "evaluate",
        str(path),
        "--src",
        str(data / f"{split}.de"),
        "--ref",
        str(data / f"{split}.en"),
        "--json",
        *(["--int8"] if int8 else []),
    ]
    print("$", " ".join(cmd), flush=True)
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
