"""Evaluate a checkpoint on a test set: sacreBLEU BLEU and chrF with their signatures, and speed; fit its confidence
(calibrate), and a trained run's on its validation set (calibrate_run)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict
from pathlib import Path

from nanomt.core.checkpoint import checkpoint_weights, file_sha256
from nanomt.core.config import Config
from nanomt.core.decoding import Decoding
from nanomt.core.runtime import Runtime
from nanomt.core.tokenizer import language_of
from nanomt.decoding import calibration as calib
from nanomt.decoding.calibration import Calibration, agreement, sentence_chrf
from nanomt.decoding.translate import Translator
from nanomt.training.data import CorpusError, read_lines, split_pairs
from nanomt.training.metrics import bleu_by_language, score

log = logging.getLogger("nanomt")


def evaluate(
    translator: Translator,
    src_path: str | Path,
    ref_path: str | Path,
    decoding: Decoding | None = None,
    save_hyp: str | Path | None = None,
    progress: bool = False,
    max_tokens: int | None = None,
    confidence: bool = False,
    **settings,
) -> dict:
    """Translate `src_path` with `decoding` (default: the checkpoint's) and `settings` changed (e.g. beam_size=4),
    score against `ref_path`; returns a JSON-ready report. With `confidence`, also how well the confidence (and the
    raw score) follow each sentence's chrF, and no tokens/s: the confidence's work is then part of the time."""
    srcs, refs = read_pairs(src_path, ref_path)
    decoding = (decoding or translator.default_decoding).replace(**settings)
    start = time.perf_counter()
    if confidence:
        confident = translator.translate_confident(srcs, decoding, max_tokens=max_tokens)
    else:
        hyps = translator.translate_hypotheses(srcs, decoding, max_tokens=max_tokens, progress=progress)
    seconds = time.perf_counter() - start
    texts = (
        [c.translation for c in confident]
        if confidence
        else translator.tokenizer.decode_tgt([h[0].tokens for h in hyps])
    )
    if save_hyp:
        Path(save_hyp).write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    report = asdict(score(texts, refs))
    report.update(seconds=round(seconds, 3), sentences_per_s=round(len(srcs) / max(seconds, 1e-9), 2))
    if by_language := bleu_by_language(srcs, texts, refs):  # sources of several target languages, each with its code
        report["bleu_by_language"] = by_language
    if confidence:
        report.update(beam_size=decoding.beam_size, **confidence_report(confident, texts, refs))
    else:
        n_tokens = sum(len(h[0].tokens) + 1 for h in hyps)  # + EOS: every generated token counts
        report.update(tokens_per_s=round(n_tokens / max(seconds, 1e-9), 1), beam_size=decoding.beam_size)
    return report


def read_pairs(src_path: str | Path, ref_path: str | Path) -> tuple[list[str], list[str]]:
    """A source file and its references, one line each (CorpusError when they differ in length)."""
    srcs, refs = read_lines(src_path), read_lines(ref_path)
    if len(srcs) != len(refs):
        raise CorpusError(f"{src_path} has {len(srcs)} lines but {ref_path} has {len(refs)}")
    return srcs, refs


def confidence_report(confident: list, texts: list[str], refs: list[str]) -> dict:
    """How each sentence's confidence and raw score follow its chrF / 100 (Pearson, Spearman; MAE for the
    confidence, which estimates it)."""
    keep = [i for i, c in enumerate(confident) if c.features is not None]
    chrf = sentence_chrf([texts[i] for i in keep], [refs[i] for i in keep])
    report = {"raw_score": agreement([confident[i].raw for i in keep], chrf)}
    del report["raw_score"]["mae"]  # a log-probability is no estimate of chrF: no error to speak of
    if keep and confident[keep[0]].confidence is not None:
        report["confidence"] = agreement([confident[i].confidence for i in keep], chrf)
    else:
        report["confidence"] = "uncalibrated (nanomt calibrate fits it)"
    return report


def calibrate(
    translator: Translator,
    srcs: list[str],
    refs: list[str],
    weights: str | Path,
    decoding: Decoding | None = None,
    max_tokens: int | None = None,
    data: str = "",
) -> Calibration:
    """Fit the confidence of `translator` (whose weights are the file `weights`) on sentences and their references
    (`data` names them), and write it as calibration.json beside the weights; CalibrationError with too few."""
    pairs = [(s, r) for s, r in zip(srcs, refs) if s.strip() and r.strip()]
    if len(pairs) < calib.MIN_SENTENCES:
        raise calib.CalibrationError(
            f"{len(pairs)} sentence pairs to calibrate on{' in ' + data if data else ''}: "
            f"at least {calib.MIN_SENTENCES} are needed"
        )
    decoding = decoding or translator.default_decoding
    confident = translator.translate_confident([s for s, _ in pairs], decoding, max_tokens=max_tokens)
    chrf = sentence_chrf([c.translation for c in confident], [r for _, r in pairs])
    fitted = calib.fit([c.features for c in confident], chrf)
    raw = agreement([c.raw for c in confident], chrf)
    described = {
        **fitted.fit,
        "data": data,
        "beam_size": decoding.beam_size,
        "raw_score": {"pearson": raw["pearson"], "spearman": raw["spearman"]},
    }
    languages = [language_of(s, decoding.target_lang) for s, _ in pairs]
    by_language = fit_by_language(languages, [c.features for c in confident], chrf)
    fitted = dataclasses.replace(fitted, weights_sha256=file_sha256(weights), fit=described, by_language=by_language)
    fitted.save(Path(weights).parent)
    translator.calibration = fitted
    return fitted


def fit_by_language(languages: list[str | None], features: list[dict], chrf: list[float]) -> dict[str, Calibration]:
    """A multilingual model's calibration of each target language with enough sentences of its own (the others' take
    the fit of every language together)."""
    groups: dict[str, list[int]] = {}
    for i, code in enumerate(languages):
        if code is not None:
            groups.setdefault(code, []).append(i)
    return {
        code: calib.fit([features[i] for i in idx], [chrf[i] for i in idx])
        for code, idx in groups.items()
        if len(idx) >= calib.MIN_SENTENCES
    }


def calibrate_run(cfg: Config, run_dir: Path, rt: Runtime) -> None:
    """Fit the confidence on the whole validation set with the run's best weights (train.calibrate), where the set
    has enough sentences; never touching the weights."""
    pairs = [(s, t) for s, t in split_pairs(cfg.data, "valid") if s.strip() and t.strip()]
    if len(pairs) < calib.MIN_SENTENCES:
        log.info("confidence not calibrated: %d validation pairs, %d needed", len(pairs), calib.MIN_SENTENCES)
        return
    translator = Translator.from_checkpoint(run_dir, rt.device, calibrated=False)
    srcs, refs = [s for s, _ in pairs], [t for _, t in pairs]
    fitted = calibrate(translator, srcs, refs, checkpoint_weights(run_dir), data="validation set")
    log.info(
        "confidence calibrated on %d validation sentences: Pearson %.3f with sentence chrF (the raw score's %.3f)",
        fitted.fit["sentences"],
        fitted.fit["pearson"],
        fitted.fit["raw_score"]["pearson"],
    )
