"""`nanomt evaluate`: sacreBLEU's BLEU and chrF of checkpoints on a test set, with the flags' Decoding."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nanomt.cli import models, no_collection_while_loading


def evaluate(args: argparse.Namespace) -> None:
    with no_collection_while_loading():  # torch is imported here, before the model loads
        from nanomt.training.evaluate import evaluate as score

    translator, decoding = models.translator_and_decoding(args)
    report = score(
        translator,
        args.src,
        args.ref,
        decoding=decoding,
        save_hyp=args.save_hyp,
        progress=sys.stderr.isatty() and not args.json,
        max_tokens=args.max_tokens,
        confidence=args.confidence,
    )
    if args.json:
        print(json.dumps(report))
        return
    print(f"BLEU = {report['bleu']:.2f}  ({report['bleu_signature']})")
    print(f"chrF = {report['chrf']:.2f}  ({report['chrf_signature']})")
    speed = f", {report['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in report else ""
    rate = f"{report['sentences_per_s']:.1f} sentences/s{speed}"
    print(f"{report['sentences']} sentences in {report['seconds']:.1f} s ({rate})")
    if args.confidence:
        raw, conf = report["raw_score"], report["confidence"]
        if isinstance(conf, dict):
            print(
                f"confidence vs sentence chrF: Pearson {conf['pearson']:.3f}, Spearman {conf['spearman']:.3f}, "
                f"mean absolute error {conf['mae']:.3f}"
            )
        else:
            print(f"confidence: {conf}")
        print(f"raw score vs sentence chrF: Pearson {raw['pearson']:.3f}, Spearman {raw['spearman']:.3f}")


def calibrate(args: argparse.Namespace) -> None:
    """`nanomt calibrate`: fit the confidence and say how well it fits there, beside the raw score."""
    from nanomt.core.checkpoint import checkpoint_weights
    from nanomt.decoding.calibration import CALIBRATION
    from nanomt.decoding.translate import Translator
    from nanomt.training.evaluate import calibrate as fit
    from nanomt.training.evaluate import read_pairs

    srcs, refs = read_pairs(args.src, args.ref)
    translator = Translator.from_checkpoint(args.checkpoint, calibrated=False)
    decoding = translator.default_decoding.replace(beam_size=args.beam_size)
    weights = checkpoint_weights(args.checkpoint)
    data = f"{Path(args.src).name} / {Path(args.ref).name}"
    fitted = fit(translator, srcs, refs, weights, decoding, args.max_tokens, data)
    got, raw = fitted.fit, fitted.fit["raw_score"]
    print(f"wrote {weights.parent / CALIBRATION} ({got['sentences']} sentences, beam {decoding.beam_size})")
    print(
        f"confidence vs sentence chrF there: Pearson {got['pearson']:.3f}, Spearman {got['spearman']:.3f}, "
        f"mean absolute error {got['mae']:.3f} (the raw score: Pearson {raw['pearson']:.3f}, "
        f"Spearman {raw['spearman']:.3f})"
    )
