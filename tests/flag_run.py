"""The tiny run the flag tests share: trained here for a few seconds (its checkpoint's default beam is 2), eight test
sentences with their references, a glossary file and a prefix file; a copy of the run with other decode settings in
its config, and /attention's cross-attention as the server rounds it. For tests that a setting reaches the search
whichever way it is given: `nanomt translate` and `nanomt evaluate`'s flags (cli/test_decoding_flags.py), `nanomt
serve`'s (cli/test_serve_model_flags.py), and /attention's beam_size (serve/test_attention.py)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

from nanomt.core.config import load_config, save_config

GLOSSARY = (("fesa", "dask"),)
PREFIXES = ["twa", "ek rud", "tha swil", "twa", "ek", "tha", "blek", "twa"]


@pytest.fixture(scope="module")
def run_dir(toy_corpus, trained):
    """A tiny model trained for a few seconds (its checkpoint's default beam is 2): read only."""
    return trained(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))


@dataclass(frozen=True)
class Inputs:
    """Eight test sentences, their references, a glossary file and a prefix file (one prefix a sentence)."""

    lines: list[str]
    src: Path
    ref: Path
    glossary: Path
    prefixes: Path


@pytest.fixture(scope="module")
def inputs(toy_corpus, tmp_path_factory) -> Inputs:
    out = tmp_path_factory.mktemp("inputs")
    src, ref = (toy_corpus[f"test.{side}"].read_text(encoding="utf-8").splitlines()[:8] for side in ("src", "tgt"))
    paths = {name: out / name for name in ("src.txt", "ref.txt", "glossary.tsv", "prefixes.txt")}
    for name, lines in zip(paths, (src, ref, ["\t".join(pair) for pair in GLOSSARY], PREFIXES)):
        paths[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return Inputs(src, *paths.values())


def with_decode(run_dir, dest: Path, **decode) -> Path:
    """A copy of the run whose config.yaml has these decode settings (as `--set decode.KEY=VALUE` writes them)."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("bin", "checkpoints", "metrics.jsonl"))
    cfg = load_config(dest / "config.yaml", [f"decode.{key}={value}" for key, value in decode.items()])
    save_config(cfg, dest / "config.yaml")
    return dest


def rounded_cross(att) -> np.ndarray:
    """A SentenceAttention's cross-attention (layers, H, T, S) as /attention gives it: 4 decimals."""
    return np.round(np.stack(att.cross).astype(np.float64), 4)
