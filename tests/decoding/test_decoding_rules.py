"""Rules on the scores through the Translator, the CLI, the API and CTranslate2: forced prefixes, repetition guards
(against transformers' logits processors), glossaries; and the errors bad settings give."""

import json
import math
import subprocess
import sys

import pytest
import test_translate
import torch
from paths import REPO as ROOT
from test_translate import SOURCES, table_model, write_checkpoint

from nanomt.cli import main
from nanomt.core.decoding import Decoding
from nanomt.decoding.ensemble import Ensemble
from nanomt.decoding.glossary import GlossaryError, read_glossary, required_terms
from nanomt.decoding.rules import NoRepeatNgram, RepetitionPenalty, Step
from nanomt.decoding.steps import SearchSpace
from nanomt.decoding.translate import Translator, word_starts

vocab = test_translate.vocab  # the fixture: (tokenizer, its directory, four target word ids)
pytestmark = pytest.mark.usefixtures("one_thread")


def words_text(tokenizer, ids: list[int]) -> str:
    text = tokenizer.decode_tgt([ids])[0]
    assert tokenizer.encode_tgt([text])[0] == ids  # whole-word pieces: the text gives the ids back
    return text


# ---------------------------------------------------------------------------------------------------------
# Forced prefix.
# ---------------------------------------------------------------------------------------------------------


def prefix_model(tokenizer, words):
    """After BOS the model ends at once (EOS 0.9, w0 0.1); after w0 it writes w1, after w2 w3 (0.6), then ends."""
    rows = {2: {3: 0.9, words[0]: 0.1}, words[0]: {words[1]: 0.8, 3: 0.2}, words[1]: {3: 1.0}}
    rows[words[2]] = {words[3]: 0.6, 3: 0.4}
    rows[words[3]] = {3: 1.0}
    return table_model(tokenizer.tgt_vocab_size, rows, default={3: 1.0})


@pytest.mark.parametrize("beam", [1, 3])
def test_a_forced_prefix_starts_the_translation_and_the_model_goes_on_with_its_own_scores(vocab, tmp_path, beam):
    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(tmp_path / "ckpt", prefix_model(tokenizer, words), tokenizer_dir, beam_size=beam)
    translator = Translator.from_checkpoint(ckpt)
    assert translator.translate(SOURCES[:2]) == ["", ""]  # without a prefix: EOS at once
    prefixes = [words_text(tokenizer, [words[0]]), words_text(tokenizer, [words[2]])]
    hyps = translator.translate_hypotheses(SOURCES[:2], prefixes=prefixes, length_penalty_kind="none")
    assert [h[0].tokens for h in hyps] == [[words[0], words[1]], [words[2], words[3]]]
    if beam > 1:  # the prefix token scored by the model (0.1 after BOS), then its continuation and EOS
        assert hyps[0][0].log_prob == pytest.approx(math.log(0.1) + math.log(0.8) + math.log(1.0), abs=1e-4)
    second = tokenizer.decode_tgt([[words[2], words[3]]])[0]
    assert translator.translate(SOURCES[:2], prefixes=[None, prefixes[1]]) == ["", second]


def test_a_prefix_is_honoured_by_sampling_n_best_an_ensemble_and_int8(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    model = prefix_model(tokenizer, words)
    ckpt = write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, beam_size=3)
    prefix = [words_text(tokenizer, [words[2]])] * 2
    start = tokenizer.decode_tgt([[words[2]]])[0]
    translator = Translator.from_checkpoint(ckpt)
    sampled = translator.translate(SOURCES[:2], prefixes=prefix, sampling={"seed": 3})
    assert all(t.startswith(start) for t in sampled)
    for hyps in translator.translate_n_best(SOURCES[:2], n_best=2, prefixes=prefix):
        assert all(text.startswith(start) for text, _ in hyps)
    ensemble = Translator.from_checkpoints([ckpt, ckpt])
    assert isinstance(ensemble.model, Ensemble)
    assert ensemble.translate(SOURCES[:2], prefixes=prefix) == translator.translate(SOURCES[:2], prefixes=prefix)
    int8 = Translator.from_checkpoint(ckpt, int8=True)
    assert all(t.startswith(start) for t in int8.translate(SOURCES[:2], prefixes=prefix))


