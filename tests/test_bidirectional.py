"""Bidirectional training (train.bidirectional_epochs): the first epochs also train every pair reversed."""

import shutil

import numpy as np
import pytest
import torch
from conftest import tiny_config

from nanomt.checkpoint import WEIGHTS, read_weights, step_dirs
from nanomt.config import ConfigError, config_from_dict, load_config
from nanomt.data import Corpus, _pack, binarize, both_directions, make_batches, output_ids
from nanomt.plots import read_metrics
from nanomt.tokenizer import PAD_ID, Tokenizer
from nanomt.train import train


def corpus_of(pairs: list[tuple[list[int], list[int]]]) -> Corpus:
    """A Corpus built by hand from (src ids, tgt ids) pairs."""
    return Corpus(*_pack([s for s, _ in pairs], np.uint16), *_pack([t for _, t in pairs], np.uint16), {})


def test_both_directions_appends_every_pair_reversed():
    pairs = [([5, 6, 7], [8]), ([9], [10, 11]), ([12, 13], [14, 15, 16, 17])]
    both = both_directions(corpus_of(pairs))
    assert len(both) == 6
    want = pairs + [(t, s) for s, t in pairs]
    assert [(both.src(i).tolist(), both.tgt(i).tolist()) for i in range(6)] == want
    assert both.src_lens.tolist() == [3, 1, 2, 1, 2, 4] and both.tgt_lens.tolist() == [1, 2, 4, 3, 1, 2]


@pytest.fixture(scope="module")
def bidir_config(toy_corpus):
    raw = tiny_config(
        toy_corpus, max_steps=40, max_tokens=8000, bidirectional_epochs=1, save_every=1, keep_last=100, log_every=1
    )
    raw["train"]["eval_every"] = 1000
    raw["data"]["shared_vocab"] = True
    raw["model"].update(share_embeddings=True, tie_output=True, restrict_output=True)
    return raw


@pytest.fixture(scope="module")
def bidir_run(bidir_config, tmp_path_factory):
    return train(config_from_dict(bidir_config), tmp_path_factory.mktemp("bidir") / "run")


def test_the_first_epoch_holds_both_directions_and_scores_both_sides_ids(bidir_run):
    run = bidir_run
    cfg = load_config(run / "config.yaml")
    tok = Tokenizer.load(run / "tokenizer")
    max_len = min(cfg.data.max_len, cfg.model.max_positions - 1)
    corpus = binarize(cfg.data, "train", tok, run / "bin", max_len=max_len)
    both = both_directions(corpus)
    tc = cfg.train
    n_bidir = len(make_batches(both.src_lens, both.tgt_lens, tc.max_tokens, tc.seed, 0))
    n_plain = [len(make_batches(corpus.src_lens, corpus.tgt_lens, tc.max_tokens, tc.seed, e)) for e in (1, 2, 3)]
    want = [0] * n_bidir + [1] * n_plain[0] + [2] * n_plain[1] + [3] * n_plain[2]
    epochs = [r["epoch"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert n_plain[0] < n_bidir < 40 and epochs == want[:40]
    # Epoch 0's output layer scores what either side uses; from epoch 1 on, only the targets' ids.
    mask = {}
    for bidir, c in ((True, both), (False, corpus)):
        mask[bidir] = torch.zeros(tok.tgt_vocab_size, dtype=torch.bool)
        mask[bidir][output_ids(c)] = True
        mask[bidir][: PAD_ID + 1] = True
    assert mask[False].sum() < mask[True].sum()  # the toy pair's two sides use different subwords
    for step, step_dir in step_dirs(run):
        got = read_weights(step_dir / WEIGHTS)["output_mask"]
        assert torch.equal(got, mask[step <= n_bidir]), step


def test_a_run_resumed_in_its_bidirectional_epoch_ends_on_the_same_weights(bidir_run, bidir_config, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(bidir_run, split)
    for step, step_dir in step_dirs(split):
        if step > 5:  # resume from step 5, inside the reversed-pairs epoch
            shutil.rmtree(step_dir)
    wide = read_weights(dict(step_dirs(split))[5] / WEIGHTS)["output_mask"]
    assert wide.sum() > read_weights(dict(step_dirs(bidir_run))[40] / WEIGHTS)["output_mask"].sum()  # epoch 0
    train(config_from_dict(bidir_config), split)
    a, b = (read_weights(dict(step_dirs(r))[40] / WEIGHTS) for r in (bidir_run, split))
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_negative_bidirectional_epochs_is_a_config_error(toy_corpus):
    with pytest.raises(ConfigError, match="bidirectional_epochs"):
        config_from_dict(tiny_config(toy_corpus, bidirectional_epochs=-1))
