"""Checkpoint directories: safetensors weights + YAML config + tokenizer + trainer state, written atomically."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import random
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from nanomt.core.config import RUN_CONFIG, RUN_TOKENIZER, Config, ConfigError, checkpoint_root, load_config, save_config
from nanomt.core.model import Transformer
from nanomt.core.tokenizer import Tokenizer

WEIGHTS = "model.safetensors"
CONFIG, TOKENIZER = RUN_CONFIG, RUN_TOKENIZER
CHECKPOINTS = "checkpoints"  # a training run's step_N directories; `nanomt train` makes it first
TRAINER_STATE = "trainer.pt"
STEP_DIR = re.compile(r"^step_(\d+)$")
# Metadata key of model.safetensors: the tokenizer the weights were trained with (absent in older files).
FINGERPRINT = "tokenizer_fingerprint"

log = logging.getLogger("nanomt")


class CheckpointError(ValueError):
    """A checkpoint directory that is missing pieces or does not fit its config."""


def _atomic_replace(tmp: Path, final: Path) -> None:
    """Rename tmp over final; a crash leaves either the old or the new file, never half of one."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)


def model_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's tensors, each shared (tied) tensor stored once, contiguous, on the CPU."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # tied output projection / shared embeddings
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().to("cpu").contiguous()
    return state


def save_weights(
    model_or_state: Transformer | dict[str, torch.Tensor], path: str | Path, tokenizer_fingerprint: str | None = None
) -> None:
    """Write weights as safetensors through a temporary file, with the fingerprint of their tokenizer."""
    state = model_or_state if isinstance(model_or_state, dict) else model_state(model_or_state)
    path = Path(path)
    if tokenizer_fingerprint is None:  # the tokenizer of the checkpoint the file is written into, if any
        tokenizer_fingerprint = _checkpoint_fingerprint(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    # safetensors writes its file 0600; a file made here gets the umask's mode, like the run's other files.
    tmp.unlink(missing_ok=True)
    tmp.touch()
    mode = stat.S_IMODE(tmp.stat().st_mode)
    save_file(state, str(tmp), metadata={FINGERPRINT: tokenizer_fingerprint} if tokenizer_fingerprint else None)
    os.chmod(tmp, mode)
    _atomic_replace(tmp, path)


def _checkpoint_fingerprint(directory: Path) -> str | None:
    """Fingerprint of the tokenizer that load_checkpoint would pair with weights in `directory`, if it has one."""
    try:
        return Tokenizer.load(find_run_files(directory)[1]).fingerprint()
    except (CheckpointError, FileNotFoundError, ValueError):
        return None


def weights_fingerprint(path: str | Path) -> str | None:
    """The tokenizer fingerprint stored with safetensors weights (None for files written before it was)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get(FINGERPRINT)
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read weights: {e}") from None


def file_sha256(path: str | Path, prefix: bytes = b"") -> str:
    """The SHA-256 of `prefix` and then a file's bytes, read a MiB at a time."""
    h = hashlib.sha256(prefix)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file, with a clear error if it is missing or damaged."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read weights: {e}") from None


def load_weights(model: Transformer, path: str | Path) -> None:
    """Load safetensors weights into `model`; a vocabulary or shape mismatch is a clear error."""
    state = read_weights(path)
    own = model.state_dict()
    for name, tensor in state.items():
        if name in own and own[name].shape != tensor.shape:
            raise CheckpointError(
                f"{path}: {name} has shape {tuple(tensor.shape)}, the model expects {tuple(own[name].shape)} "
                "(a checkpoint from another vocabulary or model size?)"
            )
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied tensors are stored once; their aliases are filled by the load of the tensor they share.
    tied = {n for n in missing if own[n].data_ptr() in {own[m].data_ptr() for m in state}}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the config (missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)})"
        )


