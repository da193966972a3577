"""Text in, text out: translate, evaluate, average, plot and demo through the CLI and the Translator."""

import argparse
import importlib.metadata
import json
import shutil

import matplotlib.image
import pytest
import sacrebleu
import torch
from conftest import run_nanomt, tiny_config, tree

from nanomt.cli import build_parser, main
from nanomt.core.checkpoint import WEIGHTS, CheckpointError, read_weights, save_weights, step_dirs
from nanomt.core.config import config_from_dict
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.quantize import is_quantized
from nanomt.decoding.translate import Translator
from nanomt.training.train import train


@pytest.fixture(scope="module")
def run_dir(toy_corpus, tmp_path_factory):
    """A tiny model trained for a few seconds, with three checkpoints."""
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=60, save_every=20, keep_last=3, eval_every=60))
    return train(cfg, tmp_path_factory.mktemp("cli") / "run")


def cli(*args, input=None):
    return run_nanomt(*args, input=input, text=True)


def test_translate_stdin_to_stdout_keeps_lines_and_order(run_dir, toy_corpus):
    srcs = toy_corpus["test.src"].read_text().splitlines()[:8]
    lines = srcs[:3] + [""] + srcs[3:]
    res = cli("translate", run_dir, "--beam", 2, input="\n".join(lines) + "\n")
    assert res.returncode == 0, res.stderr
    out = res.stdout.split("\n")[:-1]
    assert len(out) == len(lines) and out[3] == ""
    translator = Translator.from_checkpoint(run_dir)
    one_by_one = [translator.translate([s], beam_size=2)[0] if s else "" for s in lines]
    assert out == one_by_one  # batching and sorting by length do not change any sentence's translation


