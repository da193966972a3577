"""Every decoding setting reaches the search from every place a user sets it: the checkpoint's decode section, the
flags of `nanomt translate` and `nanomt evaluate`, nanomt's HTTP API, LibreTranslate's API and /attention.

Each case sets one setting to a value other than its default on a table model (test_translate.py's, whose every
hypothesis and score is known) where that value changes the translation: the output must be the one the table
predicts, equal the Translator's with the same setting passed as a keyword argument where it takes one, and differ
from the output of the same call without the setting (which must be the table's prediction for that).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from test_translate import SOURCES, chain, chain_hypotheses, ranked, table_model, write_checkpoint

from nanomt.cli import main
from nanomt.core.config import DataConfig, DecodeConfig
from nanomt.core.tokenizer import BOS_ID, EOS_ID, train_tokenizer
from nanomt.decoding.translate import Translator

DEFAULTS = DecodeConfig()

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Vocab:
    """The toy pair's tokenizer, four of its target words and the source lengths of SOURCES."""

    tokenizer: object
    directory: object
    w: list[int]
    lens: list[int]

    def lines(self, per_source: list[list[int]]) -> list[str]:
        return self.tokenizer.decode_tgt(per_source)

    def each(self, tokens: list[int]) -> list[str]:
        return self.lines([tokens] * len(SOURCES))

    def budgets(self, a: float, b: int) -> list[str]:
        """w0 repeated up to each source's length budget int(a * len + b)."""
        return self.lines([[self.w[0]] * int(a * n + b) for n in self.lens])

    def rows(self, hyps: list[tuple[list[int], float]]) -> list[str]:
        """`--n-best` lines for these (tokens, score) hypotheses of every source."""
        return [f"{i}\t{s:.4f}\t{self.lines([t])[0]}" for i in range(len(SOURCES)) for t, s in hyps]