def test_a_prefix_longer_than_the_length_limit_is_refused(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(tmp_path / "ckpt", prefix_model(tokenizer, words), tokenizer_dir, max_len_a=0, max_len_b=2)
    translator = Translator.from_checkpoint(ckpt)
    long = words_text(tokenizer, [words[0], words[1], words[2]])
    with pytest.raises(ValueError, match="prefix of 3 tokens does not fit its length limit"):
        translator.translate(SOURCES[:1], prefixes=[long])


# ---------------------------------------------------------------------------------------------------------
# Repetition guards: transformers' logits processors on the same scores.
# ---------------------------------------------------------------------------------------------------------


class _AllIds:
    def positions(self, ids):
        return ids


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_bans_what_transformers_bans(n):
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(n)
    history = torch.randint(4, 9, (6, 7), generator=g)  # few ids: many repeats
    scores = torch.randn(6, 12, generator=g)
    ours = scores.clone()
    NoRepeatNgram(n).apply(ours, Step(7, history, _AllIds(), 2))
    input_ids = torch.cat([torch.full((6, 1), 2), history], dim=1)
    theirs = transformers.NoRepeatNGramLogitsProcessor(n)(input_ids, scores.clone())
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs)) and torch.isneginf(ours).any()
    assert torch.equal(ours[~torch.isneginf(ours)], theirs[~torch.isneginf(theirs)])


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_scores_as_transformers_scores(penalty):
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(0)
    history = torch.randint(4, 12, (5, 6), generator=g)
    scores = torch.randn(5, 12, generator=g)
    ours = scores.clone()
    RepetitionPenalty(penalty).apply(ours, Step(6, history, _AllIds(), 2))
    input_ids = torch.cat([torch.full((5, 1), 2), history], dim=1)
    theirs = transformers.RepetitionPenaltyLogitsProcessor(penalty)(input_ids, scores.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_guards_on_a_pruned_space_act_on_the_positions_of_the_ids():
    ids = torch.tensor([0, 3, 5, 6, 9])  # a pruned model's kept ids
    index = torch.full((12,), -1)
    index[ids] = torch.arange(5)
    space = SearchSpace(ids, [], 1, index)
    history = torch.tensor([[5, 9, 5], [7, 7, 7]])  # 7 is not scored: nothing to ban for it
    scores = torch.zeros(2, 5)
    NoRepeatNgram(2).apply(scores, Step(3, history, space, 0))
    assert torch.isneginf(scores).tolist() == [[False, False, False, False, True], [False] * 5]  # 5 -> 9 again


def test_a_looping_model_stops_looping_under_the_guards(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    loop = {2: {words[0]: 1.0}, words[0]: {words[0]: 0.7, words[1]: 0.2, 3: 0.1}, words[1]: {3: 1.0}}
    ckpt = write_checkpoint(tmp_path / "ckpt", table_model(tokenizer.tgt_vocab_size, loop), tokenizer_dir)
    translator = Translator.from_checkpoint(ckpt)
    looping = translator.translate_hypotheses(SOURCES[:1], beam_size=1)[0][0].tokens
    assert looping[:3] == [words[0]] * 3
    # The bigram (w0, w0) once: then w1 (0.2 beats EOS 0.1), then EOS.
    assert translator.translate_hypotheses(SOURCES[:1], beam_size=1, no_repeat_ngram_size=2)[0][0].tokens == [
        words[0], words[0], words[1]
    ]  # fmt: skip
    # Scores of w0 divided by 4 once it is written: log(0.7) / ... < log 0.2 on the logits greedy compares.
    assert translator.translate_hypotheses(SOURCES[:1], beam_size=1, repetition_penalty=100.0)[0][0].tokens[:2] == [
        words[0], words[1]
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Glossaries.
# ---------------------------------------------------------------------------------------------------------


def test_glossary_terms_are_found_case_insensitively_whole_words_longest_first():
    glossary = (("Auftrag", "purchase order"), ("Auftrag erteilen", "place an order"), ("Tag", "day"))
    assert required_terms(glossary, "Wir wollen den auftrag erteilen.") == ["place an order"]
    assert required_terms(glossary, "Ein Auftrag am Tag, Auftragsbuch.") == ["purchase order", "day"]
    assert required_terms(glossary, "Auftragsbuch Tage") == []


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Auftrag\tpurchase order\nohne Tab\n", "line 2: want 'source term<TAB>target term'"),
        ("Auftrag\t \n", "entry 1: a term is empty"),
        ("a\tb\tc\n", "line 1: want 'source term<TAB>target term', found 3"),
    ],
)
def test_a_bad_glossary_line_is_a_one_line_error_naming_file_and_line(tmp_path, text, words):
    path = tmp_path / "glossary.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(GlossaryError, match=words):
        read_glossary(path)


def test_a_glossary_that_is_no_file_is_a_one_line_error_naming_it(tmp_path):
    with pytest.raises(GlossaryError, match=f"{tmp_path / 'none.tsv'}: glossary file not found"):
        read_glossary(tmp_path / "none.tsv")
    with pytest.raises(GlossaryError, match=f"{tmp_path}: a directory, not a glossary file"):
        read_glossary(tmp_path)


def test_a_glossary_puts_its_terms_into_the_translation(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(tmp_path / "ckpt", prefix_model(tokenizer, words), tokenizer_dir, beam_size=4)
    translator = Translator.from_checkpoint(ckpt)
    term = words_text(tokenizer, [words[2], words[3]])
    source_word = SOURCES[0].split()[1]
    out = translator.translate_hypotheses(SOURCES[:2], glossary=((source_word, term),))
    got = out[0][0].tokens
    assert any(got[i : i + 2] == [words[2], words[3]] for i in range(len(got))) and not out[0][0].terms_missed
    assert source_word not in SOURCES[1] and out[1][0].tokens == []  # no term in it: as without the glossary
    with pytest.raises(ValueError, match="cannot write it"):
        translator.translate(SOURCES[:1], glossary=((source_word, "\u4e2d\u6587"),))


def test_a_glossary_term_is_placed_as_a_whole_word_not_as_the_start_of_a_longer_one(vocab, tmp_path):
    tokenizer, tokenizer_dir, words = vocab
    pieces = tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size)))
    going_on = next(i for i, p in enumerate(pieces) if p.isalpha() and p.islower())  # a piece inside a word: "ing"
    starts = word_starts(tokenizer, tokenizer.tgt_vocab_size, 3)
    assert not starts[going_on] and starts[3] and all(starts[w] for w in words)
    assert all(
        bool(starts[i]) == (p.startswith("▁") or i == 3) for i, p in enumerate(pieces) if p.lstrip("\u2581").isalnum()
    )
    # After BOS the term's piece (0.6) or another word; after the term, likeliest a piece that goes on with its word.
    rows = {2: {words[2]: 0.6, words[0]: 0.4}, words[2]: {going_on: 0.9, 3: 0.1}, going_on: {3: 1.0}}
    rows[words[0]] = {words[2]: 0.5, 3: 0.5}
    ckpt = write_checkpoint(tmp_path / "ckpt", table_model(tokenizer.tgt_vocab_size, rows), tokenizer_dir, beam_size=4)
    translator = Translator.from_checkpoint(ckpt)
    assert translator.translate_hypotheses(SOURCES[:1])[0][0].tokens == [words[2], going_on]
    glossary = ((SOURCES[0].split()[1], words_text(tokenizer, [words[2]])),)
    (best,) = translator.translate_hypotheses(SOURCES[:1], glossary=glossary, length_penalty_kind="none")[0]
    assert best.tokens == [words[2]] and not best.terms_missed


