"""One model for several languages (Johnson et al., 2017): corpora that name their target language, each source after
that language's token; the config's rules, temperature sampling, the tokens kept whole, and a toy model of three
made-up languages that translates all six directions (its BLEU per direction printed)."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config

from nanomt.cli.demo import multilingual_corpora
from nanomt.core.checkpoint import checkpoint_weights
from nanomt.core.config import ConfigError, config_from_dict, to_dict
from nanomt.decoding.translate import Translator
from nanomt.training.evaluate import calibrate, evaluate
from nanomt.training.metrics import bleu
from nanomt.training.stream import corpus_weights
from nanomt.training.synthetic import LANGUAGES, vocabulary, write_multilingual_corpus
from nanomt.training.train import train

PAIRS = 1500  # of each direction


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # 60 test sentences a direction: 120 a target language, enough for a calibration of its own
    return write_multilingual_corpus(tmp_path_factory.mktemp("three"), pairs_per_direction=PAIRS, valid=40, test=60)


def multilingual_config(corpus, **train) -> dict:
    cfg = tiny_config(dict.fromkeys(("train.src", "train.tgt", "valid.src", "valid.tgt"), ""), **train)
    data = {split: to_dict(multilingual_corpora(corpus, split)) for split in ("train", "valid")}
    cfg["data"].update(data, shared_vocab=True, vocab_size=200)
    cfg["model"].update(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128)
    return cfg


def test_a_multilingual_config_names_every_corpus_language(corpus):
    cfg = multilingual_config(corpus)
    assert config_from_dict(cfg).data.target_languages == ("xb", "xc", "xa")  # xa-xb, xa-xc, xb-xa, ...
    broken = json.loads(json.dumps(cfg))
    del broken["data"]["train"][1]["tgt_lang"]
    with pytest.raises(ConfigError, match=r"train\[1\]: a multilingual model's corpora each name their tgt_lang"):
        config_from_dict(broken)
    single_valid = {**cfg, "data": {**cfg["data"], "valid": {"src": "v.xa", "tgt": "v.xb"}}}
    with pytest.raises(ConfigError, match=r"valid\[0\]: a multilingual model's validation sets are a list"):
        config_from_dict(single_valid)
    with pytest.raises(ConfigError, match="bidirectional_epochs with corpora that name a tgt_lang"):
        config_from_dict({**cfg, "train": {**cfg["train"], "bidirectional_epochs": 1}})
    with pytest.raises(ConfigError, match="tgt_lang '>>xb<<'"):
        config_from_dict({**cfg, "data": {**cfg["data"], "train": [{"src": "a", "tgt": "b", "tgt_lang": ">>xb<<"}]}})


def test_temperature_evens_out_corpora_of_different_sizes(corpus):
    cfg = config_from_dict(multilingual_config(corpus))
    sizes = [100, 900, 100, 900, 100, 900]
    assert corpus_weights(cfg.data, sizes) == [1.0] * 6  # by weight alone: each corpus an equal share
    for t, expected in ((1.0, sizes), (3.0, [n ** (1 / 3) for n in sizes])):
        data = config_from_dict({**multilingual_config(corpus), "data": {**multilingual_config(corpus)["data"],
                                                                         "temperature": t}}).data  # fmt: skip
        assert corpus_weights(data, sizes) == pytest.approx(expected)


@pytest.mark.slow
def test_one_model_translates_every_direction_it_was_trained_on(corpus, tmp_path):
    cfg = multilingual_config(corpus, max_steps=700, eval_every=350, save_every=350, lr=3e-3, warmup_steps=100,
                              max_tokens=1500, log_every=100)  # fmt: skip
    run = train(config_from_dict(cfg), tmp_path / "run")
    translator = Translator.from_checkpoint(run)
    assert sorted(translator.tokenizer.target_codes) == sorted(LANGUAGES)
    assert translator.tokenizer.encode_src([">>xc<< la zira."])[0][:1] == translator.tokenizer.language_token("xc")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "valid_bleu_by_language" in r]
    assert evaluated and set(evaluated[-1]["valid_bleu_by_language"]) == set(LANGUAGES)
    scores = {}
    for test in multilingual_corpora(corpus, "test"):
        direction = f"{test.src.rsplit('.', 1)[1]}-{test.tgt_lang}"
        srcs = open(test.src, encoding="utf-8").read().splitlines()
        refs = open(test.tgt, encoding="utf-8").read().splitlines()
        hyps = translator.translate(srcs, target_lang=test.tgt_lang, beam_size=1)
        scores[direction] = bleu(hyps, refs)
        # Each translation is in the language asked for: its words are that language's.
        words = [w.rstrip(".") for h in hyps for w in h.split()]
        known = set(vocabulary(LANGUAGES[test.tgt_lang]))
        assert sum(w in known for w in words) / len(words) > 0.95, direction
    print("test BLEU by direction (greedy): " + ", ".join(f"{d} {b:.1f}" for d, b in sorted(scores.items())))
    assert min(scores.values()) > 15, scores
    # Scored and calibrated by language: sources that start with their codes, as a multilingual test set is written.
    tagged, refs = tmp_path / "test.src", tmp_path / "test.ref"
    tests = multilingual_corpora(corpus, "test")
    tagged.write_text("".join(f">>{t.tgt_lang}<< {line}\n" for t in tests for line in open(t.src).read().splitlines()))
    refs.write_text("".join(open(t.tgt).read() for t in tests))
    report = evaluate(translator, tagged, refs, beam_size=1)
    assert set(report["bleu_by_language"]) == set(LANGUAGES)
    srcs, targets = tagged.read_text().splitlines(), refs.read_text().splitlines()
    fitted = calibrate(translator, srcs, targets, checkpoint_weights(run), decoding=translator.default_decoding)
    assert set(fitted.by_language) == set(LANGUAGES)
    assert sum(c.fit["sentences"] for c in fitted.by_language.values()) == len(srcs)
    confident = Translator.from_checkpoint(run).translate_confident(srcs[::40], beam_size=1)
    for src, c in zip(srcs[::40], confident):  # each sentence's confidence by its target language's own fit
        own = fitted.by_language[src[2:4]].predict([c.features])[0]
        assert c.confidence == pytest.approx(own) and own != pytest.approx(fitted.predict([c.features])[0])
