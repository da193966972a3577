"""The `nanomt` command's arguments: every subcommand's flags and the module that runs it.

Parsing and `--help` import no torch and no server code: this module imports the standard library and
nanomt.serve.settings (standard library only), and a subcommand's module is imported when it runs (`handler`).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from nanomt.core.decoding import Decoding, Sampling
from nanomt.core.settings import default_of, fields_at, reader
from nanomt.documents import formats
from nanomt.serve.settings import ServeConfig

BUFFER_SIZE = 10_000  # lines a chunk: the default of `nanomt translate --buffer-size`
DISTILL_BUFFER = 2_000  # `nanomt distill --buffer-size`: each chunk is flushed to disk before the next
FILE_FORMATS = formats.NAMES  # `nanomt translate --format`: the one table of formats (standard library only)

ENSEMBLE_HELP = (
    "checkpoint directory; several (sharing one tokenizer) decode as an ensemble that averages their next-token "
    "probabilities, with the first one's decoding settings"
)
CONFIDENCE_HELP = (
    "write 'translation<TAB>confidence' lines: the model's estimate of the translation's sentence chrF / 100 "
    "(the raw score, the mean log-probability of its tokens, where the checkpoint has no calibration)"
)
INT8_HELP = (
    "int8 linear layers (CPU only), weights scaled per output row and inputs per row as in CTranslate2: faster "
    "decoding for a small BLEU cost (README, Speed)"
)
DEVICE_HELP = "where the model runs: cpu (default), cuda, cuda:N or mps"
CHECKPOINT_HELP = "checkpoint directory: a run dir, one of its checkpoints/step_N, or an averaged one"


def package_version() -> str:
    """The installed distribution's version, or the package's own when run from a source tree."""
    import importlib.metadata

    try:
        return importlib.metadata.version("nanomt")
    except importlib.metadata.PackageNotFoundError:
        import nanomt

        return getattr(nanomt, "__version__", "unknown")


class VersionAction(argparse.Action):
    """--version: the version looked up only when asked for (importlib.metadata is slow to import)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {package_version()}")
        parser.exit()


def command(parser: argparse.ArgumentParser, handler: str) -> None:
    """The function that runs the subcommand, as "module:function" under nanomt.cli, imported when it runs."""
    parser.set_defaults(handler=handler)


def add_decoding_flags(s: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The flags that change a checkpoint's decoding settings for one command: one a Decoding field (and --sampling's
    options, one a Sampling field) that the flag door takes, unless skipped; not given, the checkpoint's."""
    for names, kwargs in setting_flags(Decoding, given_only=True, skip=skip):
        s.add_argument(*names, **kwargs)
    if "sampling" not in skip:
        for names, kwargs in setting_flags(Sampling, given_only=True):
            s.add_argument(*names, **{**kwargs, "help": f"with --sampling: {kwargs['help']}"})
    s.add_argument("--max-tokens", type=int, default=None, help="source tokens per batch (default: decode.max_tokens)")


def setting_flags(settings: type, given_only: bool = False, skip: tuple[str, ...] = ()) -> list[tuple[list[str], dict]]:
    """The arguments (names, add_argument's keywords) of a settings dataclass's fields made with
    nanomt.core.settings.setting that the flag door takes, in field order; a field without that metadata has none.
    `given_only`: a flag left out is None (the value comes from elsewhere: a checkpoint's decode section)."""
    hints = typing.get_type_hints(settings)
    flags = []
    for f in fields_at(settings, "flag"):
        if f.name in skip:
            continue
        meta = f.metadata
        kwargs = {"help": flag_help(f) if given_only else meta["help"]}
        if meta.get("metavar"):
            kwargs["metavar"] = meta["metavar"]
        if meta.get("flag") == "":  # the positional argument: one or more values
            flags.append(([f.name], {**kwargs, "nargs": "+"}))
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        default = default_of(f)
        kwargs["dest"] = f.name
        kind = hints[f.name]
        if kind is bool or f.name == "sampling":  # a switch (--sampling: its options are Sampling's flags)
            kwargs["action"] = "store_false" if default is True else "store_true"
            flags.append(([flag], {**kwargs, "default": None} if given_only else kwargs))
            continue
        kwargs.setdefault("metavar", flag[2:].replace("-", "_").upper())  # --beam BEAM, not DEFAULT_BEAM
        if meta.get("read") is not None:
            kwargs["default"] = None  # not given: the field's default, unread
        else:
            kinds = [t for t in typing.get_args(kind) if t is not type(None)] or [kind]
            kwargs.update(type=kinds[0], default=None if given_only else default)
        flags.append(([flag], kwargs))
    return flags