def test_translate_files_and_n_best(run_dir, toy_corpus, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(toy_corpus["test.src"].read_text().splitlines()[:4]) + "\n")
    res = cli("translate", run_dir, "--input", src, "--output", tmp_path / "out.txt", "--n-best", 3, "--beam", 4)
    assert res.returncode == 0, res.stderr
    rows = [line.split("\t") for line in (tmp_path / "out.txt").read_text().splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for i in range(4):
        scores = [float(r[1]) for r in rows[3 * i : 3 * i + 3]]
        assert scores == sorted(scores, reverse=True)
        assert len({r[2] for r in rows[3 * i : 3 * i + 3]}) == 3


def test_translate_int8_is_the_quantized_translator(run_dir, toy_corpus):
    lines = toy_corpus["test.src"].read_text().splitlines()[:6]
    res = cli("translate", run_dir, "--int8", "--beam", 3, input="\n".join(lines) + "\n")
    assert res.returncode == 0, res.stderr
    int8 = Translator.from_checkpoint(run_dir, int8=True)
    assert int8.int8 and is_quantized(int8.model)
    assert res.stdout.splitlines() == int8.translate(lines, beam_size=3)
    assert not is_quantized(Translator.from_checkpoint(run_dir).model)


def test_checkpoint_with_another_vocabulary_is_refused(run_dir, toy_corpus, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad, ignore=shutil.ignore_patterns("checkpoints", "bin"))
    shutil.rmtree(bad / "tokenizer")
    cfg = config_from_dict(tiny_config(toy_corpus)).data
    lines = toy_corpus["train.src"].read_text().splitlines()
    train_tokenizer(lines, lines, bad / "tokenizer", cfg.__class__(vocab_size=90, shared_vocab=False))
    with pytest.raises(CheckpointError, match="does not match"):
        Translator.from_checkpoint(bad)
    res = cli("translate", bad, input="la nuka korat.\n")
    assert res.returncode == 1 and res.stderr.startswith("nanomt: error:") and "vocabulary" in res.stderr


@pytest.mark.slow
def test_ensemble_of_checkpoints_translates_and_evaluates(run_dir, toy_corpus):
    steps = [p for _, p in step_dirs(run_dir)]
    lines = toy_corpus["test.src"].read_text().splitlines()[:6]
    res = cli("translate", steps[-1], steps[0], "--beam", 3, input="\n".join(lines) + "\n")
    assert res.returncode == 0, res.stderr
    ensemble = Translator.from_checkpoints([steps[-1], steps[0]])
    assert isinstance(ensemble.model, Ensemble) and len(ensemble.model.members) == 2
    assert res.stdout.splitlines() == ensemble.translate(lines, beam_size=3)
    # Two copies of one model average to that model's probabilities: the same translations.
    copies = Translator.from_checkpoints([run_dir, run_dir]).translate(lines, beam_size=3)
    assert copies == Translator.from_checkpoint(run_dir).translate(lines, beam_size=3)
    res = cli("evaluate", steps[-1], steps[0], "--src", toy_corpus["test.src"], "--ref", toy_corpus["test.tgt"])
    assert res.returncode == 0 and "BLEU =" in res.stdout, res.stderr


def test_ensemble_of_checkpoints_with_different_tokenizers_is_refused(run_dir, toy_corpus, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("checkpoints", "bin"))
    shutil.rmtree(other / "tokenizer")
    cfg = config_from_dict(tiny_config(toy_corpus)).data
    src, tgt = (toy_corpus[f"train.{side}"].read_text().splitlines() for side in ("src", "tgt"))
    train_tokenizer(tgt, src, other / "tokenizer", cfg)  # same sizes, other pieces: only the fingerprint differs
    save_weights(read_weights(other / WEIGHTS), other / WEIGHTS)  # now stored with the new tokenizer's fingerprint
    Translator.from_checkpoint(other)  # a valid checkpoint on its own
    with pytest.raises(CheckpointError, match="tokenizer differs"):
        Translator.from_checkpoints([run_dir, other])
    res = cli("translate", run_dir, other, input="la nuka korat.\n")
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "tokenizer differs" in res.stderr


@pytest.mark.slow
def test_evaluate_json_matches_sacrebleu(run_dir, toy_corpus, tmp_path):
    hyp = tmp_path / "hyp.txt"
    res = cli(
        "evaluate",
        run_dir,
        "--src",
        toy_corpus["test.src"],
        "--ref",
        toy_corpus["test.tgt"],
        "--beam",
        2,
        "--json",
        "--save-hyp",
        hyp,
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    for key in ("bleu", "chrf", "bleu_signature", "chrf_signature", "sentences", "seconds", "tokens_per_s"):
        assert key in report
    refs = toy_corpus["test.tgt"].read_text().splitlines()
    hyps = hyp.read_text().splitlines()
    assert report["sentences"] == len(refs) == len(hyps)
    assert report["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert report["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert "tok:13a" in report["bleu_signature"]
    text = cli("evaluate", run_dir, "--src", toy_corpus["test.src"], "--ref", toy_corpus["test.tgt"], "--beam", 1)
    assert text.returncode == 0 and "BLEU =" in text.stdout and "chrF =" in text.stdout


def test_evaluate_mismatched_files_is_one_line_error(run_dir, toy_corpus, tmp_path):
    short = tmp_path / "short.tgt"
    short.write_text("one line\n")
    res = cli("evaluate", run_dir, "--src", toy_corpus["test.src"], "--ref", short)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "short.tgt" in res.stderr and "100" in res.stderr


@pytest.mark.slow
def test_average_is_the_mean_and_a_complete_checkpoint(run_dir, tmp_path):
    steps = [p for _, p in step_dirs(run_dir)]
    assert len(steps) == 3
    res = cli("average", *steps[-2:], "--out", tmp_path / "avg")
    assert res.returncode == 0, res.stderr
    a, b = read_weights(steps[-2] / WEIGHTS), read_weights(steps[-1] / WEIGHTS)
    avg = read_weights(tmp_path / "avg" / WEIGHTS)
    for name in a:
        torch.testing.assert_close(avg[name], (a[name] + b[name]) / 2)
    res = cli("average", run_dir, "--last", 2, "--out", tmp_path / "avg2")
    assert res.returncode == 0, res.stderr
    assert all(torch.equal(avg[n], read_weights(tmp_path / "avg2" / WEIGHTS)[n]) for n in avg)
    res = cli("translate", tmp_path / "avg2", "--beam", 1, input="la nuka korat.\n")
    assert res.returncode == 0 and res.stdout.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ["average", "RUN", "--last", "2", "--out", "OUT"],
        ["export", "ct2", "RUN", "--out", "OUT"],
        ["export", "onnx", "RUN", "--out", "OUT"],
        ["import", "marian", "RUN", "--out", "OUT"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_directory_to_write_that_is_not_empty_is_refused_and_left_as_it_was(run_dir, tmp_path, command):
    """The run itself, a folder holding a file, a file: one line naming --out, nothing written anywhere (a model,
    or an export, is never replaced or mixed with another)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("notes\n")
    (tmp_path / "a_file").write_text("notes\n")
    before = tree(tmp_path)
    for out in (run, tmp_path / "folder", tmp_path / "a_file"):
        res = cli(*[{"RUN": run, "OUT": out}.get(a, a) for a in command])
        assert res.returncode == 1 and res.stderr.strip().count("\n") == 0, res.stderr
        assert f"--out {out}: already exists and is not empty" in res.stderr
        assert tree(tmp_path) == before


def test_plots_from_the_cli(run_dir, tmp_path):
    for args in (
        ("attention", run_dir, "la nuka belur korat.", "-o", tmp_path / "att.png"),
        ("attention", run_dir, "la nuka korat.", "--kind", "encoder", "--head", 1, "-o", tmp_path / "enc.png"),
        ("positions", "-o", tmp_path / "pos.png"),
        ("curves", run_dir, "-o", tmp_path / "curves.png"),
    ):
        res = cli("plot", *args)
        assert res.returncode == 0, res.stderr
        assert matplotlib.image.imread(str(args[-1])).shape[0] > 100
    res = cli("plot", "attention", run_dir, "x", "--layer", 5, "-o", tmp_path / "x.png")
    assert res.returncode == 1 and "--layer 5" in res.stderr


def test_help_lists_every_command():
    res = cli("--help")
    for command in ("train", "translate", "evaluate", "average", "plot", "synth", "import", "export", "demo", "serve"):
        assert command in res.stdout


@pytest.mark.slow
def test_synth_writes_the_toy_pair(tmp_path):
    res = cli("synth", tmp_path / "toy", "--pairs", 50, "--seed", 3)
    assert res.returncode == 0, res.stderr
    for split in ("train", "valid", "test"):
        assert (tmp_path / "toy" / f"{split}.src").is_file() and (tmp_path / "toy" / f"{split}.tgt").is_file()
    assert len((tmp_path / "toy" / "train.src").read_text().splitlines()) == 50
    toy = tmp_path / "toy"
    assert res.stdout.splitlines() == [
        f"{split}: {n} pairs in {toy / split}.src and {toy / split}.tgt"
        for split, n in (("train", 50), ("valid", 500), ("test", 500))
    ]


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    res = cli("demo", "--out", tmp_path / "demo", "--steps", 20, "--pairs", 1000)
    assert res.returncode == 0, res.stderr
    assert "test BLEU (beam 5)" in res.stdout and "greedy:" in res.stdout and "beam 5:" in res.stdout
    assert (tmp_path / "demo" / "attention.png").is_file() and (tmp_path / "demo" / "curves.png").is_file()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"nanomt {importlib.metadata.version('nanomt')}\n"


def test_every_option_of_every_command_has_help():
    missing = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    walk(sub, f"{name} {command}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "nanomt")
    assert missing == []


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--beam", "0"], "beam_size must be >= 1"),
        (["--n-best", "4", "--beam", "2"], "n_best must be in [1, beam_size=2]"),
        (["--repetition-penalty", "0"], "repetition_penalty must be > 0"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    ],
)
def test_decoding_flags_are_checked_before_the_model_is_loaded(run_dir, monkeypatch, capsys, flags, message):
    monkeypatch.setattr(Translator, "from_checkpoints", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        main(["translate", str(run_dir), *flags])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"nanomt: error: {message}") and err.count("\n") == 1, err


def test_input_and_output_files_are_checked_before_the_model_is_loaded(run_dir, toy_corpus, monkeypatch, tmp_path,
                                                                      capsys):  # fmt: skip
    """A folder given as --input or --output, and an --output whose folder does not exist: one line naming it, before
    the model is loaded (not after the translating, with a temporary file's name)."""
    monkeypatch.setattr(Translator, "from_checkpoints", lambda *a, **k: pytest.fail("the model was loaded"))
    src = toy_corpus["test.src"]
    for flags, message in [
        (["-i", tmp_path], f"--input {tmp_path} is a directory"),
        (["-i", src, "-o", tmp_path], f"--output {tmp_path} is a directory"),
        (["-i", src, "-o", tmp_path / "no" / "out.txt"], f"--output {tmp_path / 'no' / 'out.txt'}: its folder"),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["translate", str(run_dir), *map(str, flags)])
        assert e.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith(f"nanomt: error: {message}") and err.count("\n") == 1, err


def test_the_decoding_starts_from_the_checkpoints_and_reaches_the_translator_whole(run_dir, monkeypatch, tmp_path):
    from nanomt.core.decoding import Decoding

    seen = []
    translate = Translator.translate_hypotheses

    def recorded(self, sentences, decoding=None, **kw):
        seen.append((decoding, kw))
        return translate(self, sentences, decoding, **kw)

    monkeypatch.setattr(Translator, "translate_hypotheses", recorded)
    src = tmp_path / "src.txt"
    src.write_text("la nuka korat.\n")
    main(["translate", str(run_dir), "-i", str(src), "--min-len", "2", "-o", str(tmp_path / "out.txt")])
    main(["evaluate", str(run_dir), "--src", str(src), "--ref", str(src), "--min-len", "2", "--json"])
    want = Translator.from_checkpoint(run_dir).default_decoding.replace(min_len=2)
    assert [d for d, _ in seen] == [want, want] and all(isinstance(d, Decoding) for d, _ in seen)
    assert all(not {"min_len", "beam_size", "n_best"} & set(kw) for _, kw in seen)  # no settings beside it