def test_bad_decoding_settings_are_errors_naming_them():
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        Decoding(repetition_penalty=0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        Decoding(no_repeat_ngram_size=-1)
    with pytest.raises(ValueError, match="a glossary needs beam search"):
        Decoding().replace(sampling={"temperature": 0.5}, glossary=(("a", "b"),))
    with pytest.raises(ValueError, match="unknown sampling setting"):
        Decoding().replace(sampling={"temp": 0.5})
    assert Decoding().replace(sampling={"seed": 1}).decode_alone and not Decoding().decode_alone


# ---------------------------------------------------------------------------------------------------------
# The CLI and the API.
# ---------------------------------------------------------------------------------------------------------


def test_cli_prefix_file_glossary_and_guards(vocab, tmp_path, capsys):
    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(tmp_path / "ckpt", prefix_model(tokenizer, words), tokenizer_dir, beam_size=3)
    src, prefixes, glossary = tmp_path / "in.txt", tmp_path / "prefix.txt", tmp_path / "g.tsv"
    src.write_text("\n".join(SOURCES[:2]) + "\n")
    prefixes.write_text(words_text(tokenizer, [words[0]]) + "\n\n")
    main(["translate", ckpt, "--input", str(src), "--prefix-file", str(prefixes)])
    expected = Translator.from_checkpoint(ckpt).translate(
        SOURCES[:2], prefixes=[words_text(tokenizer, [words[0]]), None]
    )
    assert capsys.readouterr().out.splitlines() == expected and expected[0]
    source_word = SOURCES[1].split()[0]
    glossary.write_text(f"{source_word}\t{words_text(tokenizer, [words[2], words[3]])}\n")
    main(["translate", ckpt, "--input", str(src), "--glossary", str(glossary), "--no-repeat-ngram-size", "3"])
    expected = Translator.from_checkpoint(ckpt).translate(
        SOURCES[:2], glossary=read_glossary(glossary), no_repeat_ngram_size=3
    )
    assert capsys.readouterr().out.splitlines() == expected and expected[1]
    prefixes.write_text("one line only\n")
    with pytest.raises(SystemExit):
        main(["translate", ckpt, "--input", str(src), "--prefix-file", str(prefixes)])
    assert "--prefix-file has 1 lines, the input 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["translate", ckpt, "--input", str(src), "--repetition-penalty", "0"])
    assert capsys.readouterr().err.strip() == "nanomt: error: repetition_penalty must be > 0, got 0.0"


def test_the_api_takes_prefixes_glossaries_and_guards(vocab, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    tokenizer, tokenizer_dir, words = vocab
    ckpt = write_checkpoint(
        tmp_path / "ckpt", prefix_model(tokenizer, words), tokenizer_dir, beam_size=3, max_len_a=0, max_len_b=4
    )
    translator = Translator.from_checkpoint(ckpt)
    prefix = words_text(tokenizer, [words[2]])
    source_word = SOURCES[0].split()[1]
    term = words_text(tokenizer, [words[0], words[1]])
    with TestClient(create_app(translator)) as c:
        r = c.post("/translate", json={"text": SOURCES[:2], "prefix": [prefix, None]})
        assert r.status_code == 200 and r.json()["translations"] == translator.translate(
            SOURCES[:2], prefixes=[prefix, None]
        )
        r = c.post(
            "/translate", json={"text": SOURCES[:1], "glossary": [[source_word, term]], "no_repeat_ngram_size": 2}
        )
        assert (
            r.json()["translations"]
            == translator.translate(SOURCES[:1], glossary=((source_word, term),), no_repeat_ngram_size=2)
            and "terms_missed" not in r.json()
        )
        r = c.post("/translate", json={"text": SOURCES[:1], "repetition_penalty": 0})
        assert r.status_code == 422 and "repetition_penalty" in json.dumps(r.json())
        long = words_text(tokenizer, [words[0], words[1], words[2], words[3]])  # 4 tokens: no room for EOS
        r = c.post("/translate", json={"text": SOURCES[:1], "prefix": [long]})
        assert r.status_code == 400 and "does not fit its length limit" in r.json()["error"]
        r = c.post("/translate", json={"text": SOURCES[:2], "prefix": [prefix]})
        assert r.status_code == 422 and "one entry per sentence" in json.dumps(r.json())


def test_attention_takes_the_decoding_settings_translate_takes(vocab, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from nanomt.serve import create_app

    tokenizer, tokenizer_dir, words = vocab
    loop = {2: {words[0]: 1.0}, words[0]: {words[0]: 0.7, words[1]: 0.2, 3: 0.1}, words[1]: {3: 1.0}}
    model = table_model(tokenizer.tgt_vocab_size, loop)
    translator = Translator.from_checkpoint(write_checkpoint(tmp_path / "ckpt", model, tokenizer_dir, beam_size=1))
    guarded = translator.translate(SOURCES[:1], no_repeat_ngram_size=2)[0]
    assert guarded != translator.translate(SOURCES[:1])[0]
    drawn = translator.translate(SOURCES[:1], sampling={"temperature": 0.5, "seed": 1})[0]
    with TestClient(create_app(translator)) as c:
        r = c.post("/attention", json={"text": SOURCES[0], "no_repeat_ngram_size": 2})
        assert r.status_code == 200 and r.json()["translation"] == guarded
        assert (
            translator.attention(SOURCES[0], no_repeat_ngram_size=2, decoding=translator.default_decoding).translation
            == guarded
        )
        r = c.post("/attention", json={"text": SOURCES[0], "temperature": 0.5, "seed": 1})
        assert r.status_code == 200 and r.json()["translation"] == drawn
        r = c.post("/attention", json={"text": SOURCES[0], "beam_size": 2, "temperature": 0.5})
        assert r.status_code == 422 and "beam_size" in json.dumps(r.json())


# ---------------------------------------------------------------------------------------------------------
# CTranslate2.
# ---------------------------------------------------------------------------------------------------------


def test_interop_ct2_loads_without_torch():
    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('ct2', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "d = m.Decoding.from_config({'beam_size': 3, 'no_repeat_ngram_size': 2}); "
        "assert d.beam_size == 3 and d.max_len(10, 64) == 22, d; "
        "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')"
    )
    pytest.importorskip("ctranslate2")
    path = ROOT / "nanomt" / "interop" / "ct2.py"
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
