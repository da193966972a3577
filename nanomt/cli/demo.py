"""`nanomt demo`: train on the built-in toy language pair, then show translations, BLEU and pictures."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from nanomt import plots
from nanomt.core.config import load_config
from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines
from nanomt.training.evaluate import evaluate
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import train

# Package data, so that `nanomt demo` runs from an installed package; configs/demo.yaml links to it.
DEMO_CONFIG = Path(__file__).resolve().parent / "configs" / "demo.yaml"
DEMO_PAIRS = 12000


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A plain-text table, one row per sentence and field."""
    width = max(len(h) for h in header)
    lines = []
    for row in rows:
        lines += [f"{h:>{width}}: {v}" for h, v in zip(header, row)] + [""]
    return "\n".join(lines)


def demo(args: argparse.Namespace) -> None:
    run_demo(Path(args.out), steps=args.steps, pairs=args.pairs)


def run_demo(out: Path, steps: int | None = None, pairs: int | None = None, config: Path = DEMO_CONFIG) -> dict:
    """Write the toy corpus, train from scratch, evaluate, plot; returns the test report."""
    if not config.is_file():
        raise FileNotFoundError(f"demo config not found: {config}")
    start = time.perf_counter()
    data, run = out / "data", out / "run"
    paths = write_corpus(data, pairs=pairs or DEMO_PAIRS, seed=0)
    overrides = [
        f"data.{split}.{side}={paths[f'{split}.{side}']}"
        for split in ("train", "valid", "test")
        for side in ("src", "tgt")
    ]
    if steps is not None:
        overrides.append(f"train.max_steps={steps}")
    cfg = load_config(config, overrides)
    shutil.rmtree(run, ignore_errors=True)  # the demo always trains from scratch
    print(f"training on {pairs or DEMO_PAIRS} toy pairs ({paths['train.src']}); run directory {run}")
    train(cfg, run)
    train_seconds = time.perf_counter() - start

    translator = Translator.from_checkpoint(run)
    srcs, refs = read_lines(paths["test.src"])[:6], read_lines(paths["test.tgt"])[:6]
    greedy_out = translator.translate(srcs, beam_size=1)
    beam_out = translator.translate(srcs, beam_size=5)
    print()
    print(_table(list(zip(srcs, refs, greedy_out, beam_out)), ("source", "reference", "greedy", "beam 5")))

    report = evaluate(translator, paths["test.src"], paths["test.tgt"], beam_size=5)
    heatmap = plots.plot_attention(
        out / "attention.png",
        *_cross_attention(translator, srcs[0]),
        title=f"cross-attention, last layer: {srcs[0]!r}",
    )
    curves = plots.plot_curves(run / "metrics.jsonl", out / "curves.png")
    print(
        f"test BLEU (beam 5) = {report['bleu']:.2f}, chrF = {report['chrf']:.2f} on {report['sentences']} "
        f"held-out sentences  ({report['bleu_signature']})"
    )
    print(f"trained in {train_seconds:.0f} s; total {time.perf_counter() - start:.0f} s")
    print(f"attention heatmap: {heatmap}")
    print(f"training curves:   {curves}")
    return report


def _cross_attention(translator: Translator, sentence: str):
    """Source tokens, target tokens and the last layer's cross-attention (H, T, S) of one sentence."""
    att = translator.attention(sentence)
    return att.src_tokens, att.tgt_tokens, att.cross[-1]
