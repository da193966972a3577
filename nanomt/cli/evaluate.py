"""`nanomt evaluate`: sacreBLEU's BLEU and chrF of checkpoints on a test set, with the flags' Decoding."""

from __future__ import annotations

import argparse
import json
import sys

from nanomt.cli import models


def evaluate(args: argparse.Namespace) -> None:
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
    )
    if args.json:
        print(json.dumps(report))
        return
    print(f"BLEU = {report['bleu']:.2f}  ({report['bleu_signature']})")
    print(f"chrF = {report['chrf']:.2f}  ({report['chrf_signature']})")
    print(
        f"{report['sentences']} sentences in {report['seconds']:.1f} s "
        f"({report['sentences_per_s']:.1f} sentences/s, {report['tokens_per_s']:.0f} tokens/s)"
    )
