"""nanomt.plots writes pictures matplotlib can read back, and rejects inputs it cannot draw."""

import json

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

import nanomt.plots
from nanomt.plots import plot_attention, plot_curves, plot_positions, read_metrics

SRC = ["▁Ein", "▁Mann", "▁mit", "▁einem", "▁orange", "n", "▁Hut", "."]
TGT = ["▁A", "▁man", "▁in", "▁an", "▁orange", "▁hat", "."]


def _read_png(path):
    """(height, width) of a PNG file matplotlib can decode; fails on anything else."""
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    return image.shape[:2]


def _weights(n_heads, t=None, s=None):
    t, s = t or len(TGT), s or len(SRC)
    g = torch.Generator().manual_seed(0)
    return torch.softmax(torch.randn(n_heads, t, s, generator=g), dim=-1)


def _write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_positions(tmp_path):
    out = plot_positions(tmp_path / "sub" / "dir" / "positions.png", d_model=32, n_positions=50)
    assert out == tmp_path / "sub" / "dir" / "positions.png"
    h, w = _read_png(out)
    assert w > h > 200  # two panels side by side


def test_positions_rejects_bad_dims(tmp_path):
    with pytest.raises(ValueError, match="dims"):
        plot_positions(tmp_path / "p.png", d_model=16, dims=(3, 16))


def test_curves(tmp_path):
    rows = []
    for step in range(0, 200, 10):
        rows.append({"step": step, "loss": 5.0 / (1 + step), "lr": 1e-4 * step, "tokens_per_s": 1000.0 + step})
        if step % 50 == 0:
            rows.append({"step": step, "valid_loss": 6.0 / (1 + step), "valid_bleu": step / 10})
    metrics = _write_metrics(tmp_path / "metrics.jsonl", rows)
    h, w = _read_png(plot_curves(metrics, tmp_path / "curves.png"))
    assert h > 300 and w > 300


def test_curves_rows_missing_keys(tmp_path):
    # Only train loss, plus rows lacking a step or carrying non-numeric values: the rest say "no data".
    rows = [{"step": s, "loss": 3.0 - s / 100} for s in range(10)]
    rows += [{"loss": 1.0}, {"step": 11, "valid_bleu": None}, {"step": 12, "note": "x"}, {"epoch": 1}]
    metrics = _write_metrics(tmp_path / "metrics.jsonl", rows)
    metrics.write_text(metrics.read_text() + "\n\n")  # trailing blank lines are fine
    _read_png(plot_curves(metrics, tmp_path / "curves.png"))
    # No usable series at all still draws four "no data" panels.
    only_eval = _write_metrics(tmp_path / "empty_series.jsonl", [{"epoch": 1}])
    _read_png(plot_curves(only_eval, tmp_path / "none.png"))


def test_curves_panels(tmp_path, monkeypatch):
    # Look inside the figure: which panels have data, and every one says "step" on x.
    figures = []
    real_save = nanomt.plots._save
    monkeypatch.setattr(nanomt.plots, "_save", lambda fig, path: figures.append(fig) or real_save(fig, path))
    rows = [{"step": s, "loss": 2.0, "valid_loss": 2.5} for s in range(5)] + [{"step": 5, "valid_bleu": None}]
    plot_curves(_write_metrics(tmp_path / "metrics.jsonl", rows), tmp_path / "curves.png")
    loss, bleu, lr, speed = figures[0].axes
    assert [line.get_label() for line in loss.get_lines()] == ["train loss", "valid loss"]
    assert loss.get_legend() is not None
    for ax in (bleu, lr, speed):
        assert [t.get_text() for t in ax.texts] == ["no data"]
        assert not ax.get_lines()
    assert [ax.get_xlabel() for ax in figures[0].axes] == ["step"] * 4
    plot_curves(_write_metrics(tmp_path / "lr_only.jsonl", [{"step": 1, "lr": 1e-3}]), tmp_path / "lr.png")
    no_data = [[t.get_text() for t in ax.texts] == ["no data"] for ax in figures[1].axes]
    assert no_data == [True, True, False, True]  # loss, BLEU, lr, tokens/s


def test_curves_missing_or_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics file not found"):
        plot_curves(tmp_path / "nope.jsonl", tmp_path / "c.png")
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match="empty"):
        plot_curves(tmp_path / "empty.jsonl", tmp_path / "c.png")
    (tmp_path / "bad.jsonl").write_text('{"step": 1}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_metrics(tmp_path / "bad.jsonl")
    assert not (tmp_path / "c.png").exists()


def test_attention_heads_grow_the_picture(tmp_path):
    w = _weights(4)
    one = _read_png(plot_attention(tmp_path / "one.png", SRC, TGT, w[0].numpy(), title="one head"))
    four = _read_png(plot_attention(tmp_path / "four.png", SRC, TGT, w, head_titles=["a", "b", "c", "d"]))
    assert four[1] > 2 * one[1]  # four columns side by side
    eight = _read_png(plot_attention(tmp_path / "eight.png", SRC, TGT, torch.cat([w, w])))
    assert eight[0] > 1.5 * four[0]  # a second row


def test_attention_grows_with_tokens(tmp_path):
    small = _read_png(plot_attention(tmp_path / "small.png", SRC, TGT, _weights(1)[0]))
    src, tgt = SRC * 3, TGT * 3
    big = _read_png(plot_attention(tmp_path / "big.png", src, tgt, _weights(1, len(tgt), len(src))[0]))
    assert big[0] > 1.5 * small[0] and big[1] > 1.5 * small[1]


def test_attention_accepts_tensors(tmp_path):
    w = _weights(2).requires_grad_(True)  # a tensor still attached to the graph
    _read_png(plot_attention(tmp_path / "t.png", SRC, TGT, w))
    _read_png(plot_attention(tmp_path / "t16.png", SRC, TGT, w.detach().to(torch.bfloat16)))


def test_attention_rejects_mismatched_shapes(tmp_path):
    with pytest.raises(ValueError, match=r"\(8, 7\).*\(7, 8\)"):
        plot_attention(tmp_path / "x.png", SRC, TGT, np.zeros((8, 7)))
    with pytest.raises(ValueError, match=r"\(2, 7, 9\).*\(7, 8\)"):
        plot_attention(tmp_path / "x.png", SRC, TGT, np.zeros((2, 7, 9)))
    with pytest.raises(ValueError, match=r"\(7,\)"):
        plot_attention(tmp_path / "x.png", SRC, TGT, np.zeros(7))
    with pytest.raises(ValueError, match="3 head titles for 2 heads"):
        plot_attention(tmp_path / "x.png", SRC, TGT, _weights(2), head_titles=["a", "b", "c"])
    assert not (tmp_path / "x.png").exists()


def test_svg_output(tmp_path):
    out = plot_attention(tmp_path / "a.svg", SRC, TGT, _weights(2), title="svg")
    text = out.read_text(encoding="utf-8")
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert plot_positions(tmp_path / "p.svg", d_model=16, n_positions=20).read_text().count("<svg") == 1


def test_rejects_unknown_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        plot_positions(tmp_path / "p.jpg", d_model=16, n_positions=20)