def flag_help(f: dataclasses.Field) -> str:
    """A decoding flag's help: its setting's, and where its value comes from when the flag is left out."""
    if "config" not in f.metadata["absent"]:
        return f"{f.metadata['help']} (default: the checkpoint's decode.{f.name})"
    return f.metadata["help"]


def settings_from_args(settings: type, args: argparse.Namespace):
    """An instance of a settings dataclass from the arguments `setting_flags` made (the others at their defaults)."""
    values = {}
    for f in fields_at(settings, "flag"):
        value, read = getattr(args, f.name), reader(f)
        if read is not None:
            if value is None:
                continue
            value = read(value)
        values[f.name] = value
    return settings(**values)


def add_train(sub) -> None:
    """`nanomt train`."""
    s = sub.add_parser("train", help="train (or resume) a model from a YAML config")
    s.add_argument("config", help="YAML config, e.g. configs/demo.yaml")
    s.add_argument("--run-dir", help="run directory (default runs/<config name>); re-running resumes")
    s.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config key")
    s.add_argument(
        "--init-from", metavar="CHECKPOINT", help="start from this checkpoint's model and weights (train.init_from)"
    )
    command(s, "training:train")


def add_distill(sub) -> None:
    """`nanomt distill`."""
    s = sub.add_parser(
        "distill",
        help="train a student on a teacher's translations of source text (sequence-level knowledge distillation): "
        "the translations are cached in the student's run and every stage resumes",
    )
    s.add_argument(
        "teachers",
        nargs="+",
        metavar="TEACHER",
        help="the teacher: a run or checkpoint (an imported opus-mt model too), or several: an ensemble",
    )
    s.add_argument(
        "--src",
        nargs="+",
        required=True,
        metavar="FILE",
        help="source text to translate and learn from, one sentence a line (the training corpus's source "
        "side, or text of the domain)",
    )
    s.add_argument("--run-dir", required=True, help="the student's run directory; re-running resumes")
    shape = s.add_mutually_exclusive_group()
    shape.add_argument(
        "--student",
        choices=("fast", "same"),
        help="fast (the default): the teacher's model with a 1-layer decoder and a 6-layer encoder (the teacher's "
        "if deeper); same: the teacher's shape",
    )
    shape.add_argument("--config", help="a YAML config for the student (its tokenizer is the teacher's)")
    s.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a student config key")
    s.add_argument(
        "--pairs",
        nargs=2,
        action="append",
        default=[],
        metavar=("SRC", "TGT"),
        help="original parallel data mixed in with the teacher's translations (repeatable)",
    )
    s.add_argument(
        "--pairs-weight",
        type=float,
        default=1.0,
        metavar="W",
        help="how often a sentence of --pairs is drawn against one of the translations (default 1)",
    )
    s.add_argument(
        "--valid",
        nargs=2,
        metavar=("SRC", "TGT"),
        help="validation pairs (default: the teacher's, where its files are here)",
    )
    s.add_argument(
        "--init",
        choices=("teacher", "none"),
        default="teacher",
        help="the student's first weights: the teacher's tensors wherever the student has one of the same name and "
        "shape (teacher, the default), or drawn from train.seed alone (none)",
    )
    add_decoding_flags(s, skip=("n_best",))  # how the teacher translates; its checkpoint's settings by default
    s.add_argument("--device", default="cpu", help=DEVICE_HELP + " (the teacher's translating)")
    s.add_argument("--int8", action="store_true", help="the teacher translates with int8 linear layers (CPU)")
    s.add_argument(
        "--buffer-size",
        type=int,
        default=DISTILL_BUFFER,
        metavar="N",
        help="lines sorted, translated and written at a time: the most a killed distill translates again "
        f"(default {DISTILL_BUFFER:,})",
    )
    command(s, "training:distill")


