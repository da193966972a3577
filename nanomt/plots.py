"""Pictures a person can look at: positional encodings, training curves, attention heatmaps (PNG or SVG)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from nanomt.core.model import sinusoidal_table
from nanomt.training.metrics_log import read_metrics

DPI = 120
# Bundled with matplotlib and has U+2581 ("▁", SentencePiece's word-start mark), whatever the user's rcParams.
TOKEN_FONT = "DejaVu Sans"
TOKEN_FONTSIZE = 9
# Keys read from metrics.jsonl rows; a row may carry any subset of them.
STEP = "step"
LOSS = "loss"
VALID_LOSS = "valid_loss"
VALID_BLEU = "valid_bleu"
LR = "lr"
TOKENS_PER_S = "tokens_per_s"


def _new_figure(width: float, height: float) -> Figure:
    """A Figure on its own Agg canvas: no pyplot, so no global figure registry or backend switch."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Write fig as SVG when path ends in .svg, else PNG; create parent directories."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg", ""):
        raise ValueError(f"cannot save a plot as {suffix!r}: use a .png or .svg path, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # bbox_inches="tight" grows the canvas to include long tick labels instead of clipping them.
    fig.savefig(path, format="svg" if suffix == ".svg" else "png", dpi=DPI, bbox_inches="tight")
    return path


def _no_data(ax: Axes, title: str) -> None:
    """Mark a panel whose series is absent from the metrics file."""
    ax.set_title(title)
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=14)
    ax.set_xlabel("step")
    ax.set_xticks([])
    ax.set_yticks([])


# ---------------------------------------------------------------------------------------------------------
# Positional encodings.
# ---------------------------------------------------------------------------------------------------------


