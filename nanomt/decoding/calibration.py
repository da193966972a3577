"""A translation's confidence: the model's estimate of its sentence-level chrF against a reference, over 100 (0 to 1).

A Calibration maps a sentence's read-back features (nanomt.decoding.quality) to that estimate. It is fitted on
sentences with references (`nanomt calibrate`, or `nanomt train` on its validation set when training ends) and stored
as calibration.json beside the weights it was fitted for, with their hash: weights that change leave it unused, never
silently stale. The weights themselves are never written. The predictor, a logistic curve on the standardized
features, was chosen by measurement against a line on the mean log-probability (docs/confidence.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from nanomt.core.checkpoint import file_sha256
from nanomt.decoding.quality import FEATURES

log = logging.getLogger("nanomt")
CALIBRATION = "calibration.json"  # beside model.safetensors
MIN_SENTENCES = 100  # fewer sentences than this fit nothing worth calling calibrated
RIDGE = 1e-5  # L2 on the standardized weights: keeps a near-constant feature from taking a large weight
KINDS = ("line", "logistic")


class CalibrationError(ValueError):
    """Too few sentences to fit on, values no confidence can come from (not finite, a scale of 0), or a file that
    cannot be read."""


@dataclass(frozen=True)
class Calibration:
    """features -> confidence: `line` is a + b x on one feature, clipped to [0, 1]; `logistic` is
    sigmoid(b + w . (x - mean) / scale) on several."""

    kind: str
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    weights_sha256: str = ""  # the weights file it was fitted for ("" when fitted in memory)
    fit: dict = field(default_factory=dict)  # what it was fitted on, and how well it fits there
    # A multilingual model's fits of its own for each target language with enough sentences (by code); the others'
    # sentences, and a sentence of no known language, take this one's, fitted on every language together.
    by_language: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.by_language, dict):
            raise CalibrationError("by_language must be a mapping of language codes to calibrations")
        # Read from JSON, each language's calibration is a mapping: made one here, where it is checked too.
        languages = {code: c if isinstance(c, Calibration) else of_dict(c) for code, c in self.by_language.items()}
        object.__setattr__(self, "by_language", languages)
        if self.kind not in KINDS:
            raise CalibrationError(f"unknown calibration kind {self.kind!r} (known: {', '.join(KINDS)})")
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown:
            raise CalibrationError(f"unknown feature {unknown[0]!r} (known: {', '.join(FEATURES)})")
        if not (len(self.features) == len(self.mean) == len(self.scale) == len(self.weights)):
            raise CalibrationError("a calibration needs one mean, scale and weight per feature")
        # JSON reads NaN and Infinity as floats: predictions from them would be NaN, or raise, at every request.
        for name in ("mean", "scale", "weights"):
            for value in getattr(self, name):
                check_finite(name, value)
        check_finite("bias", self.bias)
        for feature, scale in zip(self.features, self.scale):
            if scale <= 0:
                raise CalibrationError(f"scale must be > 0, got {scale} for {feature}")
        if not isinstance(self.weights_sha256, str) or not isinstance(self.fit, dict):
            raise CalibrationError("weights_sha256 must be a string and fit a mapping")

    def predict(self, rows: Sequence[dict[str, float]], languages: Sequence[str | None] | None = None) -> np.ndarray:
        """(N,) each sentence's confidence from its features, by its target language's own fit where it has one
        (`languages`: each sentence's code, or None)."""
        out = self._predict(rows)
        for code, cal in self.by_language.items():
            idx = [i for i, lang in enumerate(languages or ()) if lang == code]
            if idx:
                out[idx] = cal.predict([rows[i] for i in idx])
        return out

    def _predict(self, rows: Sequence[dict[str, float]]) -> np.ndarray:
        x = np.array([[r[f] for f in self.features] for r in rows], dtype=np.float64).reshape(len(rows), -1)
        z = (x - np.array(self.mean)) / np.array(self.scale) @ np.array(self.weights) + self.bias  # (N,)
        if self.kind == "line":
            return np.clip(z, 0.0, 1.0)
        return 1.0 / (1.0 + np.exp(-z))

    def save(self, directory: str | Path) -> Path:
        """Write calibration.json into `directory` (through a temporary file)."""
        path = Path(directory) / CALIBRATION
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(asdict(self), indent=1) + "\n")
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or the new, never half
        os.replace(tmp, path)
        fsync_directory(path.parent)
        return path