def add_translate(sub) -> None:
    """`nanomt translate`."""
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
        choices=FILE_FORMATS,
        help="the input is one document of this format, translated with its formatting and written in it",
    )
    s.add_argument(
        "--buffer-size",
        type=int,
        default=BUFFER_SIZE,
        metavar="N",
        help=f"lines read, sorted and translated at a time: memory holds one chunk (default {BUFFER_SIZE:,})",
    )
    s.add_argument("--confidence", action="store_true", help=CONFIDENCE_HELP)
    add_decoding_flags(s)
    s.add_argument(
        "--prefix-file",
        metavar="FILE",
        help="one target prefix a line of the input: each translation starts with its line, the model goes on",
    )
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--int8", action="store_true", help=INT8_HELP)
    command(s, "translate:translate")


def add_evaluate(sub) -> None:
    """`nanomt evaluate`."""
    s = sub.add_parser("evaluate", help="sacreBLEU BLEU and chrF of a checkpoint on a test set")
    s.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=ENSEMBLE_HELP)
    s.add_argument("--src", required=True, help="source sentences, one a line")
    s.add_argument("--ref", required=True, help="reference translations, line-aligned with --src")
    add_decoding_flags(s, skip=("n_best", "sampling"))  # a score is of each sentence's one best translation
    s.add_argument("--save-hyp", help="write the translations to this file")
    s.add_argument(
        "--confidence",
        action="store_true",
        help="also how well each sentence's confidence (and raw score) follows its sentence chrF: Pearson, Spearman, "
        "mean absolute error (the confidence's work is then part of the time)",
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--int8", action="store_true", help=INT8_HELP)
    command(s, "evaluate:evaluate")


def add_calibrate(sub) -> None:
    """`nanomt calibrate`."""
    s = sub.add_parser(
        "calibrate",
        help="fit a checkpoint's confidence (its estimate of each translation's sentence chrF) on sentences with "
        "references, into calibration.json beside its weights (which are not changed)",
    )
    s.add_argument("checkpoint", metavar="CHECKPOINT", help="a run, checkpoints/step_N, averaged or imported model")
    s.add_argument("--src", required=True, help="source sentences, one a line (at least 100; a validation set)")
    s.add_argument("--ref", required=True, help="reference translations, line-aligned with --src")
    s.add_argument("--beam-size", type=int, help="the beam it will translate with (default: the checkpoint's)")
    s.add_argument("--max-tokens", type=int, help="source tokens a batch (default: the checkpoint's)")
    command(s, "evaluate:calibrate")


def add_shortlist(sub) -> None:
    """`nanomt shortlist`."""
    s = sub.add_parser(
        "shortlist",
        help="a checkpoint's vocabulary shortlist (the target pieces each source piece is seen translated into), "
        "learned from a parallel corpus, into shortlist.json beside its weights: --shortlist decodes over it",
    )
    s.add_argument("checkpoint", metavar="CHECKPOINT", help="a run, checkpoints/step_N, averaged or imported model")
    s.add_argument("--src", required=True, help="source sentences, one a line (the training data)")
    s.add_argument("--tgt", required=True, help="their translations, line-aligned with --src")
    s.add_argument("--top", type=int, default=20, help="target pieces kept for each source piece (default 20)")
    s.add_argument("--frequent", type=int, default=100, help="most frequent target pieces always kept (default 100)")
    command(s, "training:shortlist")


def add_average(sub) -> None:
    """`nanomt average`."""
    s = sub.add_parser("average", help="average checkpoints into a complete checkpoint directory")
    s.add_argument("checkpoints", nargs="+", help="checkpoint dirs, or one run dir with --last N")
    s.add_argument("--last", type=int, default=0, help="average the last N checkpoints of a run dir")
    s.add_argument("--out", required=True, help="directory to write the averaged checkpoint to")
    command(s, "training:average")


def add_plot(sub) -> None:
    """`nanomt plot`."""
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
    command(s, "plot:plot")


def add_synth(sub) -> None:
    """`nanomt synth`."""
    s = sub.add_parser("synth", help="write the built-in toy language pair as text files")
    s.add_argument("out_dir", help="directory for train|valid|test.src|tgt")
    s.add_argument("--pairs", type=int, default=20000, help="training pairs (valid and test have 500 each)")
    s.add_argument("--seed", type=int, default=0, help="random seed: the same seed writes the same files")
    s.add_argument(
        "--multilingual",
        action="store_true",
        help="three toy languages (xa, xb, xc) in all six directions, --pairs each: train.xa-xb.xa, ...",
    )
    command(s, "training:synth")


def add_import(sub) -> None:
    """`nanomt import`."""
    s = sub.add_parser("import", help="another toolkit's model as a nanomt run directory")
    import_sub = s.add_subparsers(dest="toolkit", required=True, metavar="TOOLKIT")
    a = import_sub.add_parser(
        "marian", help="a Hugging Face Marian directory (config.json, weights, source.spm, target.spm, vocab.json)"
    )
    a.add_argument("hf_dir", help="the directory save_pretrained wrote (e.g. a downloaded opus-mt model)")
    a.add_argument("--out", required=True, help="the run directory to write")
    command(s, "interop:import_model")


def add_export(sub) -> None:
    """`nanomt export`."""
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
    command(s, "interop:export")


def add_demo(sub) -> None:
    """`nanomt demo`."""
    s = sub.add_parser("demo", help="train on the toy language pair and show translations and attention")
    s.add_argument("--out", help="where the data, run and pictures go (default: runs/demo, runs/demo_multilingual)")
    s.add_argument("--steps", type=int, default=None, help="training steps (default: configs/demo.yaml's)")
    s.add_argument("--pairs", type=int, default=None, help="training pairs (of each direction with --multilingual)")
    s.add_argument(
        "--multilingual",
        action="store_true",
        help="one model for three toy languages in all six directions, asked for each by its >>code<< token",
    )
    command(s, "demo:demo")


def add_serve(sub) -> None:
    """`nanomt serve`."""
    s = sub.add_parser(
        "serve", help="HTTP JSON API (nanomt's and LibreTranslate's) and a web page, for one or more models"
    )
    for names, kwargs in setting_flags(ServeConfig):  # a ServeConfig field made with `setting` is a flag
        s.add_argument(*names, **kwargs)
    command(s, "serve:serve")


def add_memory(sub) -> None:
    """`nanomt memory`."""
    s = sub.add_parser(
        "memory", help="a server's translation memory (corrections sent to /suggest): review, export, import"
    )
    actions = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    store_help = "the server's --store: sqlite:///PATH or redis://HOST:PORT/DB"

    def action(name: str, help_: str, pair: bool = True) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help_)
        if name != "import":
            a.add_argument("store", metavar="STORE", help=store_help)
        a.add_argument("--namespace", default="nanomt", help="the server's --store-namespace (default %(default)s)")
        if pair:
            a.add_argument("--pair", default=None, metavar="SRC-TGT", help="only this language pair's")
        command(a, "memory:memory")
        return a

    e = action("export", "the served corrections as a corpus (TSV: data.train takes it) or TMX")
    e.add_argument("--format", choices=("tsv", "tmx"), default="tsv", help="tsv (default) or tmx")
    e.add_argument("--out", default=None, help="the file to write, whole or not at all (default: stdout)")
    i = action("import", "the translation units of a TMX file, served as corrections")
    i.add_argument("file", metavar="FILE.tmx", help="a TMX file")
    i.add_argument("--store", required=True, metavar="URL", help=store_help)
    for name, what in (("pending", "the suggestions awaiting review"), ("list", "the served corrections")):
        action(name, f"{what}: id, pair, sender, source, translation (tab-separated)").add_argument(
            "--json", action="store_true", help="one JSON object a line"
        )
    for name, what in (
        ("approve", "serve these suggestions (ids from pending)"),
        ("reject", "drop these suggestions (ids from pending)"),
        ("delete", "stop serving these corrections (ids from list)"),
    ):
        action(name, what, pair=False).add_argument("ids", nargs="+", metavar="ID", help="an entry's id")


COMMANDS = (
    add_train,
    add_distill,
    add_translate,
    add_evaluate,
    add_calibrate,
    add_shortlist,
    add_average,
    add_plot,
    add_synth,
    add_import,
    add_export,
    add_demo,
    add_serve,
    add_memory,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nanomt", description="The original Transformer for machine translation.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks instead of errors")
    p.add_argument("--version", action=VersionAction, help="show the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:  # in the order --help lists them
        add(sub)
    return p
