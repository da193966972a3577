"""Sequence-level knowledge distillation (Kim & Rush 2016): a student trained on its teacher's translations.

    distill(teachers, sources, run_dir, buffer_size=2000, student="fast")

1. The teacher (one run, an ensemble of runs sharing a tokenizer, or an imported opus-mt model) translates the source
   text into run_dir/distill/ (nanomt.training.teacher: cached, resumable).
2. The student's config: the teacher's, with the student's shape (a preset, or a config file), its data
   the sources and their translations (and, if given, original pairs weighted as fine-tuning's corpora are), its
   tokenizer the teacher's.
3. The student's first weights (run_dir/distill/init): every teacher tensor whose name and shape the student shares
   (none with init="none"), the rest drawn from train.seed.
4. Training in run_dir, from those weights: the result is a run like any other (translate, evaluate, serve, export).
Every stage resumes: a killed distill started again finishes the translations it lacks and resumes training.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
import yaml

from nanomt.core import checkpoint as ckpt
from nanomt.core.config import (
    TOKENIZER_KEYS,
    Config,
    ConfigError,
    ModelConfig,
    config_from_dict,
    load_config,
    to_dict,
)
from nanomt.core.decoding import Decoding
from nanomt.core.model import Transformer
from nanomt.core.tokenizer import Tokenizer
from nanomt.training.data import check_files, check_split
from nanomt.training.data import corpora as data_corpora
from nanomt.training.errors import TrainingError
from nanomt.training.prepare import check_run_dir, has_split, with_tokenizer
from nanomt.training.teacher import teacher_translations, translations_path
from nanomt.training.train import train

log = logging.getLogger("nanomt")

# The fast student: a deep encoder and a one-layer decoder (Kasai et al. 2021), since decoding time is almost all
# decoder; the teacher's norm placement, width and vocabulary, so that its tensors start the student and every
# export (Marian's is post-norm only) takes it.
FAST_ENCODER_LAYERS = 6
STUDENTS = ("fast", "same")


def student_shape(preset: str, teacher: ModelConfig) -> dict:
    """The changes a preset makes to the teacher's model section ("same": none)."""
    if preset == "same":
        return {}
    return {"n_encoder_layers": max(teacher.n_encoder_layers, FAST_ENCODER_LAYERS), "n_decoder_layers": 1}


DISTILL_DIR = "distill"


def check_tokenizers(teachers: list[Path]) -> None:
    """Refuse teachers that do not share a tokenizer (an ensemble's members and the student read the same ids)."""
    prints = [Tokenizer.load(ckpt.find_run_files(t)[1]).fingerprint() for t in teachers]
    for teacher, fp in zip(teachers[1:], prints[1:]):
        if fp != prints[0]:
            raise TrainingError(
                f"{teacher}: its tokenizer differs from {teachers[0]}'s; the teachers of one student share a tokenizer"
            )


def base_raw(teacher_cfg: Config, student: str | None, config: Path | None) -> dict:
    """The student's config before its data: a config file's, or the teacher's with a preset's model changes."""
    if config is None:
        raw = to_dict(teacher_cfg)
        raw["model"].update(student_shape(student or "fast", teacher_cfg.model))
        raw["train"]["init_from"] = None
        return raw
    if student is not None:
        raise TrainingError("give the student's shape as --student or as --config, not both")
    load_config(config)  # a missing file, bad YAML or an unknown key: its one-line error
    raw = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    theirs = teacher_cfg.data
    for key in TOKENIZER_KEYS:
        given = (raw.get("data") or {}).get(key)
        if given is not None and given != getattr(theirs, key):
            raise TrainingError(
                f"{config}: data.{key} {given!r}, but the teacher's tokenizer has {getattr(theirs, key)!r}: a student "
                "shares its teacher's tokenizer (leave data's tokenizer keys out)"
            )
    return raw


