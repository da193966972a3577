"""`nanomt translate` and the checkpoints it loads: streams, terminals, output files, devices, sampling, tokenizers."""

import io
import os
import pty
import select
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from conftest import NANOMT, run_nanomt, tiny_config
from safetensors import safe_open
from safetensors.torch import save_file

from nanomt.cli import main
from nanomt.core.checkpoint import (
    CONFIG,
    TOKENIZER,
    WEIGHTS,
    CheckpointError,
    average_checkpoints,
    read_weights,
    step_dirs,
)
from nanomt.core.config import config_from_dict
from nanomt.core.tokenizer import Tokenizer, train_tokenizer
from nanomt.decoding.translate import Translator
from nanomt.training.train import train

SENTENCES = ["la nuka korat.", "la belur nuka korat.", "nuka."]


@pytest.fixture(scope="module")
def run_dir(toy_corpus, tmp_path_factory):
    """A tiny model trained for a few seconds, with two checkpoints."""
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=20, save_every=10, eval_every=20))
    return train(cfg, tmp_path_factory.mktemp("translate") / "run")


def cli(*args, input: bytes = b""):
    return run_nanomt(*args, input=input)


def copy_run(run_dir, dest):
    return shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("bin", "metrics.jsonl"))


class TerminalText(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class FailingTranslator:
    """Stands in for a Translator that fails (or is interrupted) half-way through a file."""

    def __init__(self, error: BaseException):
        self.error = error

    def translate(self, lines, **kwargs):
        raise self.error


def test_invalid_utf8_on_stdin_is_a_one_line_error_naming_the_line(run_dir):
    res = cli("translate", run_dir, input=b"la nuka korat.\n\xff\xfe korat.\n")
    assert res.returncode == 1
    assert res.stderr.decode() == "nanomt: error: <stdin>: line 2: invalid UTF-8\n"
    assert res.stdout == b""


@pytest.mark.parametrize("error, code", [(ValueError("the model failed"), 1), (KeyboardInterrupt(), 130)])
def test_failed_translation_leaves_the_old_output_file(tmp_path, monkeypatch, error, code):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("la nuka korat.\nnuka.\n")
    out.write_text("yesterday's translations\n")
    monkeypatch.setattr(Translator, "from_checkpoints", classmethod(lambda cls, *a, **k: FailingTranslator(error)))
    with pytest.raises(SystemExit) as e:
        main(["translate", str(tmp_path), "-i", str(src), "-o", str(out)])
    assert e.value.code == code
    assert out.read_text() == "yesterday's translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary file left


def test_output_file_is_replaced_with_the_usual_permissions(run_dir, tmp_path):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    out.write_text("old\n")
    main(["translate", str(run_dir), "-i", str(src), "-o", str(out), "--beam", "1"])
    assert out.read_text().splitlines() == Translator.from_checkpoint(run_dir).translate(SENTENCES, beam_size=1)
    fresh = tmp_path / "fresh.txt"
    main(["translate", str(run_dir), "-i", str(src), "-o", str(fresh), "--beam", "1"])
    assert stat.S_IMODE(fresh.stat().st_mode) == stat.S_IMODE(src.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.txt", "in.txt", "out.txt"]


def test_tokenizer_of_another_run_is_refused_naming_both(run_dir, toy_corpus, tmp_path):
    other = copy_run(run_dir, tmp_path / "other")
    shutil.rmtree(other / TOKENIZER)
    cfg = config_from_dict(tiny_config(toy_corpus)).data
    src, tgt = (toy_corpus[f"train.{side}"].read_text().splitlines() for side in ("src", "tgt"))
    swapped = train_tokenizer(tgt, src, other / TOKENIZER, cfg)  # same sizes, other pieces
    ours = Tokenizer.load(run_dir / TOKENIZER)
    assert (swapped.src_vocab_size, swapped.tgt_vocab_size) == (ours.src_vocab_size, ours.tgt_vocab_size)
    with pytest.raises(CheckpointError) as e:
        Translator.from_checkpoint(other)
    message = str(e.value)
    assert "\n" not in message and ours.fingerprint()[:12] in message and swapped.fingerprint()[:12] in message
    # Weights saved before fingerprints were stored still load.
    save_file(read_weights(run_dir / WEIGHTS), str(other / WEIGHTS))
    assert Translator.from_checkpoint(other).translate(SENTENCES, beam_size=1)


def test_every_weights_file_carries_its_tokenizer_fingerprint(run_dir, tmp_path):
    avg = average_checkpoints([p for _, p in step_dirs(run_dir)], tmp_path / "avg")
    want = Tokenizer.load(run_dir / TOKENIZER).fingerprint()
    for path in (run_dir / WEIGHTS, *(p / WEIGHTS for _, p in step_dirs(run_dir)), avg / WEIGHTS):
        with safe_open(str(path), "pt") as f:
            assert (f.metadata() or {}).get("tokenizer_fingerprint") == want, path


def test_weights_have_the_permissions_of_the_other_run_files(run_dir, tmp_path):
    want = stat.S_IMODE((run_dir / CONFIG).stat().st_mode)
    avg = average_checkpoints([run_dir], tmp_path / "avg")
    for path in (run_dir / WEIGHTS, *(p / WEIGHTS for _, p in step_dirs(run_dir)), avg / WEIGHTS):
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_run_without_weights_falls_back_to_its_newest_step_checkpoint(run_dir, tmp_path):
    run = copy_run(run_dir, tmp_path / "run")
    (run / WEIGHTS).unlink()  # interrupted before its first evaluation
    newest = step_dirs(run)[-1][1]
    res = cli("translate", run, "--beam", 1, input="\n".join(SENTENCES).encode() + b"\n")
    assert res.returncode == 0, res.stderr
    notice = res.stderr.decode()
    assert notice.count("\n") == 1 and str(newest) in notice and WEIGHTS in notice
    expected = Translator.from_checkpoint(newest).translate(SENTENCES, beam_size=1)
    assert res.stdout.decode().splitlines() == expected


@pytest.mark.parametrize(
    "args",
    [
        ["translate", "{run}", "--device", "cuda"],
        ["evaluate", "{run}", "--src", "{src}", "--ref", "{src}", "--device", "cuda:0"],
        ["plot", "attention", "{run}", "nuka.", "--device", "cuda"],
        ["serve", "{run}", "--device", "cuda"],
        ["translate", "{run}", "--device", "gpu"],
    ],
)
def test_unavailable_device_is_a_one_line_error(run_dir, tmp_path, monkeypatch, capsys, args):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU-only build, on any machine
    src = tmp_path / "src.txt"
    src.write_text("nuka.\n")
    with pytest.raises(SystemExit) as e:
        main([a.format(run=run_dir, src=src) for a in args])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("nanomt: error: --device") and err.count("\n") == 1, err


def test_progress_is_shown_on_a_terminal_for_stdin_too(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(SENTENCES).encode() + b"\n")))
    err = TerminalText()
    monkeypatch.setattr(sys, "stderr", err)
    main(["translate", str(run_dir), "--beam", "1"])
    assert capsys.readouterr().out.count("\n") == 3
    assert "3/3" in err.getvalue()


