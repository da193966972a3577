"""nanomt.plots writes pictures matplotlib can read back, of the data it is given, and rejects inputs it cannot draw."""

import json
import math
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

import nanomt.plots
from nanomt import cli
from nanomt.core.checkpoint import model_state, write_checkpoint_dir
from nanomt.core.config import Config, DataConfig, DecodeConfig, ModelConfig
from nanomt.core.model import Transformer
from nanomt.core.tokenizer import train_tokenizer
from nanomt.decoding.translate import Translator
from nanomt.plots import plot_attention, plot_curves, plot_positions
from nanomt.training.metrics_log import read_metrics

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


@pytest.fixture
def figures(monkeypatch):
    """The figures nanomt.plots would save while the test runs, kept to look inside instead of written."""
    kept = []
    monkeypatch.setattr(nanomt.plots, "_save", lambda fig, path: kept.append(fig) or Path(path))
    return kept


def _heatmaps(fig):
    """The visible axes that show an image (the colorbar's axes hold none)."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.images]


def _tick_texts(ticklabels):
    return [t.get_text() for t in ticklabels]


def _assert_heatmap(ax, weights, x_tokens, y_tokens):
    """ax shows `weights` (rows: y_tokens top to bottom, columns: x_tokens), each cell at its tokens' ticks."""
    weights = np.asarray(weights, dtype=np.float64)
    image = ax.images[0]
    np.testing.assert_array_equal(np.ma.getdata(image.get_array()), weights)
    # Row i and column j are drawn centred on y = i and x = j, row 0 at the top: where the ticks are.
    t, s = weights.shape
    assert image.origin == "upper" and list(image.get_extent()) == [-0.5, s - 0.5, t - 0.5, -0.5]
    assert image.get_clim() == (0.0, 1.0)
    assert list(ax.get_xticks()) == list(range(s)) and _tick_texts(ax.get_xticklabels()) == list(x_tokens)
    assert list(ax.get_yticks()) == list(range(t)) and _tick_texts(ax.get_yticklabels()) == list(y_tokens)


def _sinusoids(n_positions, d_model):
    """3.5 of the paper, in float64: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(the same)."""
    table = np.zeros((n_positions, d_model))
    for pos in range(n_positions):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


def test_positions(tmp_path):
    out = plot_positions(tmp_path / "sub" / "dir" / "positions.png", d_model=32, n_positions=50)
    assert out == tmp_path / "sub" / "dir" / "positions.png"
    h, w = _read_png(out)
    assert w > h > 200  # two panels side by side


def test_positions_show_the_papers_sinusoids(tmp_path, figures):
    plot_positions(tmp_path / "p.png", d_model=24, n_positions=30, dims=(0, 1, 6, 23))
    curves, image = figures[0].axes[:2]
    reference = _sinusoids(30, 24)
    # The table: positions down, dimensions across, the paper's values, and the very table the model adds.
    assert (image.get_ylabel(), image.get_xlabel()) == ("position", "dimension")
    shown = np.ma.getdata(image.images[0].get_array())
    np.testing.assert_allclose(shown, reference, rtol=0, atol=1e-6)
    model = Transformer(ModelConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=24, n_heads=2, max_positions=30))
    np.testing.assert_array_equal(shown, model.tgt_embed.table.numpy())
    # The curves: one a dimension asked for, over every position.
    assert [line.get_label() for line in curves.get_lines()] == ["dim 0", "dim 1", "dim 6", "dim 23"]
    for line, d in zip(curves.get_lines(), (0, 1, 6, 23), strict=True):
        assert list(line.get_xdata()) == list(range(30))
        np.testing.assert_allclose(line.get_ydata(), reference[:, d], rtol=0, atol=1e-6)


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


def test_curves_panels(tmp_path, figures):
    # Look inside the figure: which panels have data, and every one says "step" on x.
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


def test_curves_are_the_metrics_rows(tmp_path, figures):
    # Rows as train.py writes them (log rows, evaluation rows), and some a panel has to skip: no step, a flag,
    # a missing value, text.
    rows = [
        {"step": 0, "loss": 5.0, "lr": 0.0, "tokens_per_s": 900.0},
        {"step": 10, "loss": 4.0, "lr": 1e-4, "tokens_per_s": 1000},
        {"step": 10, "valid_loss": 4.5, "valid_bleu": 1.5},
        {"step": 20, "loss": 3.0, "lr": 2e-4, "tokens_per_s": 1100.0},
        {"step": 25, "loss": True, "valid_bleu": "n/a"},
        {"loss": 2.0, "lr": 1.0},
        {"step": 30, "loss": 2.5, "lr": 1.5e-4, "tokens_per_s": None},
        {"step": 30, "valid_loss": 3.5, "valid_bleu": 4.0},
    ]
    plot_curves(_write_metrics(tmp_path / "metrics.jsonl", rows), tmp_path / "curves.png")
    loss, bleu, lr, speed = figures[0].axes
    expected = {
        (loss, "train loss"): ([0, 10, 20, 30], [5.0, 4.0, 3.0, 2.5]),
        (loss, "valid loss"): ([10, 30], [4.5, 3.5]),
        (bleu, "BLEU"): ([10, 30], [1.5, 4.0]),
        (lr, "learning rate"): ([0, 10, 20, 30], [0.0, 1e-4, 2e-4, 1.5e-4]),
        (speed, "tokens/s"): ([0, 10, 20], [900.0, 1000.0, 1100.0]),
    }
    shown = {}
    for ax in (loss, bleu, lr, speed):
        for line in ax.get_lines():
            name = line.get_label() if ax is loss else ax.get_ylabel()
            shown[ax, name] = (list(line.get_xdata()), list(line.get_ydata()))
    assert shown == expected
    assert [ax.get_title() for ax in figures[0].axes] == ["loss", "validation BLEU", "learning rate", "throughput"]


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


