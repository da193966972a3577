"""Committed results files hold no paths of the machine they were made on and no history of who made them."""

import json
import os
import re
from pathlib import Path

import pytest
from paths import REPO

SKIP_DIRS = {".git", ".venv", "venv", "runs", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}

# "/work/x", "/tmp", "~/x", "C:\x" as a whole string; "/work/x/" or "C:\x" inside prose (after a space, quote, bracket)
ABSOLUTE_PATH = re.compile(
    r"^(?:/[\w.~-]+(?:/|$)|~/|[A-Za-z]:[\\/])|(?:^|[\s(\[{='\"`,;])(?:/[\w.~-]+/|~/[\w.-]|[A-Za-z]:[\\/])"
)
SESSION = re.compile(r"sessions?[\s_-]*\d", re.IGNORECASE)


def results_files() -> list[Path]:
    """Every file under a folder named `results` in the repository."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        if "results" in Path(root).relative_to(REPO).parts:
            found += [Path(root) / f for f in sorted(files)]
    return found


def strings(x, path="$"):
    """(JSON key path, string) for every key and string value in x."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield f"{path}.{k} (key)", k
            yield from strings(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from strings(v, f"{path}[{i}]")
    elif isinstance(x, str):
        yield path, x


def problems(data) -> list[str]:
    out = []
    for where, s in strings(data):
        if ABSOLUTE_PATH.search(s):
            out.append(f"{where}: absolute path in {s[:120]!r}")
        if SESSION.search(s):
            out.append(f"{where}: {SESSION.search(s).group(0)!r} in {s[:120]!r}")
    return out


FILES = results_files()
JSON_FILES = [f for f in FILES if f.suffix == ".json"]


def test_results_files_found():
    assert any(f.parent.name == "results" for f in JSON_FILES)


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_results_json_has_no_absolute_paths_or_sessions(path):
    found = problems(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.relative_to(REPO)}:\n" + "\n".join(found)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_results_file_name_and_text_have_no_sessions(path):
    rel = path.relative_to(REPO).as_posix()
    assert not SESSION.search(rel), f"{rel}: the name says {SESSION.search(rel).group(0)!r}"
    if path.suffix in (".md", ".txt", ".csv"):
        hit = SESSION.search(path.read_text(encoding="utf-8"))
        assert not hit, f"{rel}: {hit.group(0)!r}"


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_results_json_records_its_commit(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    commit = data.get("commit") or (data.get("machine") or {}).get("git_commit")
    assert isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit), (
        f"{path.relative_to(REPO)}: no commit (machine.git_commit or commit)"
    )


@pytest.mark.parametrize(
    "value",
    ["/work/shared/data/multi30k/train.de", "/tmp", "/tmp/x", "~/data/train.de", "C:\\data\\train.de", "D:/data"],
)
def test_detects_absolute_paths(value):
    assert problems({"a": [{"b": value}]}) == [f"$.a[0].b: absolute path in {value!r}"]
    assert problems({"note": f"trained on {value}/x"})


@pytest.mark.parametrize(
    "value",
    [
        "<data>/test2016.de",
        "../shared/bench/anchors",
        "runs/multi30k_de_en/final",
        "de->en / en->de, 32.17 / 37.80 at steps 800 / 1,600",
        "tok/s",
        "nrefs:1|case:mixed|eff:no|tok:13a",
        "2026-11-23T05:36:25+0000",
        "nanomt_translate_fp32/beam5",
    ],
)
def test_accepts_relative_paths_and_prose(value):
    assert problems({"note": value}) == []


def test_detects_sessions():
    assert problems({"note": "Session 13, AMD EPYC"})
    assert problems({"note": "the session-10 recipe run"})
    assert not problems({"note": "the recipe run of 2026-11-24 (commit 81e3228)"})
