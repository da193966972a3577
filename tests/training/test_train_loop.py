"""The training loop against references: a model that reads its source, the kept weights, the optimizer step,
validation numbers recomputed by hand, and the Ctrl-C checkpoint."""

import json
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from sacrebleu.metrics import BLEU

from nanomt.core.batches import make_batches
from nanomt.core.checkpoint import WEIGHTS, load_checkpoint, read_weights, step_dirs
from nanomt.core.config import config_from_dict
from nanomt.core.model import Transformer
from nanomt.core.runtime import Runtime
from nanomt.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nanomt.decoding.translate import Translator
from nanomt.training import prepare as prepare_module
from nanomt.training import train as train_module
from nanomt.training.data import binarize
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import lr_at, train

# Greedy validation BLEU after 150 steps on the toy pair: ~18-26 (seeds 1-3) for a model that reads its source,
# under 2 for one trained on shuffled sources (a target-side language model). The floor lies between the two.
SOURCE_BLIND_CEILING = 8.0
TIMED = ("tokens_per_s", "elapsed_s")  # metrics that depend on the machine's speed


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """64 training pairs of the toy language: with a large max_tokens, one batch holds them all."""
    return write_corpus(tmp_path_factory.mktemp("small"), pairs=64, seed=0, valid=20, test=1)


def small_config(corpus, valid: bool = True, **train) -> dict:
    """tiny_config on the small corpus: no dropout (the references draw no masks), on the CPU."""
    cfg = tiny_config(corpus, device="cpu", **train)
    cfg["data"]["vocab_size"] = 100
    cfg["model"]["dropout"] = 0.0
    if not valid:
        del cfg["data"]["valid"]
    return cfg


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights_at(run_dir, step: int) -> dict[str, torch.Tensor]:
    return read_weights(run_dir / "checkpoints" / f"step_{step}" / WEIGHTS)


def assert_equal_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_a_trained_model_reads_its_source(toy_corpus, tmp_path, one_thread):
    """Validation BLEU above what a model trained on shuffled sources (a target-only language model) reaches."""
    shuffled = tmp_path / "shuffled.src"
    lines = toy_corpus["train.src"].read_text().splitlines()
    random.Random(0).shuffle(lines)
    shuffled.write_text("".join(line + "\n" for line in lines))
    bleus = {}
    for name in ("aligned", "shuffled"):
        cfg = tiny_config(toy_corpus, max_steps=150, eval_every=150, save_every=150, lr=1e-2, warmup_steps=20)
        if name == "shuffled":
            cfg["data"]["train"]["src"] = str(shuffled)
        run = train(config_from_dict(cfg), tmp_path / name)
        (bleus[name],) = [r["valid_bleu"] for r in read_metrics(run) if "valid_bleu" in r]
    assert bleus["shuffled"] < SOURCE_BLIND_CEILING <= bleus["aligned"], bleus


# ---------------------------------------------------------------------------------------------------------
# model.safetensors: the best evaluation's weights.
# ---------------------------------------------------------------------------------------------------------


def test_the_kept_weights_are_those_of_the_best_validation_bleu(small_corpus, tmp_path, monkeypatch):
    scripted = iter([10.0, 30.0, 20.0])  # the loss falls throughout: the kept weights follow BLEU, not the loss
    monkeypatch.setattr(train_module, "bleu", lambda hyps, refs: next(scripted))
    cfg = small_config(small_corpus, max_steps=3, eval_every=1, save_every=1, keep_last=10, valid_bleu_sentences=4)
    run = train(config_from_dict(cfg), tmp_path / "run")
    evals = [r for r in read_metrics(run) if "valid_loss" in r]
    assert [(r["step"], r["valid_bleu"]) for r in evals] == [(1, 10.0), (2, 30.0), (3, 20.0)]
    assert [s for s, _ in step_dirs(run)] == [1, 2, 3]
    kept = read_weights(run / WEIGHTS)
    assert_equal_weights(kept, weights_at(run, 2))
    assert not torch.equal(kept["output.weight"], weights_at(run, 3)["output.weight"])
    # What translate, evaluate and serve load is that file.
    model, _, _ = load_checkpoint(run)
    assert_equal_weights({k: v for k, v in model.state_dict().items() if k in kept}, kept)


