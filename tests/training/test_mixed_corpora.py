"""data.train as a list of weighted corpora: each epoch's shares, drawn from (seed, epoch); a resumed run exact."""

import signal

import numpy as np
import pytest
import torch
from conftest import tiny_config

from nanomt.core import runtime
from nanomt.core.checkpoint import WEIGHTS, read_weights, step_dirs
from nanomt.core.config import ConfigError, config_from_dict
from nanomt.training import train as train_module
from nanomt.training.data import mixture
from nanomt.training.prepare import prepare_data
from nanomt.training.stream import epoch_batches
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import lr_at, train

pytestmark = pytest.mark.usefixtures("one_thread")
ONE = runtime.Runtime(0, 1, torch.device("cpu"), "fp32")


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory) -> list[dict]:
    big = write_corpus(tmp_path_factory.mktemp("big"), pairs=1200, seed=1, valid=20, test=1)
    small = write_corpus(tmp_path_factory.mktemp("small"), pairs=300, seed=2, valid=1, test=1)
    return [big, small]


def mixed_config(corpora: list[dict], weights: list[float], **train) -> dict:
    cfg = tiny_config(corpora[0], **train)
    cfg["data"]["train"] = [
        {"src": str(c["train.src"]), "tgt": str(c["train.tgt"]), "weight": w} for c, w in zip(corpora, weights)
    ]
    return cfg


@pytest.mark.parametrize(("sizes", "weights"), [([1200, 300], [1, 1]), ([1200, 300], [1, 3]), ([7, 5, 9], [2, 0.5, 1])])
def test_every_epoch_gives_each_corpus_its_share(sizes, weights):
    total, starts = sum(sizes), np.cumsum([0, *sizes])
    for epoch in range(3):
        picked = mixture(sizes, weights, seed=1, epoch=epoch)
        assert len(picked) == total
        for i, (start, n) in enumerate(zip(starts, sizes)):
            mine = picked[(picked >= start) & (picked < start + n)] - start
            want = weights[i] / sum(weights) * total
            assert abs(len(mine) - want) <= 0.5 + len(sizes)  # rounding of each share
            counts = np.bincount(mine, minlength=n)
            # Whole passes first: no pair is seen twice more often than another.
            assert counts.max() - counts.min() <= 1 and counts.sum() == len(mine)
    a, b = mixture(sizes, weights, 1, 0), mixture(sizes, weights, 1, 1)
    assert np.array_equal(a, mixture(sizes, weights, 1, 0))  # a function of (seed, epoch)
    assert sizes == [7, 5, 9] or not np.array_equal(a, b)  # another draw every epoch


def test_a_runs_epochs_hold_each_corpus_in_its_ratio(two_corpora, tmp_path):
    cfg = config_from_dict(mixed_config(two_corpora, [1, 3]))
    cfg, data = prepare_data(cfg, tmp_path / "run", ONE)
    assert data.corpus.sizes == [1200, 300] and len(data.corpus) == 1500
    for epoch in (0, 1):
        ep = epoch_batches(data, epoch, cfg, ONE)
        rows = np.concatenate([ep.corpus.indices[b] for b in ep.batches])
        assert sorted(rows.tolist()) == sorted(ep.corpus.indices.tolist())  # every pair of the draw, once
        from_small = int((rows >= 1200).sum())
        assert from_small == 1125 and len(rows) - from_small == 375  # 3:1 of 1,500 pairs
    # The pairs past the first corpus' are the second's: the draw indexes the corpora laid end to end.
    small = set(two_corpora[1]["train.src"].read_text().splitlines())
    positions = np.concatenate(ep.batches)
    drawn = [p for p in positions[:200] if ep.corpus.indices[p] >= 1200]
    texts = data.tokenizer.decode_src([ep.corpus.src(p).tolist() for p in drawn])
    assert drawn and all(t in small for t in texts)


@pytest.mark.slow  # three trainings
def test_a_run_of_mixed_corpora_resumed_after_ctrl_c_ends_on_the_same_weights(two_corpora, tmp_path, monkeypatch):
    # 1,500 pairs and 2,000 tokens a batch: ~30 batches an epoch, so the 40 steps cross into a second draw.
    cfg = config_from_dict(mixed_config(two_corpora, [1, 2], max_steps=40, max_tokens=2000, save_every=10))
    whole = train(cfg, tmp_path / "whole")
    interrupted = []

    def lr_at_with_ctrl_c(step, *args, **kwargs):
        if step == 35 and not interrupted:
            interrupted.append(step)
            signal.raise_signal(signal.SIGINT)
        return lr_at(step, *args, **kwargs)

    monkeypatch.setattr(train_module, "lr_at", lr_at_with_ctrl_c)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run)
    monkeypatch.undo()
    assert step_dirs(run)[-1][0] == 35
    train(cfg, run)
    a, b = read_weights(run / WEIGHTS), read_weights(whole / WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)
    epochs = torch.load(step_dirs(run)[-1][1] / "trainer.pt", weights_only=True)["epoch"]
    assert epochs >= 1  # the run went through more than one draw


@pytest.mark.parametrize("weight", [0, -1, float("nan")])
def test_a_weight_that_is_not_positive_is_an_error_naming_the_corpus(two_corpora, weight):
    with pytest.raises(ConfigError, match=r"data\.train\[1\]'?: weight must be a positive number"):
        config_from_dict(mixed_config(two_corpora, [1, weight]))
