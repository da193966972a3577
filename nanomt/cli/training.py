"""`nanomt train`, `nanomt distill`, `nanomt average` and `nanomt synth`: runs, checkpoints and the toy corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from nanomt.cli import no_collection_while_loading


def train(args: argparse.Namespace) -> None:
    with no_collection_while_loading():  # torch and the training modules: their objects out of later passes
        from nanomt.training.train import train_from_file

    overrides = [*(args.set or []), *([f"train.init_from={args.init_from}"] if args.init_from else [])]
    run_dir = train_from_file(args.config, args.run_dir, overrides)
    print(f"run directory: {run_dir}")


def distill(args: argparse.Namespace) -> None:
    """`nanomt distill`: the teacher's decoding is its checkpoint's with the flags changed, checked before loading."""
    from nanomt.cli.models import check_device, checkpoint_decoding, decoding_flags

    check_device(args.device)
    if args.buffer_size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {args.buffer_size}")
    decoding = checkpoint_decoding(args.teachers[0]).replace(**decoding_flags(args))
    with no_collection_while_loading():
        from nanomt.training.distill import distill as run

    run_dir = run(
        args.teachers,
        args.src,
        args.run_dir,
        args.buffer_size,
        student=args.student,
        config=Path(args.config) if args.config else None,
        overrides=args.set or [],
        pairs=[tuple(p) for p in args.pairs],
        pairs_weight=args.pairs_weight,
        valid=tuple(args.valid) if args.valid else None,
        decoding=decoding,
        int8=args.int8,
        device=args.device,
        init=args.init,
    )
    print(f"run directory: {run_dir}")


def average(args: argparse.Namespace) -> None:
    from nanomt.core.checkpoint import CheckpointError, average_checkpoints, check_new_dir, step_dirs

    paths = list(args.checkpoints)
    if args.last:
        if len(paths) != 1:
            raise CheckpointError("--last N takes exactly one run directory")
        steps = step_dirs(paths[0])
        if not steps:
            raise CheckpointError(f"{paths[0]}: no checkpoints/step_N directories")
        paths = [p for _, p in steps[-args.last :]]
    out = average_checkpoints(paths, check_new_dir(args.out, "--out"))
    print(f"averaged {len(paths)} checkpoints ({', '.join(Path(p).name for p in paths)}) into {out}")


def synth(args: argparse.Namespace) -> None:
    from nanomt.training.synthetic import write_corpus, write_multilingual_corpus

    if args.multilingual:
        paths = write_multilingual_corpus(args.out_dir, pairs_per_direction=args.pairs, seed=args.seed)
        directions = sorted({name.split(".")[1] for name in paths})
        print(f"{len(directions)} directions ({', '.join(directions)}) in {args.out_dir}: train.xa-xb.xa, ...")
        return
    paths = write_corpus(args.out_dir, pairs=args.pairs, seed=args.seed)
    for split in ("train", "valid", "test"):
        src, tgt = paths[f"{split}.src"], paths[f"{split}.tgt"]
        with open(src, "rb") as f:
            pairs = sum(1 for _ in f)
        print(f"{split}: {pairs} pairs in {src} and {tgt}")


def shortlist(args: argparse.Namespace) -> None:
    """`nanomt shortlist`: a checkpoint's vocabulary shortlist from a parallel corpus, beside its weights."""
    from nanomt.core.checkpoint import checkpoint_weights, find_run_files
    from nanomt.core.config import load_config
    from nanomt.core.tokenizer import Tokenizer
    from nanomt.decoding.shortlist import build
    from nanomt.training.evaluate import read_pairs

    srcs, tgts = read_pairs(args.src, args.tgt)
    config, tokenizer_dir = find_run_files(args.checkpoint)
    tokenizer = Tokenizer.load(tokenizer_dir)
    vocab = load_config(config).model.tgt_vocab_size
    table = build(tokenizer.encode_src(srcs), tokenizer.encode_tgt(tgts), vocab, tokenizer.fingerprint(), args.top,
                  args.frequent)  # fmt: skip
    path = table.save(checkpoint_weights(args.checkpoint).parent)
    sizes = [len(t) for t in table.table.values()]
    print(f"wrote {path}: {len(table.table)} source pieces, {sum(sizes) / max(len(sizes), 1):.1f} target pieces each, "
          f"{len(table.frequent)} always kept")  # fmt: skip
