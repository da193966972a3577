"""What must survive a redesign of the CLI and the server: every `nanomt serve` flag below reaches the server it
starts, every decoding flag of `nanomt translate` and `nanomt evaluate` reaches the search as the Translator's keyword
argument (and the checkpoint's decode section) does, and /attention decodes with the beam it is asked for.

Each setting is one that changes the output of the tiny model trained here (asserted), so that a flag dropped on its
way shows as a different output, never as a test that passes because the setting changed nothing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

from nanomt.cli import main
from nanomt.core import runtime
from nanomt.core.config import config_from_dict, load_config, save_config
from nanomt.core.model import Transformer
from nanomt.decoding.translate import Translator
from nanomt.serve.keys import key_line
from nanomt.training.train import train

pytestmark = pytest.mark.usefixtures("one_thread")

GLOSSARY = (("fesa", "dask"),)
PREFIXES = ["twa", "ek rud", "tha swil", "twa", "ek", "tha", "blek", "twa"]


@pytest.fixture(scope="module")
def run_dir(toy_corpus, tmp_path_factory):
    """A tiny model trained for a few seconds (its checkpoint's default beam is 2)."""
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=60, eval_every=60, save_every=60))
    return train(cfg, tmp_path_factory.mktemp("redesign") / "run")


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_checkpoint(run_dir)


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


# ---------------------------------------------------------------------------------------------------------
# nanomt serve's flags.
# ---------------------------------------------------------------------------------------------------------


def loaded(client) -> list[tuple]:
    """(loaded, device, int8) of each model /health lists."""
    return [(m["loaded"], m["device"], m["int8"]) for m in client.get("/health").json()["models"]]


def rounded_cross(att) -> np.ndarray:
    """A SentenceAttention's cross-attention (layers, H, T, S) as /attention gives it: 4 decimals."""
    return np.round(np.stack(att.cross).astype(np.float64), 4)


def test_pivot_max_loaded_limits_device_and_int8_flags_reach_the_server(run_dir, inputs, tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    import uvicorn
    from fastapi.testclient import TestClient

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: True)  # the test process's malloc left as it is
    keys = tmp_path / "keys"
    keys.write_text(key_line("k3y") + "\n")  # a key without limits of its own: the server's are its
    flags = ["--pivot", "yy", "--max-loaded", "1", "--req-limit", "2", "--char-limit", "40"]
    flags += ["--device", "cpu:0", "--int8", "--keys-file", str(keys)]
    main(["serve", f"xx-yy={run_dir}", f"yy-zz={run_dir}", *flags])
    int8, plain = Translator.from_checkpoint(run_dir, int8=True), Translator.from_checkpoint(run_dir)
    text = next(s for s in inputs.lines if len(s) <= 40)
    auth = {"Authorization": "Bearer k3y"}
    with TestClient(started["app"]) as c:
        assert loaded(c) == [(False, None, None)] * 2  # --max-loaded 1 of 2 models: none loaded before it is asked for
        # --pivot yy: xx reaches zz through yy.
        assert {x["code"]: x["targets"] for x in c.get("/languages").json()} == {"xx": ["yy", "zz"], "yy": ["zz"]}
        res = c.post("/translate", json={"text": [text], "source": "xx", "target": "zz"}, headers=auth)  # request 1
        assert res.status_code == 200, res.text
        assert res.json()["route"] == ["xx-yy", "yy-zz"]
        assert res.json()["translations"] == int8.translate(int8.translate([text]))
        assert loaded(c) == [(False, None, None), (True, "cpu:0", True)]  # the least recently used one unloaded
        # --char-limit 40: a request of 41 characters is refused, and not counted against --req-limit.
        res = c.post("/translate", json={"text": ["a" * 41]}, headers=auth)
        assert res.status_code == 413 and "41 characters" in res.json()["error"], res.text
        res = c.post("/attention", json={"text": text, "source": "xx", "target": "yy"}, headers=auth)  # request 2
        assert res.status_code == 200, res.text
        assert loaded(c) == [(True, "cpu:0", True), (False, None, None)]
        # --int8: the served model's linear layers are int8 ones; its attention weights are theirs, not float32's.
        cross = np.array(res.json()["cross_attention"])
        want, float32 = (rounded_cross(t.attention(text, beam_size=2)) for t in (int8, plain))
        np.testing.assert_array_equal(cross, want)
        assert not np.array_equal(cross, float32)
        # --req-limit 2: a third request within the minute is refused.
        res = c.post("/translate", json={"text": [text], "source": "xx", "target": "yy"}, headers=auth)
        assert res.status_code == 429 and int(res.headers["retry-after"]) > 0, res.text


# ---------------------------------------------------------------------------------------------------------
# The decoding flags of nanomt translate and nanomt evaluate.
# ---------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------
# /attention's beam_size.
# ---------------------------------------------------------------------------------------------------------


def test_attention_decodes_with_the_beam_asked_for_else_the_servers_default(run_dir, toy_corpus, tmp_path):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    # The checkpoint's own beam is 1, the server's default 2: a request without beam_size gets 2.
    translator = Translator.from_checkpoint(with_decode(run_dir, tmp_path / "beam1", beam_size=1))
    sentences = toy_corpus["test.src"].read_text(encoding="utf-8").splitlines()[:30]
    three_ways = (
        s for s in sentences if len({translator.attention(s, beam_size=b).translation for b in (1, 2, 3)}) == 3
    )
    text = next(three_ways, None)
    assert text is not None, "no sentence that beams 1, 2 and 3 translate three ways"
    with TestClient(create_app(translator, default_beam=2)) as c:
        for beam in (1, 3, None):
            res = c.post("/attention", json={"text": text} if beam is None else {"text": text, "beam_size": beam})
            assert res.status_code == 200, res.text
            body, att = res.json(), translator.attention(text, beam_size=beam or 2)
            assert (body["translation"], body["src_tokens"], body["tgt_tokens"]) == (
                att.translation,
                att.src_tokens,
                att.tgt_tokens,
            ), beam
            np.testing.assert_array_equal(np.array(body["cross_attention"]), rounded_cross(att))
