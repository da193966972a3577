"""Start-up: parsing and --help import no torch and no server code; a command whose extra is missing says which
to install in one line; `nanomt serve`'s flags are ServeConfig's fields."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import zipfile

import pytest
from conftest import tiny_config

from nanomt.cli.parser import FILE_FORMATS, build_parser, setting_flags, settings_from_args
from nanomt.serve.settings import ModelSpec, ServeConfig, setting

# Modules whose import a parse must not pay: torch, the server's, and numpy (start-up is part of speed).
HEAVY = ("torch", "fastapi", "uvicorn", "prometheus_client", "numpy", "nanomt.serve.app", "nanomt.decoding")

# A subprocess that runs the `nanomt` command with the modules named in sys.argv[1] (comma-separated) made
# uninstallable, as in an install without the extra; it then prints, on stderr's last line, the heavy modules loaded.
RUN = """
import sys
blocked = set(filter(None, sys.argv[1].split(",")))

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Uninstalled())
from nanomt.cli import main
try:
    main(sys.argv[2:])
    code = 0
except SystemExit as e:
    code = e.code
heavy = HEAVY
print(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)), file=sys.stderr)
sys.exit(code)
""".replace("HEAVY", repr(HEAVY))


def nanomt(*args, blocked: tuple[str, ...] = ()) -> tuple[int, list[str], str]:
    """Exit code, stderr's lines before the last, and the heavy modules loaded (stderr's last line)."""
    res = subprocess.run(
        [sys.executable, "-c", RUN, ",".join(blocked), *map(str, args)], capture_output=True, text=True, timeout=300
    )
    *err, loaded = res.stderr.splitlines()
    return res.returncode, err, loaded


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["serve", "--help"], ["translate", "--help"], ["train", "--help"]],
    ids=" ".join,
)
def test_parsing_and_help_import_neither_torch_nor_the_server(args):
    code, err, loaded = nanomt(*args)
    assert code == 0, err
    assert loaded == "[]"


@pytest.mark.parametrize(
    "args, blocked, extra",
    [
        (["serve", "runs/nowhere"], "fastapi", "serve"),
        (["serve", "runs/nowhere"], "uvicorn", "serve"),
        (["export", "onnx", "runs/nowhere", "--out", "nowhere"], "onnx", "export"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else x,
)
def test_a_command_without_its_extra_is_one_line_naming_it(args, blocked, extra):
    code, err, _ = nanomt(*args, blocked=(blocked,))
    assert code == 1
    assert len(err) == 1 and err[0].startswith("nanomt: error: ") and f"pip install 'nanomt[{extra}]'" in err[0], err


def test_serve_settings_and_the_package_import_without_fastapi_or_torch():
    code = (
        "import sys, nanomt, nanomt.serve, nanomt.serve.settings; "
        "assert not {'torch', 'fastapi'} & set(sys.modules), sorted(sys.modules); "
        "from nanomt import Decoding; assert Decoding().beam_size >= 1; assert 'torch' not in sys.modules; "
        "assert 'Translator' in dir(nanomt) and 'ServeConfig' in dir(nanomt.serve); print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.slow  # a process of its own
def test_translating_loads_no_compiler():
    """Importing the Translator (the model included) leaves torch's compiler unloaded: it costs 1.2 s of start-up
    (torch.nn.attention.varlen imports it; packed training on CUDA loads it when it runs)."""
    code = (
        "import sys; from nanomt.decoding.translate import Translator; "
        "assert 'torch' in sys.modules and 'torch._dynamo' not in sys.modules, 'torch._dynamo'; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_public_names_are_imported_when_used():
    import nanomt
    from nanomt.core.config import ModelConfig
    from nanomt.decoding.translate import Translator

    assert nanomt.ModelConfig is ModelConfig and nanomt.Translator is Translator
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        nanomt.Nope  # noqa: B018


@pytest.fixture(scope="module")
def run_dir(toy_corpus, tmp_path_factory):
    from nanomt.core.config import config_from_dict
    from nanomt.training.train import train

    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=2, eval_every=2, save_every=2))
    return train(cfg, tmp_path_factory.mktemp("startup") / "run")


@pytest.mark.slow  # a process of its own
def test_a_file_format_without_its_extra_is_one_line_naming_it(run_dir, tmp_path):
    docx = pytest.importorskip("docx")
    document = docx.Document()
    document.add_paragraph("la nuka korat.")
    document.save(tmp_path / "in.docx")
    args = ["translate", run_dir, "--format", "docx", "-i", tmp_path / "in.docx", "-o", tmp_path / "out.docx"]
    code, err, _ = nanomt(*args, blocked=("docx",))
    assert code == 1
    assert len(err) == 1 and "python-docx" in err[0] and "pip install 'nanomt[files]'" in err[0], err
    assert not (tmp_path / "out.docx").exists()
    assert zipfile.is_zipfile(tmp_path / "in.docx")


def test_file_formats_of_the_parser_are_the_documents():
    from nanomt.documents.files import FORMATS

    assert FILE_FORMATS == tuple(sorted(set(FORMATS.values())))


# ---------------------------------------------------------------------------------------------------------
# `nanomt serve`'s flags, written once: ServeConfig's fields.
# ---------------------------------------------------------------------------------------------------------

INTERNAL = {"languages"}  # set through the Python API only (create_app with a Translator)


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_serve_setting_is_a_flag_of_nanomt_serve():
    dests = {a.dest for a in serve_parser()._actions if not isinstance(a, argparse._HelpAction)}
    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    assert dests == fields - INTERNAL
    options = {opt for a in serve_parser()._actions for opt in a.option_strings}
    # The names and behaviours that do not follow from the field's name.
    assert {"--beam", "--one-lock", "--no-access-log", "--glossary", "--api-key"} <= options


def test_serve_flags_build_the_serve_config(tmp_path, monkeypatch):
    monkeypatch.delenv("NANOMT_API_KEY", raising=False)
    parse = lambda *args: settings_from_args(ServeConfig, build_parser().parse_args(["serve", *map(str, args)]))  # noqa: E731
    assert parse("runs/a") == ServeConfig(models=(ModelSpec("runs/a"),))  # the defaults are ServeConfig's
    glossary = tmp_path / "glossary.tsv"
    glossary.write_text("nuka\tdog\n")
    config = parse(
        "de-en=runs/a", "runs/b", "--beam", "3", "--one-lock", "--no-access-log", "--glossary", glossary,
        "--timeout", "7", "--max-wait-ms", "2.5", "--int8", "--api-key", "k",
    )  # fmt: skip
    assert config.models == (ModelSpec("runs/a", "de", "en"), ModelSpec("runs/b"))
    assert (config.default_beam, config.batching, config.access_log, config.glossary) == (
        3,
        False,
        False,
        (("nuka", "dog"),),
    )
    assert (config.timeout, config.max_wait_ms, config.int8, config.api_key) == (7.0, 2.5, True, "k")
    with pytest.raises(ValueError, match="beam size must be in"):
        parse("runs/a", "--beam", "99")
    for port in (-1, 65536):
        with pytest.raises(ValueError, match=f"port must be in 0..65535, got {port}"):
            parse("runs/a", "--port", port)
    for flag, value, words in [
        ("--max-wait-ms", "nan", "max_wait_ms must be >= 0 and finite, got nan"),
        ("--max-wait-ms", "inf", "max_wait_ms must be >= 0 and finite, got inf"),
        ("--cache-age", "inf", "cache_age > 0 and finite, got 100000, inf"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse("runs/a", flag, value)


def test_a_new_setting_with_its_metadata_is_a_flag():
    @dataclasses.dataclass(frozen=True)
    class Extended(ServeConfig):
        warm_up: int = setting(3, help="sentences translated at start (default %(default)s)")
        verbose_errors: bool = setting(False, help="tracebacks in error answers")
        internal: str = "x"  # no metadata: no flag

    parser = argparse.ArgumentParser()
    flags = {names[0]: kwargs for names, kwargs in setting_flags(Extended)}
    assert "--warm-up" in flags and "--verbose-errors" in flags and "--internal" not in flags
    for names, kwargs in setting_flags(Extended):
        parser.add_argument(*names, **kwargs)
    assert "(default 3)" in parser.format_help()
    given = settings_from_args(Extended, parser.parse_args(["runs/a", "--warm-up", "5", "--verbose-errors"]))
    assert (given.warm_up, given.verbose_errors, given.internal) == (5, True, "x")
    default = settings_from_args(Extended, parser.parse_args(["runs/a"]))
    assert (default.warm_up, default.verbose_errors) == (3, False)


def test_loading_a_translator_keeps_the_collector_off_and_freezes_what_it_made():
    """No cyclic collection while torch and the model load (0.19 s of a one-line translate); the collector is back
    on afterwards, an error included, and what loading made is out of its passes."""
    import gc

    from nanomt.cli import no_collection_while_loading

    try:
        with pytest.raises(ValueError), no_collection_while_loading():
            assert not gc.isenabled()
            raise ValueError("a checkpoint that does not load")
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
