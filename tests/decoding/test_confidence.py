"""Confidence: the read-back features against the search's own scores and the unpruned model, the calibration's fit
on hand-built data, `nanomt calibrate` / `train` / `translate --confidence` / `evaluate --confidence`, both APIs."""

import dataclasses
import hashlib
import json
import logging
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import KEPT, decoding, random_src, random_transformer, run_nanomt
from decode_golden import restricted_transformer
from paths import REPO

from nanomt.core.checkpoint import file_sha256
from nanomt.core.model import prune_output
from nanomt.decoding import calibration as calib
from nanomt.decoding.quality import FEATURES, TokenScores, read_back, word_probabilities
from nanomt.decoding.search import search
from nanomt.decoding.translate import Confident, Translator
from nanomt.documents.translation import text_confidence


@pytest.fixture(scope="module")
def run_dir(calibrated_run):
    return calibrated_run


@pytest.fixture(scope="module")
def uncalibrated(run_dir, tmp_path_factory):
    """The same run without its calibration."""
    copy = tmp_path_factory.mktemp("uncalibrated") / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("checkpoints"))
    (copy / calib.CALIBRATION).unlink()
    return copy


@pytest.fixture(scope="module")
def sentences(toy_corpus):
    return toy_corpus["test.src"].read_text().splitlines()[:12]


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the read-back pass ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam_size", [1, 2, 3])
def test_the_token_scores_a_search_keeps_are_the_models_read_back(beam_size, one_thread):
    """Each token's log-prob and entropy as greedy or beam search keeps them (Decoding.token_scores, incremental,
    cached) equal those of one teacher-forced pass over the translation (uncached); their sum is the hypothesis'
    log_prob; a hypothesis cut at its budget has no EOS score; keeping them changes no output."""
    model = random_transformer(3, vocab=40).eval()
    src = random_src([7, 4, 9, 2, 6], seed=1, vocab=40)
    plain = search(model, src, decoding(12, beam_size=beam_size, length_penalty_kind="none"))
    hyps = search(model, src, decoding(12, beam_size=beam_size, length_penalty_kind="none", token_scores=True))
    assert [h[0].tokens for h in hyps] == [h[0].tokens for h in plain]
    assert not plain[0][0].token_log_probs
    rows = [[t for t in row.tolist() if t != model.cfg.pad_id] for row in src]
    read = read_back(model, rows, [h[0].tokens for h in hyps], unk_id=1)
    cut = 0
    for h, r in zip(hyps, read):
        ended = len(h[0].tokens) < 12
        cut += not ended
        n = len(h[0].tokens) + ended
        assert len(h[0].token_log_probs) == len(h[0].entropies) == n
        np.testing.assert_allclose(h[0].token_log_probs, r.log_probs[:n], atol=1e-4)
        np.testing.assert_allclose(h[0].entropies, r.entropies[:n], atol=1e-4)
        assert sum(h[0].token_log_probs) == pytest.approx(h[0].log_prob, abs=1e-4)
        if beam_size > 1:
            assert h[0].log_prob == pytest.approx(plain[hyps.index(h)][0].log_prob, abs=1e-5)
    assert cut  # the budget of 12 cut some random model's output: that case is covered


def test_read_back_of_a_pruned_model_equals_the_whole_vocabularys(one_thread):
    """A restricted model's decoding copy scores its kept ids only: the log-probs and entropies read back through
    it equal the whole model's, whose other ids are -inf, and a forward pass's by hand."""
    model = restricted_transformer(5)  # scores conftest.KEPT and PAD only
    pruned = prune_output(model)
    assert pruned.pruned and not model.pruned
    kept = [i for i in KEPT.tolist() if i > 3]
    src = [[5, 6, 7, 8, 3], [12, 13, 3]]
    tgt = [kept[:3], kept[3:8]]
    a, b = read_back(model, src, tgt, 1), read_back(pruned, src, tgt, 1)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.log_probs, y.log_probs, atol=1e-5)
        np.testing.assert_allclose(x.entropies, y.entropies, atol=1e-5)
    with torch.inference_mode():
        logits = model(torch.tensor([src[0]]), torch.tensor([[model.cfg.bos_id, *tgt[0]]]))
    lp = logits[0].float().log_softmax(-1)
    expected = [float(lp[i, t]) for i, t in enumerate([*tgt[0], model.cfg.eos_id])]
    np.testing.assert_allclose(a[0].log_probs, expected, atol=1e-5)
    p = lp.exp()
    np.testing.assert_allclose(a[0].entropies, -(p * lp.nan_to_num(neginf=0)).sum(-1).numpy(), atol=1e-5)


