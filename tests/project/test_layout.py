"""Imports point one way: the package knows nothing of scripts/ and benchmarks/, which use only its public names;
a recipe (scripts/) and a benchmark (benchmarks/, benchmarks/experiments/) import the package and the shared helper
modules, never a recipe or another benchmark: scripts/common.py (what recipes and benchmarks share) and, for a
benchmark, benchmarks/harness.py (what benchmarks alone share). A helper module has no command line."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
from paths import REPO as ROOT

PACKAGE_FILES = sorted((ROOT / "nanomt").rglob("*.py"))
SCRIPT_FILES = sorted((ROOT / "scripts").glob("*.py"))
BENCHMARK_FILES = sorted((ROOT / "benchmarks").rglob("*.py"))
USER_FILES = SCRIPT_FILES + BENCHMARK_FILES
HELPERS = ("scripts.common", "benchmarks.harness")
# Optional packages (the `bench` extra) a benchmark may need at import time: without them it is skipped.
OPTIONAL = {"ctranslate2", "transformers"}


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, wherever it is (lazy imports in functions included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def is_module(name: str) -> bool:
    """Whether `name` is an importable module (`nanomt.core.config.load_config` is not)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def nanomt_names(tree: ast.Module) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for every import from the package, and for every attribute read from a name
    bound to one of its modules (`from nanomt import checkpoint as ckpt` ... `ckpt.step_dirs`)."""
    uses, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "nanomt":
                    uses.append((node.lineno, alias.name, None))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "nanomt":
            for alias in node.names:
                uses.append((node.lineno, node.module, alias.name))
                if is_module(f"{node.module}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            uses.append((node.lineno, aliases[node.value.id], node.attr))
    return uses


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_package_never_imports_scripts_or_benchmarks(path):
    bad = [(line, m) for line, m in imported_modules(parse(path)) if m.split(".")[0] in ("scripts", "benchmarks")]
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the package must not know its scripts or benchmarks"


def relative_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, `.module`) of every relative import in a file (a sibling module of its folder)."""
    return [
        (node.lineno, "." * node.level + (node.module or ""))
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


def dotted_name(path: Path) -> str:
    """`scripts.multi30k` for scripts/multi30k.py, as `python -m` runs it from the repository root."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def may_import(name: str) -> set[str]:
    """The modules of scripts/ and benchmarks/ that module `name` may import: the helpers below it."""
    if name == "scripts.common":
        return set()
    if name.startswith("scripts.") or name == "benchmarks.harness":
        return {"scripts.common"}
    return {"scripts.common", "benchmarks.harness"}


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipes_and_benchmarks_import_only_the_helpers(path):
    tree, allowed = parse(path), may_import(dotted_name(path))
    bad = [(line, m) for line, m in imported_modules(tree) if m.split(".")[0] in ("scripts", "benchmarks")]
    bad = [(line, m) for line, m in bad if m not in allowed] + relative_imports(tree)
    assert not bad, (
        f"{path.relative_to(ROOT)} imports {bad}: it may import the package and {sorted(allowed) or 'nothing else'}, "
        "never a recipe or another benchmark"
    )


@pytest.mark.parametrize("name", HELPERS)
def test_a_helper_module_has_no_command_line(name):
    tree = parse(ROOT / f"{name.replace('.', '/')}.py")
    mains = [n.lineno for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    guards = [n.lineno for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert not mains + guards, f"{name} is a helper, not a benchmark or a recipe: no main(), no __main__ block"


def test_the_import_checks_see_every_kind_of_import():
    tree = ast.parse("import scripts.multi30k\ndef f():\n    from scripts.common import shown\nfrom . import x\n")
    assert imported_modules(tree) == [(1, "scripts.multi30k"), (3, "scripts.common")]
    assert relative_imports(tree) == [(4, ".")]
    assert may_import("benchmarks.experiments.malloc") == {"scripts.common", "benchmarks.harness"}
    assert may_import("scripts.multi30k") == may_import("benchmarks.harness") == {"scripts.common"}


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_scripts_and_benchmarks_use_public_names_only(path):
    problems = []
    for line, module_name, name in nanomt_names(parse(path)):
        where = f"{path.relative_to(ROOT)}:{line}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            problems.append(f"{where}: no module {module_name}")
            continue
        if name is None:
            continue
        if name.startswith("_"):
            problems.append(f"{where}: {module_name}.{name} is private")
        elif not hasattr(module, name) and not is_module(f"{module_name}.{name}"):
            problems.append(f"{where}: {module_name} has no {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_scripts_and_benchmarks_import_cleanly(path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # as `python -m scripts.X` from the repository root
    name = dotted_name(path)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name in OPTIONAL:
            pytest.skip(f"{name} needs {e.name} (the bench extra)")
        raise
    assert Path(module.__file__).resolve() == path, f"{name} was imported from {module.__file__}, not this checkout"


def test_no_function_of_the_package_is_over_80_lines():
    """A function a reader takes in at once: a longer one is phases to name."""
    long = []
    for path in PACKAGE_FILES:
        for node in ast.walk(parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert long == []