def find_run_files(path: str | Path) -> tuple[Path, Path]:
    """Config file and tokenizer dir of a checkpoint: in `path`, or in the run dir above checkpoints/step_N."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {path}")
    root = checkpoint_root(path)
    if root is None:
        raise CheckpointError(f"{path}: not a checkpoint (needs {CONFIG}, {TOKENIZER}/ and {WEIGHTS})")
    return root / CONFIG, root / TOKENIZER


def checkpoint_weights(path: str | Path, quiet: bool = False) -> Path:
    """A checkpoint's weights file; a run stopped before its first evaluation falls back on its newest step_N
    (with a warning unless `quiet`: the caller has said it already)."""
    path = Path(path)
    if (path / WEIGHTS).is_file():
        return path / WEIGHTS
    steps = step_dirs(path)
    if not steps:
        raise CheckpointError(f"{path}: no {WEIGHTS}, and no checkpoints/step_N/ to fall back on")
    newest = steps[-1][1] / WEIGHTS
    if not quiet:
        log.warning("%s has no %s (the run stopped before its first evaluation): loading %s", path, WEIGHTS, newest)
    return newest


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Config, Tokenizer]:
    """Model (eval mode), config and tokenizer from any checkpoint directory."""
    config_path, tokenizer_dir = find_run_files(path)
    weights = checkpoint_weights(path)
    try:
        cfg = load_config(config_path)
    except ConfigError as e:
        raise CheckpointError(f"{config_path}: {e}") from None
    tokenizer = Tokenizer.load(tokenizer_dir)
    if (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size) != (
        cfg.model.src_vocab_size,
        cfg.model.tgt_vocab_size,
    ):
        raise CheckpointError(
            f"{path}: tokenizer vocabulary ({tokenizer.src_vocab_size}/{tokenizer.tgt_vocab_size}) does not match "
            f"the model ({cfg.model.src_vocab_size}/{cfg.model.tgt_vocab_size})"
        )
    try:
        tokenizer.check_model_ids(cfg.model)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    # Equal sizes are not enough: another run's tokenizer of the same size turns the model's output into nonsense.
    stored, actual = weights_fingerprint(weights), tokenizer.fingerprint()
    if stored is not None and stored != actual:
        raise CheckpointError(
            f"{weights} was trained with tokenizer {stored[:12]}, but {tokenizer_dir} holds tokenizer {actual[:12]} "
            "(a tokenizer from another run?)"
        )
    model = Transformer(cfg.model, init=False)  # every weight is loaded next (load_weights checks)
    load_weights(model, weights)
    return model.to(device).eval(), cfg, tokenizer


def check_new_dir(out: str | Path, flag: str | None = None, error: type[ValueError] = CheckpointError) -> Path:
    """A directory a whole model or export is written into: new, or empty. One holding anything (a run's model,
    another export), or a file of that name, is refused (`error`, naming `flag` where a command line gave it) before
    anything is written, so that nothing there is replaced or mixed in (as CTranslate2's converters refuse one
    without --force)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        named = f"{flag} {out}" if flag else str(out)
        raise error(f"{named}: already exists and is not empty; give a new or empty directory")
    return out