def student_config(
    teacher: Path,
    corpora: list[dict],
    valid: dict | None,
    student: str | None = None,
    config: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Config:
    """The student's resolved config: its shape, the distilled (and original) corpora, the teacher's tokenizer."""
    config_path, tokenizer_dir = ckpt.find_run_files(teacher)
    teacher_cfg = load_config(config_path)
    raw = base_raw(teacher_cfg, student, config)
    data = {k: v for k, v in (raw.get("data") or {}).items() if k not in ("train", "valid", "test", "hf")}
    data.update({key: to_dict(getattr(teacher_cfg.data, key)) for key in TOKENIZER_KEYS})
    data["train"] = corpora
    teacher_valid = teacher_cfg.data.valid
    if valid is None and teacher_valid.src and teacher_valid.tgt:
        if Path(teacher_valid.src).is_file() and Path(teacher_valid.tgt).is_file():
            valid = {"src": teacher_valid.src, "tgt": teacher_valid.tgt}
        else:
            log.warning("the teacher's validation files (%s) are not here: the student trains without validation "
                        "(give --valid SRC TGT)", teacher_valid.src)  # fmt: skip
    if valid is not None:
        data["valid"] = valid
    raw["data"] = data
    try:
        cfg = config_from_dict(raw, overrides)
    except ConfigError as e:
        raise TrainingError(f"the student's config: {e}") from None
    if cfg.train.init_from:
        raise TrainingError("train.init_from: a student starts from its teacher (--init), not from a checkpoint")
    try:
        return with_tokenizer(cfg, Tokenizer.load(tokenizer_dir))
    except (TrainingError, ValueError) as e:  # ours, or the model's own check of its vocabulary sizes
        raise TrainingError(f"the student cannot use the teacher's tokenizer: {e}") from None


def init_student(teacher: Path, cfg: Config, out: Path, from_teacher: bool = True) -> Path:
    """A checkpoint of the untrained student at `out`: the teacher's tensors where the student has them under the
    same name in the same shape (unless not `from_teacher`), the others drawn from train.seed as training draws them."""
    torch.manual_seed(cfg.train.seed)
    model = Transformer(cfg.model)
    own = model.state_dict()
    theirs = ckpt.read_weights(ckpt.checkpoint_weights(teacher))
    taken = {name: t for name, t in theirs.items() if from_teacher and name in own and own[name].shape == t.shape}
    model.load_state_dict(taken, strict=False)  # a tied tensor's aliases share the storage filled here
    log.info("the student starts from %d of its %d tensors in the teacher's", len(taken), len(ckpt.model_state(model)))
    return ckpt.write_checkpoint_dir(out, cfg, ckpt.find_run_files(teacher)[1], ckpt.model_state(model))


def check_student_dir(run_dir: Path, teachers: list[Path]) -> None:
    """The student's run directory holds no teacher's run and lies inside none (where it would resume a teacher, or
    write into one), and is a directory training may write (check_run_dir)."""
    student = run_dir.resolve()
    for teacher in teachers:
        root = ckpt.find_run_files(teacher)[0].parent.resolve()
        if student == root:
            where = "is"
        elif student in root.parents:
            where = "holds"
        elif root in student.parents:
            where = "is inside"
        else:
            continue
        raise TrainingError(f"--run-dir {run_dir} {where} the run of teacher {teacher}; give the student its own")
    check_run_dir(run_dir)


def distill(
    teachers: list[str | Path],
    sources: list[str | Path],
    run_dir: str | Path,
    buffer_size: int,
    student: str | None = None,
    config: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    pairs: list[tuple[str, str]] = (),
    pairs_weight: float = 1.0,
    valid: tuple[str, str] | None = None,
    decoding: Decoding | None = None,
    int8: bool = False,
    device: str = "cpu",
    init: str = "teacher",
) -> Path:
    """Translate `sources` with the teachers, `buffer_size` lines at a time (decoding: the first's decode section
    where None), then train the student in run_dir on them; returns run_dir. Started again, it goes on where it
    stopped."""
    teachers = [Path(t) for t in teachers]
    run_dir = Path(run_dir)
    if not teachers:
        raise TrainingError("no teacher given")
    check_student_dir(run_dir, teachers)
    check_tokenizers(teachers)
    sources = [Path(s) for s in sources]
    out_dir = run_dir / DISTILL_DIR
    # The student's config first: a config that cannot be is refused before hours of translating.
    corpora = [{"src": str(s), "tgt": str(translations_path(out_dir, i, s))} for i, s in enumerate(sources)]
    corpora += [{"src": str(s), "tgt": str(t), "weight": pairs_weight} for s, t in pairs]
    valid_split = {"src": str(valid[0]), "tgt": str(valid[1])} if valid else None
    cfg = student_config(teachers[0], corpora, valid_split, student, config, overrides)
    for where, split in data_corpora(cfg.data, "train")[len(sources) :]:  # the --pairs: read, not translated
        check_split(split, where)
    if has_split(cfg, "valid"):
        check_files(cfg.data, "valid")
    teacher_translations(teachers, sources, out_dir, buffer_size, decoding, int8, device)
    init_dir = out_dir / "init"
    if not ckpt.step_dirs(run_dir) and not (init_dir / ckpt.WEIGHTS).is_file():
        init_student(teachers[0], cfg, init_dir, from_teacher=init == "teacher")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=str(init_dir)))
    return train(cfg, run_dir)
