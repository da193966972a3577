"""Training: schedule and loss against formulas, a run whose loss falls, exact resume after SIGKILL, bad input."""

import json
import math
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import NANOMT, run_nanomt, tiny_config

from nanomt.core.batches import make_batches
from nanomt.core.checkpoint import WEIGHTS, average_checkpoints, load_checkpoint, read_weights, step_dirs
from nanomt.core.config import BOS_ID, EOS_ID, PAD_ID, TrainConfig, config_from_dict, load_config
from nanomt.core.tokenizer import Tokenizer
from nanomt.training.data import binarize, both_directions, output_ids
from nanomt.training.metrics_log import read_metrics as read_metrics_file
from nanomt.training.train import label_smoothed_loss, lr_at, train


def test_inverse_sqrt_schedule():
    tc = TrainConfig(lr=1e-3, warmup_steps=100)
    assert lr_at(1, tc, 512) == pytest.approx(1e-5)
    assert lr_at(50, tc, 512) == pytest.approx(5e-4)
    assert lr_at(100, tc, 512) == pytest.approx(1e-3)  # the peak is lr
    assert lr_at(400, tc, 512) == pytest.approx(1e-3 * math.sqrt(100 / 400))
    assert max(lr_at(s, tc, 512) for s in range(1, 1000)) == pytest.approx(1e-3)


def test_linear_schedule_decays_to_zero_at_max_steps():
    tc = TrainConfig(lr=1e-3, warmup_steps=100, schedule="linear", max_steps=1100)
    assert lr_at(50, tc, 512) == pytest.approx(5e-4)
    assert lr_at(100, tc, 512) == pytest.approx(1e-3)
    assert lr_at(600, tc, 512) == pytest.approx(5e-4)
    assert lr_at(1100, tc, 512) == 0.0 and lr_at(2000, tc, 512) == 0.0


def test_linear_schedule_ends_with_the_clock_when_max_minutes_runs_out_first():
    tc = TrainConfig(lr=1e-3, warmup_steps=100, schedule="linear", max_steps=100_000, max_minutes=10)
    assert lr_at(50, tc, 512, elapsed=1.0) == pytest.approx(5e-4)  # the warmup ramp still rules
    assert lr_at(1000, tc, 512, elapsed=300.0) == pytest.approx(5e-4)  # half the clock: half the peak
    assert lr_at(1000, tc, 512, elapsed=600.0) == 0.0 and lr_at(1000, tc, 512, elapsed=900.0) == 0.0
    steps_first = TrainConfig(lr=1e-3, warmup_steps=100, schedule="linear", max_steps=1100, max_minutes=10)
    assert lr_at(600, steps_first, 512, elapsed=60.0) == pytest.approx(5e-4)  # the step budget ends first
    assert lr_at(600, TrainConfig(lr=1e-3, warmup_steps=100, schedule="inverse_sqrt", max_minutes=10), 512, 599.0) == (
        pytest.approx(1e-3 * math.sqrt(100 / 600))
    )