def test_without_bleu_the_kept_weights_are_those_of_the_lowest_validation_loss(small_corpus, tmp_path, monkeypatch):
    def lr_with_a_bad_step(step, *args, **kwargs):  # a huge last step: the loss rises, the last weights are worst
        return 0.5 if step == 3 else lr_at(step, *args, **kwargs)

    monkeypatch.setattr(train_module, "lr_at", lr_with_a_bad_step)
    cfg = small_config(small_corpus, max_steps=3, eval_every=1, save_every=1, keep_last=10, valid_bleu_sentences=0)
    run = train(config_from_dict(cfg), tmp_path / "run")
    evals = [r for r in read_metrics(run) if "valid_loss" in r]
    assert [r["step"] for r in evals] == [1, 2, 3] and not any("valid_bleu" in r for r in evals)
    best = min(evals, key=lambda r: r["valid_loss"])["step"]
    assert best != 3, evals  # else the test could not tell the best weights from the last
    assert_equal_weights(read_weights(run / WEIGHTS), weights_at(run, best))


# ---------------------------------------------------------------------------------------------------------
# The optimizer step.
# ---------------------------------------------------------------------------------------------------------


def whole_corpus_batch(run_dir):
    """The run's config and every training pair of its corpus as one padded batch, tokenized by hand."""
    _, cfg, tokenizer = load_checkpoint(run_dir)
    srcs = tokenizer.encode_src(Path(cfg.data.train.src).read_text(encoding="utf-8").splitlines())
    tgts = tokenizer.encode_tgt(Path(cfg.data.train.tgt).read_text(encoding="utf-8").splitlines())
    assert max(max(map(len, srcs)), max(map(len, tgts))) <= cfg.data.max_len  # none is filtered out
    src = torch.full((len(srcs), max(map(len, srcs)) + 1), PAD_ID)
    tgt_in = torch.full((len(tgts), max(map(len, tgts)) + 1), PAD_ID)
    tgt_out = tgt_in.clone()
    for i, (s, t) in enumerate(zip(srcs, tgts, strict=True)):
        src[i, : len(s) + 1] = torch.tensor([*s, EOS_ID])
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID, *t])
        tgt_out[i, : len(t) + 1] = torch.tensor([*t, EOS_ID])
    return cfg, src, tgt_in, tgt_out


def test_two_steps_equal_hand_built_adamw_with_clipping(small_corpus, tmp_path, one_thread):
    """Two steps on the whole corpus equal torch's AdamW after clip_grad_norm_, with non-default settings."""
    # Two steps: Adam's first update is nearly the gradient's sign, blind to clipping. eps=1e-4 is far above the
    # float noise on gradients that are 0 in exact arithmetic (key biases), which a tiny eps would turn into +-lr.
    clip = 0.1
    cfg = small_config(
        small_corpus,
        valid=False,
        max_steps=2,
        max_tokens=100_000,
        save_every=1,
        log_every=1,
        lr=3e-3,
        warmup_steps=2,
        betas=[0.8, 0.95],
        eps=1e-4,
        weight_decay=0.5,
        label_smoothing=0.2,
        clip_norm=clip,
        seed=7,
    )
    run = train(config_from_dict(cfg), tmp_path / "run")
    rows = [r for r in read_metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]

    cfg, src, tgt_in, tgt_out = whole_corpus_batch(run)
    tc = cfg.train
    random.seed(tc.seed)
    np.random.seed(tc.seed)
    torch.manual_seed(tc.seed)
    model = Transformer(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), betas=tuple(tc.betas), eps=tc.eps, weight_decay=tc.weight_decay)
    n_tokens = int((tgt_out != PAD_ID).sum())
    for step, row in zip((1, 2), rows, strict=True):
        for g in optimizer.param_groups:
            g["lr"] = lr_at(step, tc, cfg.model.d_model)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(
            logits.flatten(0, 1),
            tgt_out.flatten(),
            ignore_index=PAD_ID,
            label_smoothing=tc.label_smoothing,
            reduction="sum",
        )
        (loss / n_tokens).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        assert norm > 2 * clip  # the clip binds
        optimizer.step()
        optimizer.zero_grad()
        assert row["loss"] == pytest.approx(loss.item() / n_tokens, rel=1e-5)
        assert row["grad_norm"] == pytest.approx(norm.item(), rel=1e-4)
        saved = weights_at(run, step)
        for name, p in model.state_dict().items():
            torch.testing.assert_close(saved[name], p, rtol=0, atol=2e-6, msg=f"step {step}: {name}")


def batch_counts(run_dir, max_tokens: list[int]) -> list[int]:
    """How many batches one epoch of the run's (binarized) training corpus makes at each max_tokens."""
    _, cfg, tokenizer = load_checkpoint(run_dir)
    corpus = binarize(cfg.data, "train", tokenizer, run_dir / "bin", max_len=cfg.data.max_len)
    return [len(make_batches(corpus.src_lens, corpus.tgt_lens, m, cfg.train.seed, 0)) for m in max_tokens]