def test_attention_images_are_the_weights_and_ticks_the_tokens(tmp_path, figures):
    # Five heads: a 4-column grid with three empty cells; every head's panel shows its own (T, S) weights.
    w = _weights(5)
    plot_attention(tmp_path / "five.png", SRC, TGT, w, title="five heads", head_titles=["a", "b", "c", "d", "e"])
    heads = _heatmaps(figures[0])
    assert [ax.get_title() for ax in heads] == ["a", "b", "c", "d", "e"]
    for ax, head in zip(heads, w, strict=True):
        _assert_heatmap(ax, head, SRC, TGT)
    assert figures[0].get_suptitle() == "five heads"
    # One (T, S) matrix, as a bfloat16 tensor: its values as float.
    one = _weights(1)[0].to(torch.bfloat16)
    plot_attention(tmp_path / "one.png", SRC, TGT, one)
    [ax] = _heatmaps(figures[1])
    _assert_heatmap(ax, one.float(), SRC, TGT)


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


def test_plot_commands_show_the_translators_attention_the_sinusoids_and_the_metrics(toy_corpus, tmp_path, figures):
    # A random two-layer model's checkpoint: `nanomt plot attention` shows the layer, heads and tokens asked for.
    tokenizer_dir = tmp_path / "tokenizer"
    lines = [toy_corpus[name].read_text(encoding="utf-8").splitlines() for name in ("train.src", "train.tgt")]
    train_tokenizer(*lines, tokenizer_dir, DataConfig(vocab_size=120, shared_vocab=False))
    model_cfg = ModelConfig(
        src_vocab_size=120, tgt_vocab_size=120, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32
    )
    torch.manual_seed(0)
    cfg = Config(model=model_cfg, decode=DecodeConfig(max_len_a=0.0, max_len_b=6))
    ckpt = write_checkpoint_dir(tmp_path / "ckpt", cfg, tokenizer_dir, model_state(Transformer(model_cfg)))
    sentence = "la fesa dormat."
    att = Translator.from_checkpoint(ckpt).attention(sentence)
    assert len(att.src_tokens) > 3 and len(att.tgt_tokens) > 3  # rectangles that a transposition would not fit
    decoder_keys = ["<s>", *att.tgt_tokens[:-1]]
    cases = [  # (arguments, layer weights, heads shown, x tokens, y tokens)
        ([], att.cross[1], [0, 1], att.src_tokens, att.tgt_tokens),
        (["--layer", "0", "--head", "1"], att.cross[0], [1], att.src_tokens, att.tgt_tokens),
        (["--kind", "encoder", "--layer", "0"], att.encoder[0], [0, 1], att.src_tokens, att.src_tokens),
        (["--kind", "decoder", "--layer", "-1", "--head", "0"], att.decoder[1], [0], decoder_keys, att.tgt_tokens),
    ]
    for args, weights, heads, x_tokens, y_tokens in cases:
        cli.main(["plot", "attention", str(ckpt), sentence, *args, "-o", str(tmp_path / "att.png")])
        shown = _heatmaps(figures[-1])
        assert [ax.get_title() for ax in shown] == [f"head {h}" for h in heads], args
        for ax, h in zip(shown, heads, strict=True):
            _assert_heatmap(ax, weights[h], x_tokens, y_tokens)

    cli.main(["plot", "positions", "--d-model", "10", "--positions", "12", "-o", str(tmp_path / "positions.png")])
    table = np.ma.getdata(figures[-1].axes[1].images[0].get_array())
    np.testing.assert_allclose(table, _sinusoids(12, 10), rtol=0, atol=1e-6)

    run = tmp_path / "run"
    run.mkdir()
    steps, losses, lrs = [0, 10, 20, 30], [4.0, 3.5, 3.25, 3.0], [0.0, 1e-4, 3e-4, 2e-4]
    _write_metrics(run / "metrics.jsonl", [{"step": s, "loss": x, "lr": y} for s, x, y in zip(steps, losses, lrs)])
    cli.main(["plot", "curves", str(run), "-o", str(tmp_path / "curves.png")])
    [train_loss] = figures[-1].axes[0].get_lines()
    [learning_rate] = figures[-1].axes[2].get_lines()
    assert list(train_loss.get_xdata()) == list(learning_rate.get_xdata()) == steps
    assert (list(train_loss.get_ydata()), list(learning_rate.get_ydata())) == (losses, lrs)