def test_features_of_hand_built_token_scores():
    r = TokenScores(np.log([0.5, 0.25, 1.0]), np.array([1.0, 2.0, 3.0]), src_len=4, unknown=1)
    f = r.features()
    assert list(f) == list(FEATURES)
    assert f["mean_log_prob"] == pytest.approx(np.log([0.5, 0.25, 1.0]).mean())
    assert f["min_log_prob"] == pytest.approx(math.log(0.25))
    assert f["mean_entropy"] == pytest.approx(2.0)
    assert f["length_ratio"] == pytest.approx(math.log(3 / 5))
    assert f["unknown_source"] == pytest.approx(0.25)
    joined = TokenScores.join([r, r])
    assert len(joined.log_probs) == 6 and joined.unknown == 2 and joined.src_len == 8


def test_a_words_probability_is_the_product_of_its_pieces():
    pieces = ["▁The", "▁dog", "s", ".", "▁ran"]
    lp = np.log([0.9, 0.5, 0.5, 0.8, 0.3])
    words = word_probabilities(pieces, lp)
    assert [w for w, _ in words] == [[0], [1, 2, 3], [4]]
    assert [p for _, p in words] == pytest.approx([0.9, 0.2, 0.3])


# --- the calibration -------------------------------------------------------------------------------------------


