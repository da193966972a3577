"""On a CUDA GPU: bf16 and fp16 training steps, an fp16 run resumed bit-exact with its loss scaler, decoding equal
to the CPU's in float32, train.compile, and packed batches (the varlen kernel) equal to padded ones. Marked `cuda`:
skipped without a GPU (scripts/gpu_check.sh runs them)."""

import json
import math
import os
import signal

import pytest
import torch
from conftest import KEPT, decoding, random_src, random_transformer, tied_pair, tiny_config, tokens

from nanomt.core.checkpoint import WEIGHTS, load_trainer_state, read_weights, step_dirs
from nanomt.core.config import config_from_dict
from nanomt.decoding.beam import beam_search
from nanomt.decoding.greedy import greedy
from nanomt.training import train as train_module
from nanomt.training.data import collate, pack
from nanomt.training.synthetic import write_corpus
from nanomt.training.train import lr_at, train

pytestmark = pytest.mark.cuda
# cuBLAS picks a reduction order per workspace; a fixed workspace makes its products repeatable (PyTorch's
# reproducibility notes). Read when cuBLAS starts, so set before any test touches the GPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("cuda"), pairs=400, seed=0, valid=20, test=1)


@pytest.fixture
def deterministic():
    """Kernels that give the same bits every call (the attention backward and cuBLAS included), or an error."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def cuda_config(corpus, **train) -> dict:
    return tiny_config(corpus, device="cuda", **train)


def losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def assert_equal_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_run_on_cuda_learns(corpus, tmp_path, precision):
    run = train(config_from_dict(cuda_config(corpus, precision=precision, max_steps=40, log_every=10)), tmp_path)
    seen = losses(run)  # from ~4.7 at step 10 to ~3.6 at step 40 (bf16 and fp16 alike on an H100)
    assert all(math.isfinite(x) for x in seen) and seen[-1] < seen[0] - 0.5, seen
    weights = read_weights(run / WEIGHTS)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in weights.values())


def test_an_fp16_run_resumed_after_ctrl_c_ends_on_the_same_bits(corpus, tmp_path, monkeypatch, deterministic):
    """The loss scaler's scale and growth count, the CUDA RNG (dropout) and the optimizer come back with the run."""
    cfg = cuda_config(corpus, precision="fp16", max_steps=12, log_every=1, eval_every=6, save_every=5, keep_last=10)
    cfg = config_from_dict(cfg)
    whole = train(cfg, tmp_path / "whole")
    again = train(cfg, tmp_path / "again")
    assert_equal_weights(read_weights(again / WEIGHTS), read_weights(whole / WEIGHTS))  # else nothing can be exact
    # A lost scaler shows in its state (steps since the scale last changed), not in the weights, while no step
    # overflows: both are compared.
    assert load_trainer_state(step_dirs(whole)[0][1])["scaler"]["_growth_tracker"] > 0

    def lr_at_with_ctrl_c(step, *args, **kwargs):
        if step == 8 and not interrupted:
            interrupted.append(step)
            signal.raise_signal(signal.SIGINT)
        return lr_at(step, *args, **kwargs)

    interrupted = []
    monkeypatch.setattr(train_module, "lr_at", lr_at_with_ctrl_c)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run)
    assert [s for s, _ in step_dirs(run)] == [5, 8]
    train(cfg, run)
    assert load_trainer_state(step_dirs(run)[-1][1])["scaler"] == load_trainer_state(step_dirs(whole)[-1][1])["scaler"]
    assert_equal_weights(read_weights(run / WEIGHTS), read_weights(whole / WEIGHTS))
    assert losses(run) == losses(whole)