def check_finite(name: str, value: object) -> None:
    """CalibrationError unless `value` is a finite number (not a bool, a string or None)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise CalibrationError(f"{name}: {value!r} is not a finite number")


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable, where the OS opens directories (not Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to fsync a directory: the rename is as durable as they make it
        pass
    finally:
        os.close(fd)


def fit(rows: Sequence[dict[str, float]], targets: Sequence[float], kind: str = "logistic",
        features: Sequence[str] = FEATURES) -> Calibration:  # fmt: skip
    """Fit a calibration of `kind` on sentences' features and their chrF / 100, by least squares."""
    if len(rows) < MIN_SENTENCES:
        raise CalibrationError(f"{len(rows)} sentences to calibrate on: at least {MIN_SENTENCES} are needed")
    x = np.array([[r[f] for f in features] for r in rows], dtype=np.float64)  # (N, F)
    y = np.asarray(targets, dtype=np.float64)  # (N,)
    mean, scale = x.mean(0), x.std(0)
    scale[scale < 1e-9] = 1.0  # a constant feature (no unknown pieces anywhere) carries no weight
    z = (x - mean) / scale
    if kind == "line":
        a = np.c_[z, np.ones(len(z))]
        coef = np.linalg.solve(a.T @ a + RIDGE * np.diag([1.0] * z.shape[1] + [0.0]), a.T @ y)
        weights, bias = coef[:-1], coef[-1]
    elif kind == "logistic":
        weights, bias = fit_logistic(z, y)
    else:
        raise CalibrationError(f"unknown calibration kind {kind!r} (known: {', '.join(KINDS)})")
    cal = Calibration(kind, tuple(features), tuple(mean), tuple(scale), tuple(map(float, weights)), float(bias))
    return dataclasses.replace(cal, fit=agreement(cal.predict(rows), y))


def fit_logistic(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Weights and bias of sigmoid(w . z + b) closest to y in squared error (L-BFGS from the line's start)."""
    zt, yt = torch.tensor(z), torch.tensor(y)
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    mean = min(max(float(y.mean()), 1e-3), 1 - 1e-3)  # an untrained model's chrF may all be 0
    b = torch.tensor(math.log(mean / (1 - mean)), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=500, line_search_fn="strong_wolfe", tolerance_grad=1e-10)

    def loss():
        opt.zero_grad()
        value = ((torch.sigmoid(zt @ w + b) - yt) ** 2).mean() + RIDGE * (w**2).sum()
        value.backward()
        return value

    opt.step(loss)
    return w.detach().numpy(), float(b.detach())


def agreement(predicted: Sequence[float], actual: Sequence[float]) -> dict:
    """How well predictions follow the truth: Pearson and Spearman correlation, mean absolute error, sentences."""
    p, a = np.asarray(predicted, dtype=np.float64), np.asarray(actual, dtype=np.float64)
    return {
        "pearson": round(_pearson(p, a), 4),
        "spearman": round(_pearson(_ranks(p), _ranks(a)), 4),
        "mae": round(float(np.abs(p - a).mean()), 4),
        "sentences": len(p),
    }


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if x.std() == 0 or y.std() == 0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties given their mean rank (what Spearman's correlation correlates)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / np.bincount(inverse))[inverse]


def sentence_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """Each hypothesis' sentence-level chrF (sacreBLEU's defaults) against its reference, over 100."""
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return [metric.sentence_score(h, [r]).score / 100 for h, r in zip(hypotheses, references)]


def of_dict(stored: dict) -> Calibration:
    """A calibration from its JSON form (lists where it has tuples)."""
    if not isinstance(stored, dict):
        raise CalibrationError(f"a calibration is a mapping, not {type(stored).__name__}")
    tuples = {name: tuple(stored[name]) for name in ("features", "mean", "scale", "weights")}
    return Calibration(**{**stored, **tuples})


def load(directory: str | Path, weights: str | Path) -> Calibration | None:
    """The calibration stored in `directory` for the weights file `weights`; None (and a log line saying why) when
    there is none, or when it was fitted for other weights. A damaged or invalid file is a CalibrationError naming
    it and the problem (Translator.calibration takes that as uncalibrated)."""
    path = Path(directory) / CALIBRATION
    if not path.is_file():
        return None
    try:
        cal = of_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        problem = f"no {e} field" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise CalibrationError(f"{path}: cannot read the calibration: {problem}") from None
    if cal.weights_sha256 != file_sha256(weights):
        log.warning("%s was fitted for other weights than %s: confidence uncalibrated (run nanomt calibrate)", path,
                    weights)  # fmt: skip
        return None
    return cal
