"""`nanomt plot attention|positions|curves`: pictures a person can look at."""

from __future__ import annotations

import argparse
from pathlib import Path

from nanomt.cli import models


def plot(args: argparse.Namespace) -> None:
    from nanomt import plots

    if args.what == "positions":
        path = plots.plot_positions(args.output, d_model=args.d_model, n_positions=args.positions)
    elif args.what == "curves":
        path = plots.plot_curves(Path(args.run_dir) / "metrics.jsonl", args.output)
    else:
        path = plot_attention(args)
    print(path)


def plot_attention(args: argparse.Namespace) -> Path:
    """Heatmaps of one sentence's attention: every head of a layer, or one head."""
    from nanomt import plots
    from nanomt.decoding.translate import Translator

    models.check_device(args.device)
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    att = translator.attention(args.sentence, beam_size=args.beam)
    layers = getattr(att, args.kind)
    if not layers:
        raise ValueError(f"the model has no {args.kind} attention layers")
    layer = args.layer if args.layer >= 0 else len(layers) + args.layer
    if not 0 <= layer < len(layers):
        raise ValueError(f"--layer {args.layer} is out of range: the model has {len(layers)} layers")
    weights = layers[layer]  # (H, Tq, Tk)
    rows, cols = {
        "cross": (att.tgt_tokens, att.src_tokens),
        "encoder": (att.src_tokens, att.src_tokens),
        "decoder": (att.tgt_tokens, ["<s>"] + att.tgt_tokens[:-1]),
    }[args.kind]
    heads = list(range(weights.shape[0]))
    if args.head is not None:
        if not 0 <= args.head < len(heads):
            raise ValueError(f"--head {args.head} is out of range: the model has {len(heads)} heads")
        heads = [args.head]
    title = f"{args.kind} attention, layer {layer}: {args.sentence!r} -> {att.translation!r}"
    return plots.plot_attention(
        args.output, cols, rows, weights[heads], title=title, head_titles=[f"head {h}" for h in heads]
    )