def read_line(stream, timeout: float) -> str | None:
    """The next line of a pipe, or None if none comes within `timeout` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().decode().rstrip("\n") if ready else None


@pytest.mark.slow  # a process on a pseudo-terminal
def test_terminal_input_is_translated_line_by_line(run_dir):
    translator = Translator.from_checkpoint(run_dir)
    expected = [translator.translate([s], beam_size=1)[0] for s in SENTENCES[:2]]
    terminal, stdin = pty.openpty()
    proc = subprocess.Popen(
        [*NANOMT, "translate", str(run_dir), "--beam", "1"], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    os.close(stdin)
    try:
        for sentence, want in zip(SENTENCES[:2], expected):
            os.write(terminal, sentence.encode() + b"\n")
            assert read_line(proc.stdout, timeout=60) == want  # before the end of the input
        os.write(terminal, b"\x04")  # Ctrl-D ends the input
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(terminal)
        proc.stdout.close()
        proc.stderr.close()


def test_sampling_from_the_cli_is_the_translators(run_dir, toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()[:8]
    stdin = ("\n".join(lines) + "\n").encode()
    options = ["--sampling", "--sampling-topk", 8, "--sampling-topp", 0.9, "--temperature", 1.5, "--seed", 7]
    res = cli("translate", run_dir, *options, input=stdin)
    assert res.returncode == 0, res.stderr
    translator = Translator.from_checkpoint(run_dir)
    sampling = {"temperature": 1.5, "top_k": 8, "top_p": 0.9, "seed": 7}
    assert res.stdout.decode().splitlines() == translator.translate(lines, sampling=sampling)
    other_seed = translator.translate(lines, sampling={**sampling, "seed": 8})
    assert other_seed != translator.translate(lines, sampling=sampling)


def test_sampling_options_need_sampling(capsys):
    with pytest.raises(SystemExit) as e:
        main(["translate", "run", "--temperature", "0.7"])
    assert e.value.code == 1 and "--sampling" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_decoding_commands_keep_freed_memory_once_the_model_is_loaded(run_dir, tmp_path, monkeypatch, command):
    """Beam search's large blocks stay in the heap (benchmarks/results/decode_malloc.json): set after loading."""
    from nanomt.core import runtime

    events = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: events.append("malloc") or True)
    load = Translator.from_checkpoints
    monkeypatch.setattr(Translator, "from_checkpoints", lambda *a, **k: events.append("load") or load(*a, **k))
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    args = ["--input", str(src)] if command == "translate" else ["--src", str(src), "--ref", str(src)]
    main([command, str(run_dir), *args, "--beam", "2"])
    assert events == ["load", "malloc"]


