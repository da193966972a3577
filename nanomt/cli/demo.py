"""`nanomt demo`: train on the built-in toy language pair, then show translations, BLEU and pictures; with
--multilingual, one model for the three toy languages in every direction, and its BLEU in each."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from pathlib import Path

from nanomt import plots
from nanomt.core.config import CorpusConfig, load_config
from nanomt.decoding.translate import Translator
from nanomt.training.data import read_lines
from nanomt.training.evaluate import evaluate
from nanomt.training.metrics import bleu
from nanomt.training.synthetic import write_corpus, write_multilingual_corpus
from nanomt.training.train import train

# Package data, so that `nanomt demo` runs from an installed package; configs/demo*.yaml link to them.
DEMO_CONFIG = Path(__file__).resolve().parent / "configs" / "demo.yaml"
MULTILINGUAL_CONFIG = DEMO_CONFIG.with_name("demo_multilingual.yaml")
DEMO_PAIRS = 12000
DIRECTION_PAIRS = 3000  # --multilingual: training pairs of each of the six directions


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A plain-text table, one row per sentence and field."""
    width = max(len(h) for h in header)
    lines = []
    for row in rows:
        lines += [f"{h:>{width}}: {v}" for h, v in zip(header, row)] + [""]
    return "\n".join(lines)


def demo(args: argparse.Namespace) -> None:
    if args.multilingual:
        run_multilingual_demo(Path(args.out or "runs/demo_multilingual"), steps=args.steps, pairs=args.pairs)
    else:
        run_demo(Path(args.out or "runs/demo"), steps=args.steps, pairs=args.pairs)


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


def run_multilingual_demo(out: Path, steps: int | None = None, pairs: int | None = None) -> dict[str, float]:
    """Write the three toy languages in all six directions, train one model on them (each source after its target
    language's token), and translate each direction's test set; returns the BLEU of each direction."""
    start = time.perf_counter()
    data, run = out / "data", out / "run"
    paths = write_multilingual_corpus(data, pairs_per_direction=pairs or DIRECTION_PAIRS, valid=100, test=100)
    cfg = load_config(MULTILINGUAL_CONFIG, [f"train.max_steps={steps}"] if steps is not None else [])
    train_set, valid_set = multilingual_corpora(paths, "train"), multilingual_corpora(paths, "valid")
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=train_set, valid=valid_set))
    shutil.rmtree(run, ignore_errors=True)
    print(f"training one model on {len(train_set)} directions of the toy languages ({data}); run directory {run}")
    train(cfg, run)
    translator = Translator.from_checkpoint(run)
    scores, rows = {}, []
    for corpus in multilingual_corpora(paths, "test"):
        direction = f"{Path(corpus.src).suffix[1:]}-{corpus.tgt_lang}"
        srcs, refs = read_lines(corpus.src), read_lines(corpus.tgt)
        hyps = translator.translate(srcs, target_lang=corpus.tgt_lang)
        scores[direction] = bleu(hyps, refs)
        rows.append((direction, srcs[0], refs[0], hyps[0]))
    print()
    print(_table(rows, ("direction", "source", "reference", "beam 5")))
    print("test BLEU (beam 5): " + ", ".join(f"{d} {b:.1f}" for d, b in scores.items()))
    print(f"total {time.perf_counter() - start:.0f} s")
    return scores


def multilingual_corpora(paths: dict[str, Path], split: str) -> tuple[CorpusConfig, ...]:
    """One split of write_multilingual_corpus' files as a config's corpora (data.train or data.valid): each
    direction's pair of files with its target language, the token that asks one model for it."""
    directions = sorted({name.split(".")[1] for name in paths if name.startswith(f"{split}.")})
    corpora = []
    for direction in directions:
        src, tgt = direction.split("-")
        files = {side: str(paths[f"{split}.{direction}.{code}"]) for side, code in (("src", src), ("tgt", tgt))}
        corpora.append(CorpusConfig(**files, tgt_lang=tgt))
    return tuple(corpora)


def _cross_attention(translator: Translator, sentence: str):
    """Source tokens, target tokens and the last layer's cross-attention (H, T, S) of one sentence."""
    att = translator.attention(sentence)
    return att.src_tokens, att.tgt_tokens, att.cross[-1]
