"""The `nanomt` command line; the only module that turns strings into configs."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import sys
from pathlib import Path

from nanomt.cli.translate import BUFFER_SIZE
from nanomt.core.config import ConfigError
from nanomt.documents.files import FORMATS

log = logging.getLogger("nanomt")


def cmd_train(args: argparse.Namespace) -> None:
    from nanomt.training.train import train_from_file

    overrides = [*(args.set or []), *([f"train.init_from={args.init_from}"] if args.init_from else [])]
    run_dir = train_from_file(args.config, args.run_dir, overrides)
    print(f"run directory: {run_dir}")


def check_device(device: str) -> None:
    """Refuse a device this PyTorch build or machine lacks, in one line, before anything is loaded onto it."""
    from nanomt.core.runtime import pick_device

    pick_device(device, option="--device")


def sampling_options(args: argparse.Namespace) -> dict | None:
    """Translator's sampling settings from --sampling and its options; None for beam search."""
    options = {
        "--sampling-topk": ("top_k", args.sampling_topk),
        "--sampling-topp": ("top_p", args.sampling_topp),
        "--temperature": ("temperature", args.temperature),
        "--seed": ("seed", args.seed),
    }
    given = [flag for flag, (_, value) in options.items() if value is not None]
    if not args.sampling:
        if given:
            raise ValueError(f"{', '.join(given)} only apply with --sampling")
        return None
    if args.beam is not None or args.n_best > 1:
        raise ValueError("--beam and --n-best are beam search's; they do not combine with --sampling")
    return {key: value for key, value in options.values() if value is not None}