def write_checkpoint_dir(out: str | Path, cfg: Config, tokenizer_dir: Path, state: dict[str, torch.Tensor]) -> Path:
    """A complete, self-contained checkpoint directory (config, tokenizer, weights)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / CONFIG)
    if (out / TOKENIZER).resolve() != tokenizer_dir.resolve():
        shutil.copytree(tokenizer_dir, out / TOKENIZER, dirs_exist_ok=True)
    save_weights(state, out / WEIGHTS, Tokenizer.load(out / TOKENIZER).fingerprint())
    return out


def step_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints/step_N directories of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_DIR.match(d.name)
            if m and (d / WEIGHTS).is_file() and (d / TRAINER_STATE).is_file():
                found.append((int(m.group(1)), d))
    return sorted(found)


def save_training_checkpoint(run_dir: Path, step: int, model: Transformer, trainer_state: dict, keep_last: int) -> Path:
    """Write checkpoints/step_N under a temporary name, rename it into place, then prune old ones."""
    root = run_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_weights(model, tmp / WEIGHTS)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in step_dirs(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_trainer_state(step_dir: Path) -> dict:
    """Trainer state saved by save_training_checkpoint; never unpickles arbitrary objects."""
    return torch.load(step_dir / TRAINER_STATE, map_location="cpu", weights_only=True)


def average_checkpoints(paths: list[str | Path], out: str | Path) -> Path:
    """Average the weights of several checkpoints of one model (as the paper does) into a new checkpoint dir."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    config_path, tokenizer_dir = find_run_files(paths[0])
    cfg = load_config(config_path)
    for p in paths[1:]:
        other = load_config(find_run_files(p)[0])
        if other.model != cfg.model:
            raise CheckpointError(f"{p} has another model config than {paths[0]}; cannot average them")
    total: dict[str, torch.Tensor] = {}
    for p in paths:
        state = read_weights(p / WEIGHTS)
        if total and state.keys() != total.keys():
            raise CheckpointError(f"{p} holds other tensors than {paths[0]}")
        for name, tensor in state.items():
            total[name] = total[name] + tensor.double() if name in total else tensor.double()
    ref = read_weights(paths[0] / WEIGHTS)
    averaged = {name: (t / len(paths)).to(ref[name].dtype) for name, t in total.items()}
    return write_checkpoint_dir(out, cfg, tokenizer_dir, averaged)


# ---------------------------------------------------------------------------------------------------------
# Trainer state: what a resumed run needs beyond the weights. Written and read here only.
# ---------------------------------------------------------------------------------------------------------


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as plain tensors/ints (loadable with weights_only=True)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():  # this process's GPU only: under DDP each rank draws on its own
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state saved."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def all_rng_states(group=None) -> list[dict] | None:
    """Every rank's RNG states, in rank order, on rank 0 (None on the others); collective under DDP."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [rng_state()]
    states = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rng_state(), states, dst=0, group=group)
    return states


@dataclass
class TrainState:
    """The position of a run: steps, the epoch and batch within it, the clock, the best evaluation so far."""

    step: int = 0
    epoch: int = 0
    batch_pos: int = 0  # batches of the epoch already trained on
    elapsed: float = 0.0  # seconds of training and evaluation, across resumes
    best_score: float = -math.inf  # validation BLEU, or minus the validation loss where there is no BLEU

    def save(
        self,
        run_dir: Path,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        keep_last: int,
        group=None,
    ) -> Path | None:
        """checkpoints/step_N: the weights, optimizer, loss scaler, this state and every rank's RNG states.

        Collective under DDP (every rank calls it, rank 0 writes); returns the directory on rank 0, else None.
        """
        rngs = all_rng_states(group)
        if rngs is None:
            return None
        saved = {
            **dataclasses.asdict(self),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else {},
            "rng": rngs,
        }
        return save_training_checkpoint(run_dir, self.step, model, saved, keep_last)

    @classmethod
    def resume_or_new(
        cls,
        run_dir: Path,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None = None,
        rank: int = 0,
    ) -> tuple[TrainState, Path | None]:
        """The newest checkpoint's state, loaded into model, optimizer, scaler and RNGs; a new state if none."""
        found = step_dirs(run_dir)
        if not found:
            return cls(), None
        step_dir = found[-1][1]
        load_weights(model, step_dir / WEIGHTS)
        saved = load_trainer_state(step_dir)
        optimizer.load_state_dict(saved["optimizer"])
        if scaler is not None and saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        rngs = saved["rng"]  # one state per rank
        if rank >= len(rngs):  # more ranks than the run was saved with: the resume cannot be exact
            log.warning("the checkpoint holds RNG states of %d rank(s); rank %d starts from rank 0's", len(rngs), rank)
        set_rng_state(rngs[rank] if rank < len(rngs) else rngs[0])
        return cls(**{f.name: saved[f.name] for f in dataclasses.fields(cls)}), step_dir