@pytest.fixture
def no_tf32():
    """float32 matrix products in float32, not TF32's 10-bit mantissas (PyTorch's default for matmul, not cuDNN)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_decoding_on_cuda_gives_the_cpus_tokens_in_float32(no_tf32):
    """Greedy and beam search of a padded batch: the same tokens and (to float rounding) scores on both devices."""
    model = random_transformer(seed=3, vocab=60, layers=2)
    src = random_src([5, 11, 2, 8, 16, 7], seed=1, vocab=60)
    cpu = (tokens(greedy(model, src, decoding(24))), beam_search(model, src, decoding(24, 4, n_best=2)))
    model, src = model.to("cuda"), src.to("cuda")
    gpu = (tokens(greedy(model, src, decoding(24))), beam_search(model, src, decoding(24, 4, n_best=2)))
    assert gpu[0] == cpu[0]
    assert [[h.tokens for h in s] for s in gpu[1]] == [[h.tokens for h in s] for s in cpu[1]]
    for sentence_gpu, sentence_cpu in zip(gpu[1], cpu[1]):
        assert [h.score for h in sentence_gpu] == pytest.approx([h.score for h in sentence_cpu], abs=1e-4)


def test_a_restricted_output_vocabulary_is_set_on_cuda_as_on_the_cpu():
    """set_output_vocab on a model already on the GPU (what training a restricted model does): the CPU's positions."""
    restricted, _ = tied_pair()
    restricted.set_output_vocab(KEPT)
    on_gpu, _ = tied_pair()
    on_gpu.to("cuda").set_output_vocab(KEPT.to("cuda"))
    assert torch.equal(on_gpu.output_index.cpu(), restricted.output_index)
    assert torch.equal(on_gpu.output_ids.cpu(), restricted.output_ids)


def test_train_compile_on_cuda_follows_the_eager_run(corpus, tmp_path):
    """torch.compile's step on a GPU (Triton kernels): the eager run's losses, to float rounding."""
    cfg = cuda_config(corpus, precision="fp32", max_steps=8, log_every=2, eval_every=8, save_every=8)
    cfg["model"]["dropout"] = 0.0  # compiled dropout draws its masks otherwise
    eager = train(config_from_dict(cfg), tmp_path / "eager")
    cfg["train"]["compile"] = True
    compiled = train(config_from_dict(cfg), tmp_path / "compiled")
    assert losses(compiled) == pytest.approx(losses(eager), rel=2e-3)


def packed_and_padded(dtype: torch.dtype | None):
    """The loss and gradients of a padded batch and of the same sentences packed into one row, on the GPU."""
    import numpy as np
    from packed_pairs import IDS, Pairs, loss_and_grads, model

    corpus = Pairs(40, seed=1, max_len=30)
    m = model(n_heads=2).cuda()  # head dim 16: flash kernels want a multiple of 8, 16 is safe
    out = []
    for b in (collate(corpus, np.arange(40), IDS), pack(corpus, np.arange(40), IDS, row_tokens=4096, multiple=8)):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            out.append(loss_and_grads(m, b.to("cuda"), fused=True))
    return out


def test_packed_batches_give_the_padded_loss_and_gradients_on_cuda_in_float32(no_tf32):
    """float32: the block-diagonal mask (the varlen kernel wants half precision), to float rounding."""
    (loss_a, grads_a), (loss_b, grads_b) = packed_and_padded(None)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-5, msg=name)


def test_packed_batches_take_the_varlen_kernel_in_bf16_and_give_the_padded_gradients(monkeypatch):
    """bf16: attention by torch.nn.attention.varlen over the packed row, the padded batch's numbers to bf16 rounding."""
    from nanomt.core import model as model_module

    if model_module.varlen_kernel() is None:
        pytest.skip("this PyTorch has no torch.nn.attention.varlen")
    calls = []
    real = model_module.varlen_attn
    monkeypatch.setattr(model_module, "varlen_attn", lambda *a, **k: calls.append(1) or real(*a, **k))
    (loss_a, grads_a), (loss_b, grads_b) = packed_and_padded(torch.bfloat16)
    assert len(calls) == 2 + 2 * 2  # 2 encoder layers; 2 decoder layers, self and cross (the backward calls none)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-2, atol=1e-3)
    for name in grads_a:
        a, b = grads_a[name].float(), grads_b[name].float()
        assert (a - b).norm() <= 3e-2 * a.norm() + 1e-6, name


def test_a_packed_bf16_run_on_cuda_learns(corpus, tmp_path):
    run = train(
        config_from_dict(cuda_config(corpus, precision="bf16", max_steps=40, log_every=10, packed=True)), tmp_path
    )
    seen = losses(run)
    assert all(math.isfinite(x) for x in seen) and seen[-1] < seen[0] - 0.5, seen