def test_accumulating_two_batches_equals_one_merged_batch(small_corpus, tmp_path, one_thread):
    """The group's loss is normalised by the target tokens of the whole group, not batch by batch."""
    # eps=1e-4: see test_two_steps_equal_hand_built_adamw_with_clipping.
    base = small_config(small_corpus, valid=False, max_steps=1, save_every=1, log_every=1, clip_norm=0.5, eps=1e-4)
    merged = train(config_from_dict({**base, "train": {**base["train"], "max_tokens": 100_000}}), tmp_path / "merged")
    sizes = list(range(200, 2000, 20))
    assert batch_counts(merged, [100_000]) == [1]
    halves = sizes[batch_counts(merged, sizes).index(2)]  # a max_tokens that cuts the corpus in two batches
    cfg = {**base, "train": {**base["train"], "max_tokens": halves, "accum_steps": 2}}
    accumulated = train(config_from_dict(cfg), tmp_path / "accumulated")
    (a,), (b,) = read_metrics(merged), read_metrics(accumulated)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    w_merged, w_accumulated = weights_at(merged, 1), weights_at(accumulated, 1)
    for name in w_merged:
        torch.testing.assert_close(w_accumulated[name], w_merged[name], rtol=0, atol=2e-6, msg=name)


def test_a_packed_step_equals_the_padded_step(small_corpus, tmp_path, one_thread):
    """train.packed: the same sentences in packed rows give the padded step's loss, gradient norm and weights."""
    base = small_config(small_corpus, valid=False, max_steps=1, save_every=1, log_every=1, max_tokens=100_000)
    padded = train(config_from_dict(base), tmp_path / "padded")
    cfg = {**base, "train": {**base["train"], "packed": True, "pack_row_tokens": 64}}
    packed = train(config_from_dict(cfg), tmp_path / "packed")
    (a,), (b,) = read_metrics(padded), read_metrics(packed)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    w_padded, w_packed = weights_at(padded, 1), weights_at(packed, 1)
    d = w_padded["encoder.0.self_attn.qkv.bias"].numel() // 3
    for name in w_padded:
        a, b = w_packed[name], w_padded[name]
        if name.endswith("qkv.bias") or name.endswith("kv.bias"):
            # The key bias's gradient is zero (softmax ignores a score added to every key) up to rounding noise,
            # which Adam's first step, a step of lr whatever the gradient's size, turns into a full step either way.
            keys = slice(d, 2 * d) if name.endswith("qkv.bias") else slice(0, d)
            a, b = torch.cat([a[: keys.start], a[keys.stop :]]), torch.cat([b[: keys.start], b[keys.stop :]])
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("accum_steps", [1, 2])
def test_max_epochs_stops_after_that_many_passes_over_the_data(small_corpus, tmp_path, accum_steps):
    cfg = small_config(small_corpus, valid=False, max_steps=1000, max_tokens=400, log_every=1, save_every=1000)
    cfg["train"].update(max_epochs=2, accum_steps=accum_steps)
    run = train(config_from_dict(cfg), tmp_path / "run")
    (per_epoch,) = batch_counts(run, [400])
    assert per_epoch > 2 and 2 * per_epoch % accum_steps == 0
    assert [r["step"] for r in read_metrics(run)][-1] == 2 * per_epoch // accum_steps


# ---------------------------------------------------------------------------------------------------------
# Validation numbers.
# ---------------------------------------------------------------------------------------------------------