@pytest.fixture(scope="module")
def vocab(toy_corpus, tmp_path_factory) -> Vocab:
    out = tmp_path_factory.mktemp("tokenizer")
    lines = [toy_corpus[f"train.{side}"].read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")]
    tokenizer = train_tokenizer(*lines, out, DataConfig(vocab_size=120, shared_vocab=False))
    words = [i for i in range(tokenizer.tgt_vocab_size) if len(p := tokenizer.tgt_pieces([i])[0]) >= 4 and p[0] == "▁"]
    lens = [len(ids) for ids in tokenizer.encode_src(SOURCES)]
    assert lens == sorted(set(lens))  # distinct and ascending: with one sentence a batch, batch k is SOURCES[k]
    return Vocab(tokenizer, out, words[:4], lens)


# ---------------------------------------------------------------------------------------------------------
# Tables (p(next | previous token)) and what they translate to.
# ---------------------------------------------------------------------------------------------------------


def greedy_trap(w):
    # Greedy: w0 (0.5) then w2 (0.4): 0.2. Any beam of 2 or more finds w1 EOS: 0.36.
    return {
        BOS_ID: {w[0]: 0.5, w[1]: 0.4, EOS_ID: 0.1},
        w[0]: {w[2]: 0.4, w[3]: 0.3, EOS_ID: 0.3},
        w[1]: {EOS_ID: 0.9, w[2]: 0.1},
        w[2]: {EOS_ID: 1.0},
        w[3]: {EOS_ID: 1.0},
    }


CHAIN4 = [0.35, 0.5, 0.5]  # "", w0, w0 w1, w0 w1 w2: a different best under gnmt 1.0, gnmt 3.0 and none


def late_best(w):
    # Beam 2, gnmt 1.0: step 1 finishes "" (0.4), step 2 finishes w1 (0.225) while w0 w2 (0.343) lives on. Early
    # stopping ends there, with "" best (score -0.92); going on finds w0 w2 w3 (0.3396, score -0.72).
    return {
        BOS_ID: {EOS_ID: 0.4, w[0]: 0.35, w[1]: 0.25},
        w[0]: {w[2]: 0.98, EOS_ID: 0.02},
        w[1]: {EOS_ID: 0.9, w[2]: 0.1},
        w[2]: {w[3]: 0.99, EOS_ID: 0.01},
        w[3]: {EOS_ID: 1.0},
    }


def tables(w) -> dict[str, tuple[dict, dict | None]]:
    """(rows, default row) of each table."""
    return {
        "greedy_trap": (greedy_trap(w), None),
        "chain4": (chain(w[:3], CHAIN4), None),
        "late_best": (late_best(w), None),
        "ends_at_once": (chain(w[:3], [0.9, 0.9, 0.9]), None),  # EOS likeliest: as short as min_len allows
        "never_ends": ({}, {w[0]: 1.0}),  # w0 to the length budget (EOS made impossible below)
        "sampled": ({}, {w[0]: 0.4, w[1]: 0.3, w[2]: 0.2, EOS_ID: 0.1}),  # greedy: w0 to the budget
    }


def best(v: Vocab, kind: str, alpha: float) -> list[str]:
    return v.each(ranked(chain_hypotheses(v.w[:3], CHAIN4), kind, alpha)[0][0])


def greedy_budgets(v: Vocab) -> list[str]:
    return v.budgets(DEFAULTS.max_len_a, DEFAULTS.max_len_b)


# ---------------------------------------------------------------------------------------------------------
# The cases.
# ---------------------------------------------------------------------------------------------------------

Predict = Callable[[Vocab, Translator], list[str]]


@dataclass(frozen=True)
class Case:
    """One setting given one way.

    `given` is the setting as that way takes it (decode keys, command-line flags, JSON fields, create_app
    arguments), added to `plain`, what the same call holds without it. `decode` is the checkpoint's decode
    section and `call` the Translator's arguments of the config runs. `direct` is the Translator's keyword
    arguments that ask for the same setting (None where only the config can set it).
    """

    setting: str
    via: str
    table: str
    given: dict | list
    want: Predict
    want_plain: Predict
    plain: dict | list = field(default_factory=dict)
    decode: dict = field(default_factory=dict)
    call: dict = field(default_factory=dict)
    direct: dict | None = None

    def __str__(self) -> str:
        beam = f"-beam{self.decode['beam_size']}" if "beam_size" in self.decode else ""
        return f"{self.setting}-{self.via}{beam}" + ("-sampling" if "sampling" in self.call else "")


def _greedy(v, t):
    return v.each([v.w[0], v.w[2]])


def _beam(v, t):
    return v.each([v.w[1]])


BEAM = dict(table="greedy_trap", want=_greedy, want_plain=_beam)
CHAIN = dict(table="chain4", decode={"beam_size": 4}, want_plain=lambda v, t: best(v, "gnmt", 1.0))
SAMPLED_GREEDY = dict(table="sampled", want=lambda v, t: greedy_budgets(v))


def sampled(seed: int, **settings) -> Predict:
    """The Translator's samples of SOURCES in one batch."""
    return lambda v, t: t.translate(SOURCES, sampling={**settings, "seed": seed})


def sampled_one_a_batch(seed: int) -> Predict:
    """The Translator's samples with one sentence a batch: batch k (SOURCES[k]) seeded seed + k."""
    return lambda v, t: [t.translate([s], sampling={"seed": seed + k})[0] for k, s in enumerate(SOURCES)]


MODES = [({"beam_size": 1}, {}), ({"beam_size": 3}, {}), ({"beam_size": 3}, {"sampling": {"top_k": 1, "seed": 0}})]

# fmt: off
CASES = [
    Case("beam_size", "config", given={"beam_size": 1}, direct={"beam_size": 1}, **BEAM),
    Case("beam_size", "translate", given=["--beam", "1"], direct={"beam_size": 1}, **BEAM),
    Case("beam_size", "evaluate", given=["--beam", "1"], direct={"beam_size": 1}, **BEAM),
    Case("beam_size", "http", given={"beam_size": 1}, direct={"beam_size": 1}, **BEAM),
    Case("beam_size", "libretranslate", given={"default_beam": 1}, direct={"beam_size": 1}, **BEAM),
    Case("beam_size", "attention", given={"beam_size": 1}, direct={"beam_size": 1}, **BEAM),
    Case("n_best", "translate", given=["--n-best", "2"], direct={"n_best": 2}, **CHAIN,
         want=lambda v, t: v.rows(ranked(chain_hypotheses(v.w[:3], CHAIN4), "gnmt", 1.0)[:2])),
    Case("length_penalty", "config", given={"length_penalty": 3.0}, direct={"length_penalty": 3.0}, **CHAIN,
         want=lambda v, t: best(v, "gnmt", 3.0)),
    Case("length_penalty", "translate", given=["--length-penalty", "3"], direct={"length_penalty": 3.0}, **CHAIN,
         want=lambda v, t: best(v, "gnmt", 3.0)),
    Case("length_penalty_kind", "config", given={"length_penalty_kind": "none"}, **CHAIN,
         want=lambda v, t: best(v, "none", 1.0)),
    Case("early_stopping", "config", "late_best", given={"early_stopping": False}, decode={"beam_size": 2},
         want=lambda v, t: v.each([v.w[0], v.w[2], v.w[3]]), want_plain=lambda v, t: v.each([])),
    *[
        Case("min_len", "config", "ends_at_once", given={"min_len": 2}, decode=decode, call=call,
             want=lambda v, t: v.each(v.w[:2]), want_plain=lambda v, t: v.each([]))
        for decode, call in MODES
    ],
    *[
        Case("max_len_a", "config", "never_ends", given={"max_len_a": 0.5}, decode=decode, call=call,
             want=lambda v, t: v.budgets(0.5, DEFAULTS.max_len_b), want_plain=lambda v, t: greedy_budgets(v))
        for decode, call in MODES
    ],
    *[
        Case("max_len_b", "config", "never_ends", given={"max_len_b": 3}, decode=decode, call=call,
             want=lambda v, t: v.budgets(DEFAULTS.max_len_a, 3), want_plain=lambda v, t: greedy_budgets(v))
        for decode, call in MODES
    ],
    Case("max_tokens", "config", "sampled", given={"max_tokens": 1}, call={"sampling": {"seed": 5}},
         direct={"max_tokens": 1, "sampling": {"seed": 5}}, want=sampled_one_a_batch(5), want_plain=sampled(5)),
    Case("max_tokens", "translate", "sampled", given=["--max-tokens", "1"], plain=["--sampling", "--seed", "5"],
         direct={"max_tokens": 1, "sampling": {"seed": 5}}, want=sampled_one_a_batch(5), want_plain=sampled(5)),
    Case("temperature", "translate", given=["--temperature", "0.01"], plain=["--sampling", "--seed", "0"],
         direct={"sampling": {"temperature": 0.01, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    Case("temperature", "http", given={"temperature": 0.01}, plain={"temperature": 1.0, "seed": 0},
         direct={"sampling": {"temperature": 0.01, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    Case("top_k", "translate", given=["--sampling-topk", "1"], plain=["--sampling", "--seed", "0"],
         direct={"sampling": {"top_k": 1, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    Case("top_k", "http", given={"top_k": 1}, plain={"top_k": 0, "seed": 0},
         direct={"sampling": {"top_k": 1, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    # top_p 0.3: w0 alone holds 0.4 >= 0.3, so it is the only token left.
    Case("top_p", "translate", given=["--sampling-topp", "0.3"], plain=["--sampling", "--seed", "0"],
         direct={"sampling": {"top_p": 0.3, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    Case("top_p", "http", given={"top_p": 0.3}, plain={"top_p": 1.0, "seed": 0},
         direct={"sampling": {"top_p": 0.3, "seed": 0}}, want_plain=sampled(0), **SAMPLED_GREEDY),
    # A seed has no default that repeats: "without it" is another seed here.
    Case("seed", "translate", "sampled", given=["--seed", "7"], plain=["--sampling", "--seed", "8"],
         direct={"sampling": {"seed": 7}}, want=sampled(7), want_plain=sampled(8)),
    Case("seed", "http", "sampled", given={"seed": 7}, plain={"temperature": 1.0, "seed": 8},
         direct={"sampling": {"seed": 7}}, want=sampled(7), want_plain=sampled(8)),
]
# fmt: on


# ---------------------------------------------------------------------------------------------------------
# The ways a setting is given.
# ---------------------------------------------------------------------------------------------------------


def checkpoint(v: Vocab, case: Case, path, decode: dict) -> str:
    """A checkpoint of the case's table with this decode section."""
    rows, default = tables(v.w)[case.table]
    model = table_model(v.tokenizer.tgt_vocab_size, rows, default)
    if case.table == "never_ends":
        with torch.no_grad():
            model.output.weight[EOS_ID] = -1000.0  # below every other token: no hypothesis ends before its budget
    return write_checkpoint(path, model, v.directory, **decode)


def cli_lines(args: list, tmp_path) -> list[str]:
    """`nanomt translate|evaluate` on SOURCES, in this process: the lines it writes."""
    src, out = tmp_path / "src.txt", tmp_path / "out.txt"
    src.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    command, ckpt, *flags = args
    if command == "translate":
        main(["translate", ckpt, "-i", str(src), "-o", str(out), *flags])
    else:  # the sources serve as references too: the score does not matter here
        main(["evaluate", ckpt, "--src", str(src), "--ref", str(src), "--save-hyp", str(out), "--json", *flags])
    return out.read_text(encoding="utf-8").splitlines()


def http_lines(via: str, ckpt: str, fields: dict) -> list[str]:
    """The translations of SOURCES through one of the server's APIs (fields: JSON fields or create_app's)."""
    pytest.importorskip("fastapi", reason="nanomt serve needs FastAPI: pip install 'nanomt[serve]'")
    pytest.importorskip("httpx", reason="the server tests need httpx")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    translator = Translator.from_checkpoint(ckpt)
    app = create_app(translator, **(fields if via == "libretranslate" else {}))
    with TestClient(app) as c:
        if via == "http":
            res = c.post("/translate", json={"text": SOURCES, **fields})
            assert res.status_code == 200, res.text
            return res.json()["translations"]
        if via == "libretranslate":
            res = c.post("/translate", json={"q": SOURCES, "source": "src", "target": "tgt"})
            assert res.status_code == 200, res.text
            return res.json()["translatedText"]
        out = []
        for s in SOURCES:
            res = c.post("/attention", json={"text": s, **fields})
            assert res.status_code == 200, res.text
            out.append(res.json()["translation"])
        return out


def run(v: Vocab, case: Case, tmp_path, with_setting: bool) -> list[str]:
    """The output lines of the case's way, with the setting or without it."""
    name = "set" if with_setting else "plain"
    if case.via == "config":
        decode = {**case.decode, **(case.given if with_setting else {})}
        ckpt = checkpoint(v, case, tmp_path / name, decode)
        return Translator.from_checkpoint(ckpt).translate(SOURCES, **case.call)
    ckpt = checkpoint(v, case, tmp_path / "ckpt", case.decode)
    given = case.given if with_setting else type(case.given)()
    if case.via in ("translate", "evaluate"):
        (tmp_path / name).mkdir()
        return cli_lines([case.via, ckpt, *case.plain, *given], tmp_path / name)
    return http_lines(case.via, ckpt, {**case.plain, **given})


def direct_lines(translator: Translator, direct: dict) -> list[str]:
    """The Translator given the setting as keyword arguments, written as the way under test writes it."""
    if "n_best" in direct:
        hyps = translator.translate_n_best(SOURCES, **direct)
        return [f"{i}\t{score:.4f}\t{text}" for i, hs in enumerate(hyps) for text, score in hs]
    return translator.translate(SOURCES, **direct)


def same(got: list[str], want: list[str]) -> bool:
    """Equal lines; the score of an n-best line to 1e-4 (the table's exact score vs float32)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g, w = g.split("\t"), w.split("\t")
        if len(g) == 3 == len(w):
            if g[0] != w[0] or g[2] != w[2] or not math.isclose(float(g[1]), float(w[1]), abs_tol=1e-4):
                return False
        elif g != w:
            return False
    return True


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_setting_changes_the_output_as_predicted(vocab, tmp_path, case):
    base = Translator.from_checkpoint(checkpoint(vocab, case, tmp_path / "base", case.decode))
    want, want_plain = case.want(vocab, base), case.want_plain(vocab, base)
    assert want != want_plain  # the table tells the setting's output from the default's
    got, plain = run(vocab, case, tmp_path, True), run(vocab, case, tmp_path, False)
    assert same(got, want), (got, want)
    assert same(plain, want_plain), (plain, want_plain)
    if case.direct is not None:
        assert got == direct_lines(base, case.direct)
