"""Every decoding flag of `nanomt translate` and `nanomt evaluate` reaches the search as the Translator's keyword
argument (and the checkpoint's decode section) does; --max-tokens batches the sentences as the Translator's does.

Each setting is one that changes the output of the tiny model trained here (asserted), so that a flag dropped on its
way shows as a different output, never as a test that passes because the setting changed nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import flag_run
import pytest
from flag_run import GLOSSARY, PREFIXES, Inputs, with_decode

from nanomt.cli import main
from nanomt.core.model import Transformer
from nanomt.decoding.translate import Translator

run_dir, inputs = flag_run.run_dir, flag_run.inputs  # flag_run's fixtures, this module's too

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


@dataclass(frozen=True)
class Case:
    """One decoding flag: `flags` added to `base` (flags of the run with it and of the run without it).

    `settings` are the Translator's keyword arguments asking for both, `base_settings` those of the output without
    the flag. `decode` is the config's decode section setting the same (None where the config has no such field).
    Paths in flags are Inputs' fields in braces.
    """

    name: str
    flags: list[str]
    settings: dict
    base: list[str] = field(default_factory=list)
    base_settings: dict = field(default_factory=dict)
    decode: dict | None = None
    commands: tuple[str, ...] = ("translate", "evaluate")


LONG = dict(base=["--min-len", "8"], base_settings={"min_len": 8})  # long translations that repeat themselves
SAMPLED = dict(base=["--sampling", "--seed", "0"], base_settings={"sampling": {"seed": 0}}, commands=("translate",))


# fmt: off
CASES = [
    Case("beam", ["--beam", "1"], {"beam_size": 1}, decode={"beam_size": 1}),
    Case("length_penalty", ["--length-penalty", "3"], {"length_penalty": 3.0}, decode={"length_penalty": 3.0}),
    Case("min_len", ["--min-len", "6"], {"min_len": 6}, decode={"min_len": 6}),
    Case("max_len_a", ["--max-len-a", "0"], {"max_len_a": 0.0, "max_len_b": 1}, base=["--max-len-b", "1"],
         base_settings={"max_len_b": 1}, decode={"max_len_a": 0.0}),
    Case("max_len_b", ["--max-len-b", "2"], {"max_len_b": 2, "max_len_a": 0.0}, base=["--max-len-a", "0"],
         base_settings={"max_len_a": 0.0}, decode={"max_len_b": 2}),
    Case("no_repeat_ngram_size", ["--no-repeat-ngram-size", "1"], {"no_repeat_ngram_size": 1, "min_len": 8},
         decode={"no_repeat_ngram_size": 1}, **LONG),
    Case("repetition_penalty", ["--repetition-penalty", "1.5"], {"repetition_penalty": 1.5, "min_len": 8},
         decode={"repetition_penalty": 1.5}, **LONG),
    Case("glossary", ["--glossary", "{glossary}"], {"glossary": GLOSSARY}),
    Case("n_best", ["--n-best", "2"], {"n_best": 2}, commands=("translate",)),
    Case("prefix_file", ["--prefix-file", "{prefixes}"], {"prefixes": PREFIXES}, commands=("translate",)),
    # One sentence a batch: batch k, sentence k, is seeded 5 + k.
    Case("max_tokens", ["--max-tokens", "1"], {"max_tokens": 1, "sampling": {"seed": 5}},
         base=["--sampling", "--seed", "5"], base_settings={"sampling": {"seed": 5}}, decode={"max_tokens": 1},
         commands=("translate",)),
    Case("sampling", ["--sampling", "--sampling-topk", "8", "--sampling-topp", "0.9", "--temperature", "1.5",
                      "--seed", "7"], {"sampling": {"top_k": 8, "top_p": 0.9, "temperature": 1.5, "seed": 7}},
         commands=("translate",)),
    Case("sampling_topk", ["--sampling-topk", "1"], {"sampling": {"top_k": 1, "seed": 0}}, **SAMPLED),
    Case("sampling_topp", ["--sampling-topp", "0.3"], {"sampling": {"top_p": 0.3, "seed": 0}}, **SAMPLED),
    Case("temperature", ["--temperature", "0.01"], {"sampling": {"temperature": 0.01, "seed": 0}}, **SAMPLED),
    # A seed has no default that repeats: "without it" is another seed.
    Case("seed", ["--seed", "7"], {"sampling": {"seed": 7}}, base=["--sampling"],
         base_settings={"sampling": {"seed": 8}}, commands=("translate",)),
]
# fmt: on


def cli_lines(command: str, ckpt, flags: list[str], inputs: Inputs, capsys, tmp_path) -> list[str]:
    """The translations `nanomt translate` prints (with --n-best, its lines) or `nanomt evaluate` saves."""
    flags = [f.format(**vars(inputs)) for f in flags]
    capsys.readouterr()
    if command == "translate":
        main(["translate", str(ckpt), "-i", str(inputs.src), *flags])
        return capsys.readouterr().out.splitlines()
    hyp = tmp_path / "hyp.txt"
    files = ["--src", str(inputs.src), "--ref", str(inputs.ref), "--save-hyp", str(hyp)]
    main(["evaluate", str(ckpt), *files, "--json", *flags])
    assert json.loads(capsys.readouterr().out)["sentences"] == len(inputs.lines)
    return hyp.read_text(encoding="utf-8").splitlines()


def direct_lines(translator: Translator, lines: list[str], settings: dict) -> list[str]:
    """The Translator's output with these keyword arguments, written as `nanomt translate` writes it."""
    if "n_best" in settings:
        hyps = translator.translate_n_best(lines, **settings)
        return [f"{i}\t{score:.4f}\t{text}" for i, hs in enumerate(hyps) for text, score in hs]
    return translator.translate(lines, **settings)


@pytest.mark.parametrize(
    "command, case",
    [(command, case) for case in CASES for command in case.commands],
    ids=lambda x: x if isinstance(x, str) else x.name,
)
def test_a_decoding_flag_reaches_the_search_as_the_translator_and_the_config_take_it(
    run_dir, translator, inputs, tmp_path, capsys, command, case
):
    want = direct_lines(translator, inputs.lines, case.settings)
    assert want != direct_lines(translator, inputs.lines, case.base_settings)  # the flag changes the output
    assert cli_lines(command, run_dir, [*case.base, *case.flags], inputs, capsys, tmp_path) == want
    if case.decode is not None:
        ckpt = with_decode(run_dir, tmp_path / "set", **case.decode)
        assert cli_lines(command, ckpt, case.base, inputs, capsys, tmp_path) == want


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_max_tokens_from_the_flag_or_the_config_batches_the_sentences_as_the_translators(
    run_dir, translator, inputs, tmp_path, capsys, monkeypatch, command
):
    batches = []
    encode = Transformer.encode
    monkeypatch.setattr(
        Transformer, "encode", lambda self, src, **kw: batches.append(len(src)) or encode(self, src, **kw)
    )

    def sizes(run) -> list[int]:
        batches.clear()
        run()
        return list(batches)

    want = sizes(lambda: translator.translate(inputs.lines, max_tokens=40))
    assert want != sizes(lambda: translator.translate(inputs.lines))  # 40 tokens: more batches than the default's
    assert sizes(lambda: cli_lines(command, run_dir, ["--max-tokens", "40"], inputs, capsys, tmp_path)) == want
    ckpt = with_decode(run_dir, tmp_path / "set", max_tokens=40)
    assert sizes(lambda: cli_lines(command, ckpt, [], inputs, capsys, tmp_path)) == want