def rows_and_targets(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = [{f: float(rng.normal()) for f in FEATURES} for _ in range(n)]
    z = np.array([1.5 * r["mean_log_prob"] - 0.8 * r["mean_entropy"] + 0.3 for r in rows])
    return rows, 1 / (1 + np.exp(-z))


def test_logistic_calibration_recovers_a_logistic_truth_and_beats_a_line_on_one_feature():
    rows, y = rows_and_targets(400)
    fitted = calib.fit(rows, y)
    test_rows, test_y = rows_and_targets(300, seed=1)
    predicted = fitted.predict(test_rows)
    assert np.abs(predicted - test_y).max() < 0.02
    line = calib.fit(rows, y, kind="line", features=("mean_log_prob",))
    base = calib.agreement(line.predict(test_rows), test_y)
    ours = calib.agreement(predicted, test_y)
    assert ours["pearson"] > base["pearson"] + 0.1 and ours["mae"] < base["mae"] / 2
    assert fitted.fit["sentences"] == 400 and fitted.fit["pearson"] > 0.99


def test_a_line_fits_a_line_exactly_and_clips_to_zero_and_one():
    rows = [{**dict.fromkeys(FEATURES, 0.0), "mean_log_prob": x} for x in np.linspace(-2, 0, 200)]
    y = [0.5 + 0.2 * r["mean_log_prob"] for r in rows]
    line = calib.fit(rows, y, kind="line", features=("mean_log_prob",))
    assert line.predict(rows) == pytest.approx(y, abs=1e-4)
    far = [{"mean_log_prob": -10.0}, {"mean_log_prob": 10.0}]
    assert list(line.predict(far)) == [0.0, 1.0]


def test_spearman_ranks_ties_by_their_mean_rank():
    got = calib.agreement([1, 2, 2, 3], [1, 2, 3, 4])
    # scipy.stats.spearmanr([1, 2, 2, 3], [1, 2, 3, 4]) = 0.9486832980505138
    assert got["spearman"] == pytest.approx(0.9487, abs=1e-4)
    assert got["pearson"] == pytest.approx(float(np.corrcoef([1, 2, 2, 3], [1, 2, 3, 4])[0, 1]), abs=1e-4)


def test_a_model_whose_every_translation_scores_zero_still_fits():
    rows, _ = rows_and_targets(150)
    fitted = calib.fit(rows, np.zeros(150))
    assert np.all(np.isfinite(fitted.predict(rows))) and fitted.predict(rows).max() < 0.01


def test_too_few_sentences_are_refused():
    rows, y = rows_and_targets(calib.MIN_SENTENCES - 1)
    with pytest.raises(calib.CalibrationError, match=f"99 sentences.*at least {calib.MIN_SENTENCES}"):
        calib.fit(rows, y)


def test_a_calibration_for_other_weights_is_not_used(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    rows, y = rows_and_targets(200)
    fitted = calib.fit(rows, y)
    fitted.__class__(**{**fitted.__dict__, "weights_sha256": file_sha256(weights)}).save(tmp_path)
    loaded = calib.load(tmp_path, weights)
    assert loaded is not None and loaded.predict(rows) == pytest.approx(fitted.predict(rows))
    weights.write_bytes(b"other weights")
    assert calib.load(tmp_path, weights) is None
    (tmp_path / calib.CALIBRATION).write_text("{not json")
    with pytest.raises(calib.CalibrationError, match="cannot read the calibration"):
        calib.load(tmp_path, weights)


def test_a_multilingual_calibration_predicts_each_language_by_its_own_fit(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights")
    rows, y = rows_and_targets(200)
    pooled, own = calib.fit(rows, y), calib.fit(rows, 1 - y)  # a language whose truth runs the other way
    fitted = dataclasses.replace(pooled, weights_sha256=file_sha256(weights), by_language={"xb": own})
    languages = ["xb", "xc", None] * 3
    got = fitted.predict(rows[:9], languages)
    want = [own.predict([r])[0] if lang == "xb" else pooled.predict([r])[0] for r, lang in zip(rows, languages)]
    assert got == pytest.approx(want) and not np.allclose(own.predict(rows[:9]), pooled.predict(rows[:9]))
    fitted.save(tmp_path)
    loaded = calib.load(tmp_path, weights)
    assert set(loaded.by_language) == {"xb"} and loaded.predict(rows[:9], languages) == pytest.approx(want)
    broken = json.loads((tmp_path / calib.CALIBRATION).read_text())
    broken["by_language"]["xb"]["bias"] = None
    (tmp_path / calib.CALIBRATION).write_text(json.dumps(broken))
    with pytest.raises(calib.CalibrationError, match="bias: None is not"):
        calib.load(tmp_path, weights)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [("mean", (math.nan,), "mean: nan is not a finite number"), ("bias", math.inf, "bias: inf is not"),
     ("weights", ("0.5",), "weights: '0.5' is not"), ("scale", (None,), "scale: None is not"),
     ("bias", True, "bias: True is not"), ("scale", (0.0,), "scale must be > 0")],
)  # fmt: skip
def test_a_calibration_that_is_not_finite_numbers_is_refused(field, value, problem):
    rows, y = rows_and_targets(200)
    fitted = calib.fit(rows, y)
    if isinstance(value, tuple):  # the first feature's, the others as fitted
        value = value + getattr(fitted, field)[1:]
    with pytest.raises(calib.CalibrationError, match=re.escape(problem)):
        dataclasses.replace(fitted, **{field: value})


def test_a_texts_confidence_is_its_sentences_weighted_by_characters():
    a = Confident("x", 0.0, 0.9, -0.1)
    b = Confident("y", 0.0, 0.3, -0.7)
    conf, raw = text_confidence([("a" * 30, a), ("b" * 10, b)])
    assert conf == pytest.approx((30 * 0.9 + 10 * 0.3) / 40) and raw == pytest.approx((30 * -0.1 + 10 * -0.7) / 40)
    assert text_confidence([("a", a), ("b", Confident("y", 0.0, None, -1.0))])[0] is None
    assert text_confidence([]) == (1.0, 0.0)


# --- a checkpoint's confidence ---------------------------------------------------------------------------------


def test_training_ends_with_a_calibration_for_its_best_weights(run_dir):
    stored = json.loads((run_dir / calib.CALIBRATION).read_text())
    assert stored["weights_sha256"] == sha(run_dir / "model.safetensors")
    assert stored["fit"]["sentences"] == 100 and stored["fit"]["data"] == "validation set"
    assert Translator.from_checkpoint(run_dir).calibration is not None


def test_confident_translations_are_the_translations_with_the_calibrations_estimate(run_dir, sentences):
    t = Translator.from_checkpoint(run_dir)
    for beam_size in (1, 2):
        found = t.translate_confident(sentences + [""], beam_size=beam_size)
        assert [c.translation for c in found] == t.translate(sentences + [""], beam_size=beam_size)
        hyps = t.translate_hypotheses(sentences, beam_size=beam_size)
        for c, h in zip(found, hyps):
            assert c.confidence == pytest.approx(float(t.calibration.predict([c.features])[0]))
            assert 0 <= c.confidence <= 1
            if beam_size > 1:  # the raw score is the beam's log-prob over its tokens (EOS included)
                assert c.raw == pytest.approx(h[0].log_prob / (len(h[0].tokens) + 1), abs=1e-4)
            assert " ".join(w for w, _ in c.words).split() == c.translation.split()
            assert c.doubtful == [w for w, p in c.words if p < 0.5]
        assert found[-1] == Confident("", 0.0, 1.0, 0.0)


def nan_mean(stored):
    stored["mean"][0] = math.nan  # json writes NaN, and reads it back as a float


def string_weight(stored):
    stored["weights"][1] = "0.5"


def no_scale(stored):
    del stored["scale"]


def zero_scale(stored):
    stored["scale"][2] = 0


@pytest.mark.parametrize(
    ("damage", "problem"),
    [(nan_mean, "mean: nan is not a finite number"), (string_weight, "weights: '0.5' is not a finite number"),
     (no_scale, "no 'scale' field"), (zero_scale, "scale must be > 0")],
)  # fmt: skip
def test_a_damaged_calibration_is_uncalibrated_with_one_warning(run_dir, uncalibrated, sentences, tmp_path, damage,
                                                                problem, caplog):  # fmt: skip
    """calibration.json for these weights, damaged: confidences are None (the raw score stays), not an error at the
    first one asked for (and at every later one), and one warning names the file and what is wrong with it."""
    copy = tmp_path / "run"
    shutil.copytree(uncalibrated, copy)
    stored = json.loads((run_dir / calib.CALIBRATION).read_text())
    damage(stored)
    (copy / calib.CALIBRATION).write_text(json.dumps(stored))
    t = Translator.from_checkpoint(copy)
    with caplog.at_level(logging.WARNING, logger="nanomt"):
        found = t.translate_confident(sentences[:4])
        again = t.translate_confident(sentences[:4])
    assert [c.confidence for c in found + again] == [None] * 8 and t.calibration is None
    assert [c.translation for c in found] == t.translate(sentences[:4])
    assert all(math.isfinite(c.raw) for c in found)
    warnings = [r.getMessage() for r in caplog.records if r.name == "nanomt" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(copy / calib.CALIBRATION) in warnings[0] and problem in warnings[0]


@pytest.mark.slow  # nanomt's commands on a trained run
def test_nanomt_calibrate_writes_only_its_file_and_refuses_too_few(uncalibrated, toy_corpus, tmp_path):
    before = {p.name: sha(p) for p in uncalibrated.iterdir() if p.is_file()}
    out = run_nanomt(
        "calibrate", uncalibrated, "--src", toy_corpus["valid.src"], "--ref", toy_corpus["valid.tgt"], "--beam-size", 1,
        text=True, check=True,
    )  # fmt: skip
    assert "Pearson" in out.stdout
    after = {p.name: sha(p) for p in uncalibrated.iterdir() if p.is_file()}
    assert set(after) - set(before) == {calib.CALIBRATION}
    assert all(after[name] == digest for name, digest in before.items())  # the weights are byte-identical
    stored = json.loads((uncalibrated / calib.CALIBRATION).read_text())
    assert stored["weights_sha256"] == before["model.safetensors"] and stored["fit"]["beam_size"] == 1
    few = tmp_path / "few.src"
    few.write_text("".join(toy_corpus["valid.src"].read_text().splitlines(keepends=True)[:5]))
    bad = run_nanomt("calibrate", uncalibrated, "--src", few, "--ref", few, text=True)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0
    assert "5 sentence pairs" in bad.stderr and "at least 100" in bad.stderr
    (uncalibrated / calib.CALIBRATION).unlink()


@pytest.mark.slow  # nanomt's commands on a trained run
def test_translate_confidence_writes_a_second_column_or_says_there_is_none(run_dir, uncalibrated, tmp_path, sentences):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences) + "\n")
    out = run_nanomt("translate", run_dir, "-i", src, "--confidence", text=True, check=True)
    found = Translator.from_checkpoint(run_dir).translate_confident(sentences)
    assert out.stdout.splitlines() == [f"{c.translation}\t{c.confidence:.4f}" for c in found]
    assert "warning" not in out.stderr
    raw = run_nanomt("translate", uncalibrated, "-i", src, "--confidence", text=True, check=True)
    assert raw.stdout.splitlines() == [f"{c.translation}\t{c.raw:.4f}" for c in found]
    assert "has no calibration" in raw.stderr
    refused = run_nanomt("translate", run_dir, "-i", src, "--confidence", "--n-best", 2, text=True)
    assert refused.returncode != 0 and "--confidence" in refused.stderr


@pytest.mark.slow  # nanomt's commands on a trained run
def test_evaluate_reports_the_correlation_beside_bleu(run_dir, toy_corpus):
    out = run_nanomt(
        "evaluate", run_dir, "--src", toy_corpus["test.src"], "--ref", toy_corpus["test.tgt"], "--confidence", "--json",
        text=True, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    t = Translator.from_checkpoint(run_dir)
    srcs = toy_corpus["test.src"].read_text().splitlines()
    refs = toy_corpus["test.tgt"].read_text().splitlines()
    found = t.translate_confident(srcs)
    chrf = calib.sentence_chrf([c.translation for c in found], refs)
    assert report["confidence"] == calib.agreement([c.confidence for c in found], chrf)
    assert report["raw_score"]["pearson"] == calib.agreement([c.raw for c in found], chrf)["pearson"]
    assert "bleu" in report


@pytest.mark.slow  # nanomt in subprocesses
def test_the_predictor_comparison_runs_on_a_small_shape(run_dir, toy_corpus, tmp_path):
    """benchmarks.confidence --smoke on the toy pair laid out as Multi30k and news sets."""
    data = tmp_path / "data"
    (data / "multi30k").mkdir(parents=True)
    (data / "news").mkdir()
    for split, name in (("valid", "val"), ("test", "test2016")):
        for side, lang in (("src", "de"), ("tgt", "en")):
            shutil.copy(toy_corpus[f"{split}.{side}"], data / "multi30k" / f"{name}.{lang}")
    from benchmarks.confidence import NEWS

    for name in NEWS:
        for side, lang in (("src", "de"), ("tgt", "en")):
            shutil.copy(toy_corpus[f"test.{side}"], data / "news" / f"{name}.{lang}")
    out = tmp_path / "confidence.json"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.confidence", str(run_dir), "--data", str(data), "--smoke",
         "--news-lines", "20", "--out", str(out)],
        check=True, capture_output=True, cwd=REPO,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["sets"]["news"]["sentences"] == 20 * len(NEWS)
    assert "baseline: line on mean log-prob" in result["predictors"]
    assert all(set(v) == {"val", "test2016", "news"} for v in result["predictors"].values())