def plot_positions(
    path: str | Path, d_model: int = 128, n_positions: int = 100, dims: tuple[int, ...] | None = None
) -> Path:
    """3.5: a few sinusoidal encoding dimensions over positions, and the whole (positions x d_model) table."""
    if d_model < 2 or d_model % 2 or n_positions < 1:
        raise ValueError(f"need an even d_model >= 2 and n_positions >= 1, got {d_model=} and {n_positions=}")
    if dims is None:  # a spread of wavelengths: ~8, ~8, ~26 and ~112 positions at d_model 128
        dims = tuple(d for d in (4, 5, 20, 40) if d < d_model)
    bad = [d for d in dims if not 0 <= d < d_model]
    if bad:
        raise ValueError(f"dims {bad} are outside 0..{d_model - 1} (d_model={d_model})")
    table = sinusoidal_table(n_positions, d_model).numpy()  # (P, D)

    fig = _new_figure(12.0, 4.5)
    curves, image = fig.subplots(1, 2, width_ratios=[1.2, 1.0])
    for d in dims:
        curves.plot(np.arange(n_positions), table[:, d], label=f"dim {d}")
    curves.set_xlabel("position")
    curves.set_ylabel("value")
    curves.set_title(f"sinusoidal encoding, d_model={d_model}")
    curves.grid(alpha=0.3)
    if dims:
        curves.legend(loc="upper right", fontsize=8)

    im = image.imshow(table, aspect="auto", cmap="RdBu", vmin=-1.0, vmax=1.0, interpolation="nearest")
    image.set_xlabel("dimension")
    image.set_ylabel("position")
    image.set_title("positional encoding table")
    fig.colorbar(im, ax=image, label="value")
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------------------
# Training curves.
# ---------------------------------------------------------------------------------------------------------


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows that carry both a step and a numeric value for key."""
    steps, values = [], []
    for row in rows:
        step, value = row.get(STEP), row.get(key)
        # bool is an int subclass; a flag is not a measurement.
        if isinstance(step, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(float(step))
            values.append(float(value))
    return steps, values


def plot_curves(metrics_path: str | Path, path: str | Path) -> Path:
    """2x2 grid from metrics.jsonl over step: train/valid loss, validation BLEU, learning rate, tokens/s."""
    rows = read_metrics(metrics_path)
    fig = _new_figure(11.0, 7.5)
    (ax_loss, ax_bleu), (ax_lr, ax_speed) = fig.subplots(2, 2)

    train, valid = _series(rows, LOSS), _series(rows, VALID_LOSS)
    if train[0] or valid[0]:
        if train[0]:
            ax_loss.plot(*train, color="tab:blue", label="train loss", linewidth=1.0)
        if valid[0]:
            ax_loss.plot(*valid, color="tab:orange", label="valid loss", marker="o", markersize=3)
        ax_loss.set_title("loss")
        ax_loss.set_xlabel("step")
        ax_loss.set_ylabel("loss")
        ax_loss.legend()
        ax_loss.grid(alpha=0.3)
    else:
        _no_data(ax_loss, "loss")

    panels = [
        (ax_bleu, VALID_BLEU, "validation BLEU", "BLEU", "tab:green", "o"),
        (ax_lr, LR, "learning rate", "learning rate", "tab:purple", None),
        (ax_speed, TOKENS_PER_S, "throughput", "tokens/s", "tab:red", None),
    ]
    for ax, key, title, ylabel, color, marker in panels:
        steps, values = _series(rows, key)
        if not steps:
            _no_data(ax, title)
            continue
        ax.plot(steps, values, color=color, marker=marker, markersize=3, linewidth=1.0)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    # Learning rates are ~1e-4: show a shared exponent instead of long decimals.
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------------------
# Attention.
# ---------------------------------------------------------------------------------------------------------


def _as_numpy(weights) -> np.ndarray:
    """A numpy float array from a numpy array or a torch tensor (on any device, with or without grad)."""
    if hasattr(weights, "detach"):
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float64)


def plot_attention(
    path: str | Path,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    weights,
    title: str = "",
    head_titles: Sequence[str] | None = None,
) -> Path:
    """One heatmap per head of weights (H, T, S) or (T, S): target tokens down, source tokens across."""
    w = _as_numpy(weights)
    if w.ndim == 2:
        w = w[None]  # (1, T, S)
    expected = (len(tgt_tokens), len(src_tokens))
    if w.ndim != 3 or w.shape[1:] != expected:
        raise ValueError(
            f"attention weights of shape {tuple(_as_numpy(weights).shape)} do not match the tokens: "
            f"expected (H, T, S) or (T, S) with (T, S) = (len(tgt_tokens), len(src_tokens)) = {expected}"
        )
    n_heads, t_len, s_len = w.shape
    if n_heads == 0 or t_len == 0 or s_len == 0:
        raise ValueError(f"nothing to plot: attention weights have shape {w.shape}")
    if head_titles is None:
        head_titles = [f"head {h}" for h in range(n_heads)] if n_heads > 1 else [""]
    if len(head_titles) != n_heads:
        raise ValueError(f"got {len(head_titles)} head titles for {n_heads} heads")

    # Size each panel from its token counts and label lengths so every label fits at a readable font size.
    cell = 0.24  # inches per token row/column
    char = 0.075  # inches per label character at TOKEN_FONTSIZE
    longest_src = max(len(t) for t in src_tokens)
    longest_tgt = max(len(t) for t in tgt_tokens)
    panel_w = max(2.5, cell * s_len + char * longest_tgt + 0.6)
    panel_h = max(2.0, cell * t_len + char * longest_src + 0.7)
    n_cols = min(n_heads, 4)
    # Very long sentences: fewer columns rather than a picture too wide to look at.
    while n_cols > 1 and n_cols * panel_w > 32:
        n_cols -= 1
    n_rows = math.ceil(n_heads / n_cols)
    width = n_cols * panel_w + 1.0
    # A title quoting a sentence pair wraps to the figure's width (~11 characters per inch at 12pt) rather
    # than widening the canvas and leaving the heatmaps small in the middle.
    title = textwrap.fill(title, width=max(30, int(width * 11)))
    title_h = 0.3 * (title.count("\n") + 1) if title else 0.0
    fig = _new_figure(width, n_rows * panel_h + title_h)
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()

    token_font = {"fontfamily": TOKEN_FONT, "fontsize": TOKEN_FONTSIZE}
    for h, ax in enumerate(axes):
        if h >= n_heads:
            ax.set_visible(False)
            continue
        # One color scale (0..1) for every head, so panels compare by eye and share one colorbar.
        im = ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(s_len), labels=list(src_tokens), rotation=90, **token_font)
        ax.set_yticks(range(t_len), labels=list(tgt_tokens), **token_font)
        ax.tick_params(length=2, pad=2)
        if head_titles[h]:
            ax.set_title(head_titles[h], fontsize=10)
        if h % n_cols == 0:
            ax.set_ylabel("target")
        if h >= n_heads - n_cols:
            ax.set_xlabel("source")
    fig.colorbar(im, ax=list(axes[:n_heads]), label="weight", fraction=0.05 / n_cols, pad=0.04 / n_cols)
    if title:
        fig.suptitle(title)
    return _save(fig, path)