def test_validation_loss_and_bleu_equal_hand_computations(toy_corpus, tmp_path, one_thread):
    """valid_loss: label-smoothed loss per target token of the kept weights; valid_bleu: sacreBLEU on greedy output."""
    n_bleu = 30  # of the 100 validation pairs
    cfg = tiny_config(toy_corpus, max_steps=100, eval_every=100, save_every=100, lr=1e-2, warmup_steps=20)
    cfg["train"]["valid_bleu_sentences"] = n_bleu
    run = train(config_from_dict(cfg), tmp_path / "run")
    (row,) = [r for r in read_metrics(run) if "valid_loss" in r]
    model, cfg, tokenizer = load_checkpoint(run)
    srcs = toy_corpus["valid.src"].read_text(encoding="utf-8").splitlines()
    refs = toy_corpus["valid.tgt"].read_text(encoding="utf-8").splitlines()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for s, t in zip(tokenizer.encode_src(srcs), tokenizer.encode_tgt(refs), strict=True):
            logits = model(torch.tensor([[*s, EOS_ID]]), torch.tensor([[BOS_ID, *t]]))  # (1, T, V)
            target = torch.tensor([*t, EOS_ID])
            total += F.cross_entropy(
                logits[0], target, ignore_index=PAD_ID, label_smoothing=cfg.train.label_smoothing, reduction="sum"
            ).item()
            tokens += len(target)
    assert row["valid_loss"] == pytest.approx(total / tokens, rel=1e-5)
    translator = Translator.from_checkpoint(run)
    greedy = translator.translate(srcs[:n_bleu], beam_size=1)
    assert row["valid_bleu"] == pytest.approx(BLEU().corpus_score(greedy, [refs[:n_bleu]]).score, abs=1e-9)
    # The test tells greedy from beam search and the first n_bleu sentences from all of them.
    beam = translator.translate(srcs[:n_bleu], beam_size=2)
    assert BLEU().corpus_score(beam, [refs[:n_bleu]]).score != pytest.approx(row["valid_bleu"], abs=1e-6)
    everything = translator.translate(srcs, beam_size=1)
    assert BLEU().corpus_score(everything, [refs]).score != pytest.approx(row["valid_bleu"], abs=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Ctrl-C.
# ---------------------------------------------------------------------------------------------------------


def test_ctrl_c_checkpoints_the_last_step_and_resumes_bit_exact(small_corpus, tmp_path, monkeypatch, one_thread):
    """SIGINT during step 8 ends the run after step 8 with a checkpoint of it; resuming ends as an unbroken run."""
    cfg = small_config(small_corpus, max_steps=12, log_every=1, eval_every=6, save_every=5, keep_last=10)
    cfg["model"]["dropout"] = 0.1  # the resumed run must draw the same dropout masks
    cfg = config_from_dict(cfg)
    whole = train(cfg, tmp_path / "whole")

    handler, interrupted = signal.getsignal(signal.SIGINT), []

    def lr_at_with_ctrl_c(step, *args, **kwargs):
        if step == 8 and not interrupted:  # asked at the start of step 8
            assert signal.getsignal(signal.SIGINT) is not handler, "train installed no Ctrl-C handler"
            interrupted.append(step)
            signal.raise_signal(signal.SIGINT)
        return lr_at(step, *args, **kwargs)

    monkeypatch.setattr(train_module, "lr_at", lr_at_with_ctrl_c)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run)
    assert interrupted and signal.getsignal(signal.SIGINT) is handler  # and train gave the handler back
    assert [r["step"] for r in read_metrics(run) if "loss" in r][-1] == 8
    assert [s for s, _ in step_dirs(run)] == [5, 8]
    assert_equal_weights(weights_at(run, 5), weights_at(whole, 5))
    train(cfg, run)
    assert_equal_weights(weights_at(run, 12), weights_at(whole, 12))
    assert_equal_weights(read_weights(run / WEIGHTS), read_weights(whole / WEIGHTS))
    untimed = [[{k: v for k, v in r.items() if k not in TIMED} for r in read_metrics(d)] for d in (run, whole)]
    assert untimed[0] == untimed[1]


def test_train_compile_wraps_the_step_model_and_keeps_the_weights(small_corpus, tmp_path, monkeypatch):
    """train.compile reaches the step's model: a torch.compile wrapper around the model whose weights are saved."""
    model = Transformer(config_from_dict(tiny_config(small_corpus)).model)
    compiled = train_module.step_model(model, Runtime(0, 1, torch.device("cpu"), "fp32"), compile=True)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) and compiled._orig_mod is model
    assert train_module.step_model(model, Runtime(0, 1, torch.device("cpu"), "fp32")) is model
    asked = []
    real = train_module.step_model
    monkeypatch.setattr(train_module, "step_model", lambda m, rt, compile: asked.append(compile) or real(m, rt))
    train(config_from_dict(tiny_config(small_corpus, max_steps=1, compile=True)), tmp_path / "run")
    assert asked == [True]


@pytest.mark.slow
def test_one_process_checks_the_clock_every_step(small_corpus, tmp_path):
    """max_minutes ends a run at the step where time runs out, not at the next log row (here 10,000 steps on)."""
    cfg = tiny_config(small_corpus, max_steps=100_000, max_minutes=0.02, log_every=10_000)
    cfg["train"].update(eval_every=100_000, save_every=100_000)
    start = time.perf_counter()
    run = train(config_from_dict(cfg), tmp_path / "run")
    assert time.perf_counter() - start < 60
    (steps, _), *_ = step_dirs(run)
    assert 1 <= steps < 2_000


def test_a_finished_run_started_again_reads_no_corpus_and_draws_no_epoch(small_corpus, tmp_path, monkeypatch):
    """The cached restart: no corpus file is read (binarize's cache hits) and no epoch is drawn to be thrown away."""
    cfg = config_from_dict(tiny_config(small_corpus, max_steps=4, eval_every=4, save_every=4))
    train(cfg, tmp_path / "run")
    calls = []
    for module, name in ((prepare_module, "check_split"), (train_module, "epoch_batches")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))
    before = read_weights(tmp_path / "run" / WEIGHTS)
    train(cfg, tmp_path / "run")
    assert calls == []
    after = read_weights(tmp_path / "run" / WEIGHTS)
    assert all(torch.equal(before[k], after[k]) for k in before)
