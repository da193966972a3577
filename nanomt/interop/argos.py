"""Export to an Argos Translate package (.argosmodel), which Argos Translate installs and LibreTranslate serves.

The package, as argostranslate.package reads it: a zip holding one directory with
- metadata.json: package_version, argos_version, from_code/to_code, from_name/to_name, type "translate";
- model/: the CTranslate2 model (`export_ct2`'s directory whole, so nanomt's Ct2Translator decodes it too);
- sentencepiece.model: the one SentencePiece model Argos tokenizes with, both ways;
- README.md: where it came from.

Argos encodes the source with sentencepiece.model into pieces, CTranslate2 maps pieces to ids by the model's own
vocabulary (so Marian's id tables need nothing more), and the target pieces are joined with the same
sentencepiece.model. With one shared model that is nanomt's tokenizer; with separate source and target models the
source model goes in, and joins the target's pieces as nanomt does with an id table: a piece it does not know
passes through as written. The export checks that every target piece comes out as the target model writes it,
and refuses the model otherwise. A Marian model that expects a target-language tag (>>fra<<) before the source is
refused: Argos has no way to put one there.

Argos decodes with its own settings (beam 4, its length penalty, no length budget, at least one token;
ARGOS_BEAM_SIZE=1 gives greedy search, whose tokens are nanomt's with decode.min_len 1) and splits text into
sentences with MiniSBD, fetched for the source language on first use (a package may carry its own model in minisbd/;
this export carries none).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import yaml

from nanomt.core.config import config_from_dict
from nanomt.core.languages import is_code, language_pair
from nanomt.interop.ct2 import export_ct2, read_model_config, run_files, sentencepiece_models, vocabularies

ARGOS_VERSION = "1.9.0"  # the package format of the Argos index's current packages
LANGUAGE_TAG = re.compile(r">>[^<>\s]+<<")


class ArgosExportError(ValueError):
    """A run, or an option, that an Argos Translate package cannot carry."""


def _languages(config_path: Path, source: str | None, target: str | None) -> tuple[str, str]:
    """The package's codes: the options, else the run's (language_pair of its config.yaml's data section)."""
    raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    found = language_pair(config_from_dict({"data": raw.get("data") or {}}).data) or (None, None)
    source, target = source or found[0], target or found[1]
    if not source or not target:
        raise ArgosExportError(
            "the run names no language pair (data.hf.src_lang/tgt_lang, or training files such as train.de and "
            "train.en): give the codes (--source de --target en)"
        )
    for code in (source, target):
        if not is_code(code):
            raise ArgosExportError(f"{code!r} is not a language code such as de, en or pt-BR")
    if source == target:
        raise ArgosExportError(f"the source and target languages are both {source!r}")
    return source, target


def _surface(sp, piece: str) -> str:
    """The text a piece adds after another piece once Argos has joined them (its ▁ become spaces)."""
    return sp.decode_pieces(["x", piece]).replace("\u2581", " ")[1:]


def check_tokenizer(tokenizer_dir: Path, model: dict) -> None:
    """Raise ArgosExportError unless Argos's one SentencePiece model tokenizes and joins as nanomt does."""
    src_sp, tgt_sp = sentencepiece_models(tokenizer_dir)
    src_vocab, tgt_vocab = vocabularies(tokenizer_dir)
    tags = [p for p in src_vocab if LANGUAGE_TAG.fullmatch(p)]
    if tags:
        raise ArgosExportError(
            f"the model expects a target-language tag such as {tags[0]} before each source sentence "
            f"({len(tags)} in its vocabulary); an Argos package cannot add one"
        )
    if src_sp.serialized_model_proto() == tgt_sp.serialized_model_proto():
        return
    specials = {model[k] for k in ("pad_id", "bos_id", "eos_id")}
    wrong = [p for i, p in enumerate(tgt_vocab) if i not in specials and _surface(src_sp, p) != _surface(tgt_sp, p)]
    if wrong:
        p = wrong[0]
        raise ArgosExportError(
            f"an Argos package joins target pieces with the source SentencePiece model, which writes {len(wrong)} of "
            f"the target's pieces otherwise (e.g. {p!r} as {_surface(src_sp, p)!r}, not {_surface(tgt_sp, p)!r})"
        )


def metadata(source: str, target: str, names: tuple[str, str], package_version: str) -> dict:
    """metadata.json of the package."""
    return {
        "package_version": package_version,
        "argos_version": ARGOS_VERSION,
        "code": f"translate-{source}_{target}",
        "type": "translate",
        "name": f"{names[0]} - {names[1]}",
        "from_code": source,
        "from_name": names[0],
        "to_code": target,
        "to_name": names[1],
    }


def export_argos(
    run: str | Path,
    out: str | Path,
    source: str | None = None,
    target: str | None = None,
    names: tuple[str | None, str | None] = (None, None),
    package_version: str = "1.0",
    quantization: str | None = None,
) -> Path:
    """Write an Argos Translate package (.argosmodel) of a nanomt checkpoint; codes and names default to the run's."""
    run, out = Path(run), Path(out)
    if out.is_dir():
        raise ArgosExportError(f"{out} is a directory; --out names the .argosmodel file to write")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", package_version):
        raise ArgosExportError(f"package version {package_version!r}: use numbers and dots, such as 1.0")
    config_path, tokenizer_dir = run_files(run)
    source, target = _languages(config_path, source, target)
    names = (names[0] or source, names[1] or target)
    model, _ = read_model_config(config_path)
    check_tokenizer(tokenizer_dir, model)
    folder = f"translate-{source}_{target}-{package_version.replace('.', '_')}"
    with tempfile.TemporaryDirectory(prefix="argos-") as tmp:
        root = Path(tmp) / folder
        export_ct2(run, root / "model", quantization=quantization)
        src_model = next(p for p in ("spm.model", "src.model") if (tokenizer_dir / p).is_file())
        shutil.copyfile(tokenizer_dir / src_model, root / "sentencepiece.model")
        meta = metadata(source, target, names, package_version)
        (root / "metadata.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (root / "README.md").write_text(_readme(meta), encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for path in sorted(root.rglob("*")):
                z.write(path, path.relative_to(tmp).as_posix())
        os.replace(partial, out)  # a crash never leaves a half-written package under the final name
    return out


def _readme(meta: dict) -> str:
    """README.md of the package (Argos shows it as the package's description)."""
    return (
        f"# {meta['from_name']} to {meta['to_name']}\n\n"
        "A Transformer trained or imported with nanomt, exported with `nanomt export argos`: a CTranslate2 model "
        "(model/) and its SentencePiece model (sentencepiece.model).\n"
    )