@pytest.mark.slow
def test_time_budgeted_run_ends_with_the_lr_near_zero(toy_corpus, tmp_path):
    """With a step budget it cannot reach, a linear run decays over max_minutes and stops when they run out."""
    peak, budget, slack = 3e-3, 3.0, 0.05  # slack: elapsed_s is rounded, and counts a little after the step
    cfg = tiny_config(toy_corpus, max_steps=1_000_000, max_minutes=budget / 60, schedule="linear", warmup_steps=2)
    cfg["train"].update(log_every=1, eval_every=1_000_000, save_every=1_000_000)
    res = run_cli("train", str(write_config(tmp_path, cfg)), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    rows = [r for r in read_metrics(tmp_path / "run") if "lr" in r]
    assert len(rows) >= 5 and max(r["lr"] for r in rows) <= peak
    # Past the warmup, a step's lr is the peak times the part of the clock left when the step began, which lies
    # between the elapsed times logged after the step before it and after it. A loaded machine makes steps
    # slower and fewer, not the lr wrong.
    for before, row in zip(rows[2:], rows[3:]):
        assert peak * (1 - (row["elapsed_s"] + slack) / budget) <= row["lr"], row
        assert row["lr"] <= peak * (1 - (before["elapsed_s"] - slack) / budget), (before, row)
    # It stops at the first step that ends past the budget, whose lr is what the clock had left: near 0.
    assert rows[-2]["elapsed_s"] < budget + slack and rows[-1]["elapsed_s"] >= budget - slack


def test_noam_schedule_is_the_papers_formula():
    tc = TrainConfig(lr=1.0, warmup_steps=4000, schedule="noam")
    for step in (1, 100, 4000, 10000, 100000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert lr_at(step, tc, 512) == pytest.approx(expected)


def test_label_smoothed_loss_matches_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[1, 2, 0], [4, 0, 0]])  # 0 is padding
    eps, v = 0.1, 5
    expected = 0.0
    logp = logits.log_softmax(-1)
    for b in range(2):
        for t in range(3):
            y = target[b, t].item()
            if y == 0:
                continue
            # (1 - eps) on the gold token, eps spread uniformly over the whole vocabulary
            expected += -((1 - eps) * logp[b, t, y] + eps / v * logp[b, t].sum()).item()
    got = label_smoothed_loss(logits, target, eps, pad_id=0).item()
    assert got == pytest.approx(expected, rel=1e-6)
    assert label_smoothed_loss(logits, target, 0.0, 0).item() == pytest.approx(
        -sum(logp[b, t, target[b, t]].item() for b, t in [(0, 0), (0, 1), (1, 0)]), rel=1e-6
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_equals_cross_entropy_value_and_gradient(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(70, 50) * 3).to(dtype).requires_grad_()  # 70 rows: blocks of 32 plus a remainder
    target = torch.randint(0, 50, (70,))
    target[::7] = 0  # padding
    ours = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    ref = F.cross_entropy(logits.float(), target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    tol = {"rtol": 1e-6, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(ours, ref, **tol)
    (g_ours,) = torch.autograd.grad(ours * 3.0, logits)
    (g_ref,) = torch.autograd.grad(ref * 3.0, logits)
    assert g_ours.dtype == dtype
    torch.testing.assert_close(g_ours.float(), g_ref.float(), **tol)


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_run_learns_and_writes_a_run_directory(toy_corpus, tmp_path):
    cfg = config_from_dict(tiny_config(toy_corpus, max_steps=60, eval_every=30, save_every=20))
    run = train(cfg, tmp_path / "run")
    rows = read_metrics(run)
    losses = [r["loss"] for r in rows if "loss" in r]
    valid = [r["valid_loss"] for r in rows if "valid_loss" in r]
    assert losses[-1] < 0.7 * losses[0]
    assert len(valid) == 2 and valid[1] < valid[0]
    for key in ("step", "epoch", "loss", "lr", "tokens_per_s", "grad_norm", "padding", "elapsed_s"):
        assert key in rows[0]
    assert "valid_bleu" in [r for r in rows if "valid_loss" in r][0]
    assert [s for s, _ in step_dirs(run)] == [40, 60]  # keep_last=2
    assert (run / "config.yaml").is_file() and (run / "tokenizer").is_dir() and (run / WEIGHTS).is_file()
    model, saved_cfg, tok = load_checkpoint(run)
    assert saved_cfg.model.src_vocab_size == tok.src_vocab_size
    # No temporary files are left behind.
    assert not list(run.rglob("*.tmp")) and not list((run / "checkpoints").glob(".tmp*"))


def write_config(tmp_path, cfg: dict):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(*args):
    return run_nanomt(*args, text=True)


# `nanomt ARGS...` whose training stalls when it asks for the lr of step STALL_AT, after touching FLAG: steps
# before it are done and their checkpoints written, so a kill there is a kill at a known point.
STALLING_CLI = """
import runpy, sys, time
from pathlib import Path
import nanomt.training.train
flag, stall_at, lr_at = Path(sys.argv[1]), int(sys.argv[2]), nanomt.training.train.lr_at

def stalling_lr_at(step, *args, **kwargs):
    if step == stall_at:
        flag.touch()
        time.sleep(600)
    return lr_at(step, *args, **kwargs)

nanomt.training.train.lr_at = stalling_lr_at
sys.argv = ["nanomt", *sys.argv[3:]]
runpy.run_module("nanomt.cli", run_name="__main__")
"""


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_exact(toy_corpus, tmp_path):
    cfg = write_config(tmp_path, tiny_config(toy_corpus, max_steps=40, save_every=10, eval_every=20))
    ref = run_cli("train", str(cfg), "--run-dir", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr

    run, flag = tmp_path / "killed", tmp_path / "stalled"
    args = [sys.executable, "-c", STALLING_CLI, str(flag), "16", "train", str(cfg), "--run-dir", str(run)]
    with open(tmp_path / "stderr.txt", "w") as err:  # a file: a pipe nobody reads may fill and block the run
        proc = subprocess.Popen(args, stderr=err)
        deadline = time.time() + 300
        while not flag.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert flag.exists(), f"the run never reached step 16: {(tmp_path / 'stderr.txt').read_text()}"
    assert [s for s, _ in step_dirs(run)] == [10]  # killed after step 15, with steps 11-15 lost
    assert [r["step"] for r in read_metrics(run)][-1] == 15
    resumed = run_cli("train", str(cfg), "--run-dir", str(run))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    a = read_weights(tmp_path / "ref" / "checkpoints" / "step_40" / WEIGHTS)
    b = read_weights(run / "checkpoints" / "step_40" / WEIGHTS)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [r["step"] for r in read_metrics(run)] == [r["step"] for r in read_metrics(tmp_path / "ref")]


@pytest.mark.slow
def test_bpe_dropout_run_resumes_bit_exact_across_epochs(toy_corpus, tmp_path):
    """A run stopped mid-epoch and resumed re-draws the same segmentations: the weights equal an unbroken run's."""
    base = tiny_config(toy_corpus, max_tokens=20000, save_every=4, keep_last=10, eval_every=1000)  # ~6 steps an epoch
    base["data"]["bpe_dropout"] = 0.1
    whole = train(config_from_dict({**base, "train": {**base["train"], "max_steps": 20}}), tmp_path / "whole")
    split = tmp_path / "split"
    train(config_from_dict({**base, "train": {**base["train"], "max_steps": 9}}), split)
    train(config_from_dict({**base, "train": {**base["train"], "max_steps": 20}}), split)
    epochs = {r["step"]: r["epoch"] for r in read_metrics(whole) if "loss" in r}
    assert epochs[5] < epochs[10] < epochs[20]  # the resumed part crosses epoch boundaries
    plain = train(
        config_from_dict(
            {**base, "data": {**base["data"], "bpe_dropout": 0.0}, "train": {**base["train"], "max_steps": 4}}
        ),
        tmp_path / "plain",
    )
    a, b = (read_weights(r / "checkpoints" / "step_20" / WEIGHTS) for r in (whole, split))
    for name in a:
        assert torch.equal(a[name], b[name]), name
    c, d = (read_weights(r / "checkpoints" / "step_4" / WEIGHTS) for r in (whole, plain))
    assert any(not torch.equal(c[n], d[n]) for n in c)  # and the dropout really changed what was trained on


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits(toy_corpus, tmp_path):
    """The command's side of Ctrl-C (test_train_loop.py checks the checkpoint's step and the resume)."""
    cfg = write_config(tmp_path, tiny_config(toy_corpus, max_steps=100000, save_every=100000, eval_every=100000))
    run = tmp_path / "run"
    proc = subprocess.Popen([*NANOMT, "train", str(cfg), "--run-dir", str(run)], stderr=subprocess.PIPE, text=True)
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    # A logged step: the loop runs, with its handler installed (a slow start must not meet the default one).
    while not (metrics.is_file() and metrics.read_text().strip()) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "checkpoint saved" in err
    steps = step_dirs(run)
    assert len(steps) == 1 and steps[0][0] >= 5  # log_every=5
    load_checkpoint(steps[0][1])


@pytest.mark.slow
def test_non_finite_loss_stops_with_a_clear_message(toy_corpus, tmp_path):
    cfg = write_config(tmp_path, tiny_config(toy_corpus, lr=1e30, warmup_steps=1, clip_norm=0.0, save_every=1))
    res = run_cli("train", str(cfg), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("nanomt: error: loss is") and "last good checkpoint" in last
    good = step_dirs(tmp_path / "run")
    assert good and str(good[-1][1]) in last
    read_weights(good[-1][1] / WEIGHTS)


@pytest.mark.parametrize(
    "problem, words",
    [
        ("missing", ["not found", "nope.src"]),
        ("counts", ["train.src", "train.tgt", "3000", "2999"]),
        ("utf8", ["invalid UTF-8", "line 7"]),
        ("unknown_key", ["warmup", "train"]),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_error(toy_corpus, tmp_path, problem, words):
    cfg = tiny_config(toy_corpus)
    if problem == "missing":
        cfg["data"]["train"]["src"] = str(tmp_path / "nope.src")
    elif problem == "counts":
        lines = toy_corpus["train.tgt"].read_text().splitlines()[:-1]
        (tmp_path / "train.tgt").write_text("\n".join(lines) + "\n")
        (tmp_path / "train.src").write_bytes(toy_corpus["train.src"].read_bytes())
        cfg["data"]["train"] = {"src": str(tmp_path / "train.src"), "tgt": str(tmp_path / "train.tgt")}
    elif problem == "utf8":
        data = toy_corpus["train.src"].read_bytes().split(b"\n")
        data[6] = b"\xff\xfe bad"
        (tmp_path / "train.src").write_bytes(b"\n".join(data))
        cfg["data"]["train"]["src"] = str(tmp_path / "train.src")
    else:
        cfg["train"]["warmup"] = 3
    res = run_cli("train", str(write_config(tmp_path, cfg)), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nanomt: error:"), res.stderr
    for w in words:
        assert w in err[0]
    assert not step_dirs(tmp_path / "run")


@pytest.mark.slow
def test_set_overrides_and_config_mismatch_on_resume(toy_corpus, tmp_path):
    cfg = write_config(tmp_path, tiny_config(toy_corpus, max_steps=10, eval_every=10, save_every=10))
    run = tmp_path / "run"
    ok = run_cli("train", str(cfg), "--run-dir", str(run), "--set", "train.max_steps=5", "--set", "train.save_every=5")
    assert ok.returncode == 0, ok.stderr
    assert [s for s, _ in step_dirs(run)] == [5]
    bad = run_cli("train", str(cfg), "--run-dir", str(run), "--set", "model.d_model=64")
    assert bad.returncode == 1 and "model.d_model" in bad.stderr and "another --run-dir" in bad.stderr
    typo = run_cli("train", str(cfg), "--set", "train.max_steps=many")
    assert typo.returncode == 1 and "train.max_steps" in typo.stderr


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_accumulation(toy_corpus, tmp_path):
    """Two torchrun ranks with one batch each make the same update as one process accumulating both batches."""
    # max_minutes, never reached, makes the ranks share rank 0's clock (so they cannot stop at different steps).
    base = tiny_config(toy_corpus, max_steps=4, save_every=4, eval_every=1000, log_every=1, max_minutes=600)
    base["model"]["dropout"] = 0.0  # the ranks draw different dropout masks than one process would
    one = write_config(tmp_path, {**base, "train": {**base["train"], "accum_steps": 2}})
    res = run_cli("train", str(one), "--run-dir", str(tmp_path / "one"))
    assert res.returncode == 0, res.stderr
    (tmp_path / "ddp").mkdir()
    two = write_config(tmp_path / "ddp", base)
    # --standalone: the rendezvous picks a free port (a fixed one may be taken by another run on the machine).
    torchrun = [NANOMT[0], "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    res = subprocess.run(
        [*torchrun, "-m", "nanomt.cli", "train", str(two), "--run-dir", str(tmp_path / "two")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    a = read_weights(tmp_path / "one" / "checkpoints" / "step_4" / WEIGHTS)
    b = read_weights(tmp_path / "two" / "checkpoints" / "step_4" / WEIGHTS)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    losses_one = [r["loss"] for r in read_metrics(tmp_path / "one") if "loss" in r]
    losses_two = [r["loss"] for r in read_metrics(tmp_path / "two") if "loss" in r]
    assert losses_one == pytest.approx(losses_two, rel=1e-4)


# ---------------------------------------------------------------------------------------------------------
# Bidirectional training (train.bidirectional_epochs): the first epochs also train every pair reversed.


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


@pytest.mark.slow
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
    epochs = [r["epoch"] for r in read_metrics_file(run / "metrics.jsonl") if "loss" in r]
    assert n_plain[0] < n_bidir < 40 and epochs == want[:40]
    # Epoch 0's output layer scores what either side uses; from epoch 1 on, only the targets' ids.
    mask = {}
    for bidir, c in ((True, both), (False, corpus)):
        mask[bidir] = torch.zeros(tok.tgt_vocab_size, dtype=torch.bool)
        mask[bidir][output_ids(c, tok.unk_id, EOS_ID)] = True
        mask[bidir][: PAD_ID + 1] = True
    assert mask[False].sum() < mask[True].sum()  # the toy pair's two sides use different subwords
    for step, step_dir in step_dirs(run):
        got = read_weights(step_dir / WEIGHTS)["output_mask"]
        assert torch.equal(got, mask[step <= n_bidir]), step


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------------------------------
# model.restrict_output: a run's output layer scores the ids of its training targets.


@pytest.fixture(scope="module")
def restricted_run(toy_corpus, tmp_path_factory):
    cfg = tiny_config(toy_corpus, max_steps=20, eval_every=10, save_every=10, keep_last=5)
    cfg["data"]["shared_vocab"] = True
    cfg["model"].update(share_embeddings=True, tie_output=True, restrict_output=True)
    return train(config_from_dict(cfg), tmp_path_factory.mktemp("restricted") / "run")


def test_a_run_keeps_the_training_targets_ids_in_every_checkpoint(restricted_run):
    run = restricted_run
    tok = Tokenizer.load(run / "tokenizer")
    model, cfg, _ = load_checkpoint(run)
    corpus = binarize(cfg.data, "train", tok, run / "bin", max_len=cfg.model.max_positions - 1)
    expected = sorted({PAD_ID, *output_ids(corpus, tok.unk_id, EOS_ID).tolist()})
    assert model.output_ids.tolist() == expected and len(expected) < tok.tgt_vocab_size  # the shared vocab's
    assert EOS_ID in expected and BOS_ID not in expected
    for _, step_dir in step_dirs(run):
        assert torch.equal(read_weights(step_dir / WEIGHTS)["output_mask"], model.output_mask)
    avg, _, _ = load_checkpoint(average_checkpoints([d for _, d in step_dirs(run)], run.parent / "avg"))
    assert avg.output_ids.tolist() == expected


@pytest.mark.parametrize("rows", [1, 7, 32, 4096])
def test_blockwise_loss_and_its_gradient_equal_f_cross_entropy_at_any_block_size(rows):
    torch.manual_seed(0)
    logits = torch.randn(50, 37, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 37, (50,))
    target[::6] = 0  # padding, skipped
    want = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1, reduction="sum")
    (want_grad,) = torch.autograd.grad(want, logits)
    got = label_smoothed_loss(logits, target, 0.1, pad_id=0, fused=False, rows=rows)
    (got_grad,) = torch.autograd.grad(got * 2.0, logits)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, 2.0 * want_grad)