def test_a_file_shows_its_progress_on_a_terminal_and_nothing_when_piped(run_dir, toy_corpus, tmp_path, monkeypatch):
    lines = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:100]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    piped = cli("translate", run_dir, "--format", "text", "--input", src, "--output", tmp_path / "piped.txt")
    assert piped.returncode == 0, piped.stderr
    err = piped.stderr.decode()
    assert "sent" not in err and "\r" not in err and "100/100" not in err, err  # no bar
    terminal = TerminalText()
    monkeypatch.setattr(sys, "stderr", terminal)
    main(["translate", str(run_dir), "--format", "text", "--input", str(src), "--output", str(tmp_path / "shown.txt")])
    assert "100/100" in terminal.getvalue() and "sent" in terminal.getvalue(), terminal.getvalue()
    # In chunks (the bar) or in one call (piped), the same translation.
    assert (tmp_path / "shown.txt").read_bytes() == (tmp_path / "piped.txt").read_bytes()


def test_a_file_is_tagged_with_the_runs_target_language_where_its_config_names_one(run_dir, tmp_path, monkeypatch):
    from nanomt.core import languages
    from nanomt.documents import translation as dt

    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    targets = []
    document_file = dt.document_file
    monkeypatch.setattr(dt, "document_file", lambda *a, **k: targets.append(k["target"]) or document_file(*a, **k))
    main(["translate", str(run_dir), "--format", "text", "--input", str(src), "--output", str(tmp_path / "a.txt")])
    monkeypatch.setattr(languages, "language_pair", lambda data: ("de", "en"))
    main(["translate", str(run_dir), "--format", "text", "--input", str(src), "--output", str(tmp_path / "b.txt")])
    assert targets == [None, "en"]  # the toy run's train.src and train.tgt name no language