def decoding_changes(args: argparse.Namespace) -> dict:
    """The decoding settings a `translate` or `evaluate` command changes (Decoding's fields), checked here."""
    from nanomt.core.decoding import Decoding
    from nanomt.decoding.glossary import read_glossary

    changes = {
        "beam_size": args.beam,
        "n_best": getattr(args, "n_best", 1) if getattr(args, "n_best", 1) > 1 else None,
        "length_penalty": args.length_penalty,
        "min_len": args.min_len,
        "max_len_a": args.max_len_a,
        "max_len_b": args.max_len_b,
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "repetition_penalty": args.repetition_penalty,
        "sampling": sampling_options(args) if hasattr(args, "sampling") else None,
        "glossary": read_glossary(args.glossary) if args.glossary else None,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    Decoding(beam_size=max(changes.get("beam_size", 1), changes.get("n_best", 1))).replace(**changes)  # the checks
    return changes


def decoding_translator(args: argparse.Namespace):
    """The checkpoints' Translator for a process that decodes until it ends (translate, evaluate)."""
    from nanomt.core import runtime
    from nanomt.decoding.translate import Translator

    check_device(args.device)
    translator = Translator.from_checkpoints(args.checkpoints, device=args.device, int8=args.int8)
    # Beam search frees and reallocates blocks of tens of MB every step: kept in the heap, their pages are not
    # faulted in again (benchmarks/results/decode_malloc.json). After loading, whose freed memory is not kept.
    if args.device.startswith("cpu"):
        runtime.keep_freed_memory()
    return translator


def cmd_translate(args: argparse.Namespace) -> None:
    from nanomt.cli import translate as cli_translate

    changes = decoding_changes(args)  # refused before the model is loaded
    cli_translate.check_modes(args)
    cli_translate.run(args, decoding_translator(args), changes)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from nanomt.training.evaluate import evaluate

    changes = decoding_changes(args)
    translator = decoding_translator(args)
    report = evaluate(
        translator,
        args.src,
        args.ref,
        save_hyp=args.save_hyp,
        progress=sys.stderr.isatty() and not args.json,
        max_tokens=args.max_tokens,
        **changes,
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


def cmd_average(args: argparse.Namespace) -> None:
    from nanomt.core.checkpoint import CheckpointError, average_checkpoints, step_dirs

    paths = list(args.checkpoints)
    if args.last:
        if len(paths) != 1:
            raise CheckpointError("--last N takes exactly one run directory")
        steps = step_dirs(paths[0])
        if not steps:
            raise CheckpointError(f"{paths[0]}: no checkpoints/step_N directories")
        paths = [p for _, p in steps[-args.last :]]
    out = average_checkpoints(paths, args.out)
    print(f"averaged {len(paths)} checkpoints ({', '.join(Path(p).name for p in paths)}) into {out}")


def cmd_plot(args: argparse.Namespace) -> None:
    from nanomt import plots

    if args.what == "positions":
        path = plots.plot_positions(args.output, d_model=args.d_model, n_positions=args.positions)
    elif args.what == "curves":
        path = plots.plot_curves(Path(args.run_dir) / "metrics.jsonl", args.output)
    else:
        path = plot_attention_cmd(args)
    print(path)


def plot_attention_cmd(args: argparse.Namespace) -> Path:
    """Heatmaps of one sentence's attention: every head of a layer, or one head."""
    from nanomt import plots
    from nanomt.decoding.translate import Translator

    check_device(args.device)
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


def cmd_synth(args: argparse.Namespace) -> None:
    from nanomt.training.synthetic import write_corpus

    paths = write_corpus(args.out_dir, pairs=args.pairs, seed=args.seed)
    for split in ("train", "valid", "test"):
        src, tgt = paths[f"{split}.src"], paths[f"{split}.tgt"]
        with open(src, "rb") as f:
            pairs = sum(1 for _ in f)
        print(f"{split}: {pairs} pairs in {src} and {tgt}")


def cmd_import(args: argparse.Namespace) -> None:
    from nanomt.interop import import_marian

    print(f"run directory: {import_marian(args.hf_dir, args.out)}")


def cmd_export(args: argparse.Namespace) -> None:
    try:
        if args.target == "ct2":
            from nanomt.interop.ct2 import export_ct2

            out = export_ct2(args.run, args.out, quantization=args.quantization)
        elif args.target == "marian":
            from nanomt.interop.marian_export import export_marian

            out = export_marian(args.run, args.out)  # several checkpoints (an ensemble) are refused there
        elif args.target == "argos":
            from nanomt.interop.argos import export_argos

            languages, names = (args.source_language, args.target_language), (args.source_name, args.target_name)
            out = export_argos(args.run, args.out, *languages, names, args.package_version, args.quantization)
        else:
            from nanomt.interop.onnx import export_onnx

            out = export_onnx(args.run, args.out)
    except ImportError as e:  # the optional engine is missing; the message carries the install hint
        raise ValueError(str(e)) from None
    print(f"exported to {out}")


def cmd_demo(args: argparse.Namespace) -> None:
    from nanomt.cli.demo import run_demo

    run_demo(Path(args.out), steps=args.steps, pairs=args.pairs)


def cmd_serve(args: argparse.Namespace) -> None:
    check_device(args.device)
    try:
        from nanomt.serve import ModelSpec, ServeConfig, serve
    except ImportError as e:  # fastapi and uvicorn are an optional extra
        print(
            f"nanomt: error: serve needs FastAPI, uvicorn and prometheus_client ({e}); pip install 'nanomt[serve]'",
            file=sys.stderr,
        )
        sys.exit(1)
    from nanomt.decoding.glossary import read_glossary

    config = ServeConfig(
        host=args.host,
        port=args.port,
        default_beam=args.beam,
        max_batch_tokens=args.max_batch_tokens,
        batching=not args.one_lock,
        max_wait_ms=args.max_wait_ms,
        queue_size=args.queue_size,
        timeout=args.timeout,
        api_key=args.api_key,
        keys_file=args.keys_file,
        req_limit=args.req_limit,
        char_limit=args.char_limit,
        glossary=read_glossary(args.glossary) if args.glossary else (),
        pivot=args.pivot,
        max_loaded=args.max_loaded,
        device=args.device,
        int8=args.int8,
        access_log=not args.no_access_log,
        models=tuple(ModelSpec.parse(m) for m in args.checkpoints),
    )
    serve(config)


ENSEMBLE_HELP = (
    "checkpoint directory; several (sharing one tokenizer) decode as an ensemble that averages their next-token "
    "probabilities, with the first one's decoding settings"
)
INT8_HELP = (
    "int8 linear layers (CPU only), weights scaled per output row and inputs per row as in CTranslate2: faster "
    "decoding for a small BLEU cost (README, Speed)"
)
DEVICE_HELP = "where the model runs: cpu (default), cuda, cuda:N or mps"
CHECKPOINT_HELP = "checkpoint directory: a run dir, one of its checkpoints/step_N, or an averaged one"


def package_version() -> str:
    """The installed distribution's version, or the package's own when run from a source tree."""
    try:
        return importlib.metadata.version("nanomt")
    except importlib.metadata.PackageNotFoundError:
        import nanomt

        return getattr(nanomt, "__version__", "unknown")


def add_search_flags(s: argparse.ArgumentParser) -> None:
    """The flags that change a checkpoint's decoding settings (its decode section) for one command."""
    s.add_argument("--beam", type=int, default=None, help="beam size (default: the checkpoint's decode.beam_size)")
    s.add_argument(
        "--length-penalty", type=float, default=None, help="beam search's length penalty (default: the checkpoint's)"
    )
    s.add_argument("--min-len", type=int, default=None, help="no EOS before this many tokens (decode.min_len)")
    s.add_argument("--max-len-a", type=float, default=None, help="budget: int(a * source tokens + b) (decode)")
    s.add_argument("--max-len-b", type=int, default=None, help="budget: int(a * source tokens + b) (decode)")
    s.add_argument(
        "--no-repeat-ngram-size", type=int, default=None, metavar="N", help="no N-gram twice in a translation (0: off)"
    )
    s.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        metavar="P",
        help="divide the scores of tokens already written by P (> 1 discourages repeats; 1: off)",
    )
    s.add_argument(
        "--glossary",
        metavar="FILE",
        help="'source term<TAB>target term' lines: a term found in a sentence puts its target term in the translation",
    )
    s.add_argument("--max-tokens", type=int, default=None, help="source tokens per batch")


def add_serve_flags(s: argparse.ArgumentParser) -> None:
    """`nanomt serve`'s flags; their defaults are ServeConfig's."""
    from nanomt.serve.settings import ServeConfig

    d = ServeConfig()
    s.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CHECKPOINT",
        help="a run to serve, or SRC-TGT=RUN to name its language pair (else its config's); one a language pair",
    )
    s.add_argument("--host", default=d.host, help=f"address to bind (default {d.host}: this machine only)")
    s.add_argument("--port", type=int, default=d.port, help=f"port to listen on (default {d.port})")
    s.add_argument("--beam", type=int, default=d.default_beam, help="default beam size (default: each model's)")
    s.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="source tokens per decoding batch: requests waiting together share one up to this budget "
        "(default: the first model's decode.max_tokens)",
    )
    s.add_argument(
        "--max-wait-ms",
        type=float,
        default=d.max_wait_ms,
        help=f"how long the oldest waiting request may wait for others to share its batch (default {d.max_wait_ms:g})",
    )
    s.add_argument(
        "--queue-size",
        type=int,
        default=d.queue_size,
        help=f"requests that may wait; one more is answered 503 with Retry-After (default {d.queue_size})",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=d.timeout,
        help=f"seconds a request may take; past it the answer is 504, its sentences dropped (default {d.timeout:g})",
    )
    s.add_argument(
        "--api-key",
        default=None,
        help="require this key (body api_key, or the header Authorization: Bearer KEY) on /translate, /attention "
        "and /detect; default: the environment variable NANOMT_API_KEY, else no key (prefer the variable: "
        "a command line is visible to other users of the machine)",
    )
    s.add_argument(
        "--keys-file",
        metavar="FILE",
        help="API keys, hashed, with limits of their own (`python -m nanomt.serve.keys new`; docs/serving.md)",
    )
    s.add_argument("--req-limit", type=int, default=d.req_limit, help="a key's requests a minute, unless its line says")
    s.add_argument(
        "--char-limit", type=int, default=d.char_limit, help="a key's characters a request, unless its line says"
    )
    s.add_argument(
        "--one-lock",
        action="store_true",
        help="decode every request alone, never in a batch shared with others (to compare with)",
    )
    s.add_argument("--no-access-log", action="store_true", help="no JSON access log lines on stderr")
    s.add_argument(
        "--glossary", metavar="FILE", help="the default glossary ('source term<TAB>target term' lines) of every request"
    )
    s.add_argument(
        "--pivot",
        default=d.pivot,
        help=f"a pair no model translates goes through this language, with two models (default {d.pivot})",
    )
    s.add_argument(
        "--max-loaded",
        type=int,
        default=d.max_loaded,
        help="models in memory at once; past it the least recently used is unloaded (default: all, loaded at start)",
    )
    s.add_argument("--device", default=d.device, help=DEVICE_HELP)
    s.add_argument("--int8", action="store_true", help=INT8_HELP)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanomt", description="The original Transformer for machine translation.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks instead of errors")
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("train", help="train (or resume) a model from a YAML config")
    s.add_argument("config", help="YAML config, e.g. configs/demo.yaml")
    s.add_argument("--run-dir", help="run directory (default runs/<config name>); re-running resumes")
    s.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config key")
    s.add_argument(
        "--init-from", metavar="CHECKPOINT", help="start from this checkpoint's model and weights (train.init_from)"
    )
    s.set_defaults(func=cmd_train)

    s = sub.add_parser(
        "translate",
        help="translate one sentence a line (stdin to stdout by default; line by line when typed at a terminal), "
        "paragraphs (--split) or a document (--format)",
    )
    s.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=ENSEMBLE_HELP)
    s.add_argument("--input", "-i", help="input file (default stdin)")
    s.add_argument("--output", "-o", help="output file (default stdout), replaced only once every line is translated")
    s.add_argument(
        "--split",
        action="store_true",
        help="each line is a paragraph: split into sentences (URLs, e-mail addresses, code and emojis kept as they "
        "are), translated, joined into one output line",
    )
    s.add_argument(
        "--format",
        choices=sorted(set(FORMATS.values())),
        help="the input is one document of this format, translated with its formatting and written in it",
    )
    s.add_argument(
        "--buffer-size",
        type=int,
        default=BUFFER_SIZE,
        metavar="N",
        help=f"lines read, sorted and translated at a time: memory holds one chunk (default {BUFFER_SIZE:,})",
    )
    s.add_argument("--n-best", type=int, default=1, help="print the K best: 'index<TAB>score<TAB>text' lines")
    add_search_flags(s)
    s.add_argument(
        "--prefix-file",
        metavar="FILE",
        help="one target prefix a line of the input: each translation starts with its line, the model goes on",
    )
    s.add_argument(
        "--sampling",
        action="store_true",
        help="sample each translation from the model's distribution instead of beam search (as fairseq's --sampling)",
    )
    s.add_argument(
        "--sampling-topk",
        type=int,
        default=None,
        metavar="K",
        help="with --sampling: draw from the K likeliest tokens only (default 0: all)",
    )
    s.add_argument(
        "--sampling-topp",
        type=float,
        default=None,
        metavar="P",
        help="with --sampling: nucleus sampling, from the likeliest tokens that hold probability P (default 1.0: all)",
    )
    s.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="with --sampling: divide the logits by T; below 1 is closer to greedy, above 1 more varied (default 1.0)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=None,
        help="with --sampling: random seed, for samples a rerun repeats (default: different each run)",
    )
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--int8", action="store_true", help=INT8_HELP)
    s.set_defaults(func=cmd_translate)

    s = sub.add_parser("evaluate", help="sacreBLEU BLEU and chrF of a checkpoint on a test set")
    s.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=ENSEMBLE_HELP)
    s.add_argument("--src", required=True, help="source sentences, one a line")
    s.add_argument("--ref", required=True, help="reference translations, line-aligned with --src")
    add_search_flags(s)
    s.add_argument("--save-hyp", help="write the translations to this file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--int8", action="store_true", help=INT8_HELP)
    s.set_defaults(func=cmd_evaluate)

    s = sub.add_parser("average", help="average checkpoints into a complete checkpoint directory")
    s.add_argument("checkpoints", nargs="+", help="checkpoint dirs, or one run dir with --last N")
    s.add_argument("--last", type=int, default=0, help="average the last N checkpoints of a run dir")
    s.add_argument("--out", required=True, help="directory to write the averaged checkpoint to")
    s.set_defaults(func=cmd_average)

    s = sub.add_parser("plot", help="attention heatmaps, positional-encoding curves, training curves")
    plot_sub = s.add_subparsers(dest="what", required=True, metavar="WHAT")
    a = plot_sub.add_parser("attention", help="attention heatmaps of one sentence")
    a.add_argument("checkpoint", help=CHECKPOINT_HELP)
    a.add_argument("sentence", help="the source sentence to translate and plot")
    a.add_argument("--layer", type=int, default=-1, help="layer index (default: the last)")
    a.add_argument("--head", type=int, default=None, help="one head (default: a grid of every head)")
    a.add_argument(
        "--kind",
        choices=["cross", "encoder", "decoder"],
        default="cross",
        help="encoder-decoder (default), encoder self- or decoder self-attention",
    )
    a.add_argument("--beam", type=int, default=1, help="beam size of the translation plotted (default 1: greedy)")
    a.add_argument("--device", default="cpu", help=DEVICE_HELP)
    a.add_argument("-o", "--output", default="attention.png", help="image file, .png or .svg (default attention.png)")
    a = plot_sub.add_parser("positions", help="sinusoidal positional-encoding curves and table")
    a.add_argument("--d-model", type=int, default=128, help="model width of the encoding (default 128)")
    a.add_argument("--positions", type=int, default=100, help="positions plotted (default 100)")
    a.add_argument("-o", "--output", default="positions.png", help="image file, .png or .svg (default positions.png)")
    a = plot_sub.add_parser("curves", help="training curves from a run directory's metrics.jsonl")
    a.add_argument("run_dir", help="run directory with a metrics.jsonl")
    a.add_argument("-o", "--output", default="curves.png", help="image file, .png or .svg (default curves.png)")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("synth", help="write the built-in toy language pair as text files")
    s.add_argument("out_dir", help="directory for train|valid|test.src|tgt")
    s.add_argument("--pairs", type=int, default=20000, help="training pairs (valid and test have 500 each)")
    s.add_argument("--seed", type=int, default=0, help="random seed: the same seed writes the same files")
    s.set_defaults(func=cmd_synth)

    s = sub.add_parser("import", help="another toolkit's model as a nanomt run directory")
    import_sub = s.add_subparsers(dest="toolkit", required=True, metavar="TOOLKIT")
    a = import_sub.add_parser(
        "marian", help="a Hugging Face Marian directory (config.json, weights, source.spm, target.spm, vocab.json)"
    )
    a.add_argument("hf_dir", help="the directory save_pretrained wrote (e.g. a downloaded opus-mt model)")
    a.add_argument("--out", required=True, help="the run directory to write")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("export", help="a nanomt checkpoint for another runtime (CTranslate2, ONNX, Hugging Face)")
    export_sub = s.add_subparsers(dest="target", required=True, metavar="TARGET")
    e = export_sub.add_parser("ct2", help="a CTranslate2 model directory (plus tokenizer/ and nanomt.yaml)")
    e.add_argument("run", help=CHECKPOINT_HELP)
    e.add_argument("--out", required=True, help="the directory to write")
    e.add_argument(
        "--quantization",
        default=None,
        help="CTranslate2's weight type to store (int8, int8_float16, float16, ...); default float32",
    )
    e = export_sub.add_parser("onnx", help="encoder.onnx and decoder_step.onnx (key/value cache in and out)")
    e.add_argument("run", help=CHECKPOINT_HELP)
    e.add_argument("--out", required=True, help="the directory to write")
    e = export_sub.add_parser("marian", help="a Hugging Face Marian directory (MarianMTModel, MarianTokenizer)")
    e.add_argument("run", nargs="+", metavar="RUN", help=f"{CHECKPOINT_HELP}; one (several, an ensemble, are refused)")
    e.add_argument("--out", required=True, help="the directory to write (new or empty)")
    e = export_sub.add_parser("argos", help="an Argos Translate package (.argosmodel) for Argos and LibreTranslate")
    e.add_argument("run", help=CHECKPOINT_HELP)
    e.add_argument("--out", required=True, help="the .argosmodel file to write")
    e.add_argument("--source", dest="source_language", help="the source language's code (default: the run's, e.g. de)")
    e.add_argument("--target", dest="target_language", help="the target language's code (default: the run's, e.g. en)")
    e.add_argument("--source-name", default=None, help="the source language's name, e.g. German (default: its code)")
    e.add_argument("--target-name", default=None, help="the target language's name, e.g. English (default: its code)")
    e.add_argument("--package-version", default="1.0", help="the package's version (default 1.0)")
    e.add_argument("--quantization", default=None, help="CTranslate2's weight type to store (default float32)")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("demo", help="train on the toy language pair and show translations and attention")
    s.add_argument("--out", default="runs/demo", help="where the data, run and pictures go")
    s.add_argument("--steps", type=int, default=None, help="training steps (default: configs/demo.yaml)")
    s.add_argument("--pairs", type=int, default=None, help="training pairs (default: the demo's)")
    s.set_defaults(func=cmd_demo)

    s = sub.add_parser(
        "serve", help="HTTP JSON API (nanomt's and LibreTranslate's) and a web page, for one or more models"
    )
    add_serve_flags(s)
    s.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `nanomt` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    logging.getLogger("nanomt").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    from nanomt.core.checkpoint import CheckpointError
    from nanomt.training.data import CorpusError
    from nanomt.training.train import TrainingError

    try:
        args.func(args)
    except (ConfigError, CorpusError, CheckpointError, TrainingError, FileNotFoundError, ValueError) as e:
        if args.verbose:
            raise
        print(f"nanomt: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `nanomt translate ... | head`
        sys.exit(0)


if __name__ == "__main__":
    main()
