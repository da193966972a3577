"""Many processes: exact resume of a 2-process run after SIGKILL, two single-process "nodes" equal to one process,
a lost rank ends the others with a clear error, rank 0 binarizes once; a step without host syncs; loss forms."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import NANOMT, tiny_config
from servers import free_port

from nanomt.core import runtime
from nanomt.core.checkpoint import WEIGHTS, TrainState, read_weights, step_dirs
from nanomt.core.config import config_from_dict
from nanomt.core.model import Transformer
from nanomt.training.train import label_smoothed_loss, train

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def write_config(directory, cfg: dict):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def two_ranks(cfg_path, run_dir, *extra):
    """`nanomt train` under torchrun with two processes on this machine."""
    launch = [*TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port())]
    return [*launch, "-m", "nanomt.cli", "train", str(cfg_path), "--run-dir", str(run_dir), *extra]


def children(pid: int) -> list[int]:
    """The ids of a process's child processes (Linux)."""
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def assert_same_weights(a_dir, b_dir, exact=True):
    a, b = read_weights(a_dir / WEIGHTS), read_weights(b_dir / WEIGHTS)
    assert a.keys() == b.keys()
    for name in a:
        if exact:
            assert torch.equal(a[name], b[name]), name
        else:
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_two_process_run_killed_and_resumed_equals_an_unbroken_one(toy_corpus, tmp_path):
    """Dropout on: the resumed ranks must each draw from their own saved RNG state, bit for bit."""
    base = tiny_config(toy_corpus, max_steps=100_000, save_every=3, keep_last=100, eval_every=100_000, log_every=1)
    assert base["model"].get("dropout", 0.1) > 0
    cfg = write_config(tmp_path / "cfg", base)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(two_ranks(cfg, killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not step_dirs(killed) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    ranks = children(proc.pid)
    assert len(ranks) == 2, ranks
    proc.send_signal(signal.SIGKILL)  # the launcher first: it cannot restart or clean up its workers
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate()
    saved = [s for s, _ in step_dirs(killed)]
    assert saved, err
    # Rank 0 binarized the corpus once; rank 1 read its cache.
    assert sum("train:" in line and "(cached)" not in line for line in err.splitlines()) == 1, err
    end = saved[-1] + 7  # resumed mid-run, a few steps on
    resumed = run(two_ranks(cfg, killed, "--set", f"train.max_steps={end}"))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr and f"step_{saved[-1]}" in resumed.stderr
    whole = run(two_ranks(cfg, tmp_path / "whole", "--set", f"train.max_steps={end}"))
    assert whole.returncode == 0, whole.stderr
    assert_same_weights(tmp_path / "whole" / "checkpoints" / f"step_{end}", killed / "checkpoints" / f"step_{end}")


SYNCS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


def count_syncs(monkeypatch) -> list:
    """Patches the tensor-to-Python conversions (each waits for the device) to record their calls."""
    calls = []
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def test_a_step_does_not_wait_for_the_device(toy_corpus, tmp_path, monkeypatch):
    """Host syncs grow with the log intervals, not with the steps: 40 more steps, 2 more log rows."""
    counts = {}
    for steps in (20, 60):
        cfg = tiny_config(toy_corpus, max_steps=steps, log_every=20, eval_every=1000, save_every=1000)
        del cfg["data"]["valid"]  # greedy decoding waits for the device at every token: not the step's business
        with monkeypatch.context() as m:
            calls = count_syncs(m)
            train(config_from_dict(cfg), tmp_path / f"run{steps}")
        counts[steps] = len(calls)
    assert counts[60] - counts[20] <= 2 * 2, counts  # at most 2 a log interval


def test_a_non_finite_loss_is_caught_at_the_next_log_row_before_any_checkpoint_of_it(toy_corpus, tmp_path):
    cfg = tiny_config(toy_corpus, lr=1e30, warmup_steps=1, clip_norm=0.0, save_every=4, log_every=4, eval_every=1000)
    with pytest.raises(Exception, match=r"loss is nan at step 2; .*last good checkpoint is none") as e:
        train(config_from_dict(cfg), tmp_path / "run")
    assert type(e.value).__name__ == "TrainingError"
    assert not step_dirs(tmp_path / "run")


LAUNCHER = """
import os, pathlib, sys, time
import nanomt.training.train
from nanomt.cli import main

real_update, calls = nanomt.training.train.update, []


def update(*args, **kwargs):  # rank 1 fails at its FAIL_AT-th step, after its gradients were all-reduced
    calls.append(1)
    if os.environ["RANK"] == "1" and len(calls) == int(os.environ["FAIL_AT"]):
        pathlib.Path(os.environ["MARK"]).write_text(str(time.time()))
        if os.environ["FAIL_HOW"] == "hangs":
            time.sleep(600)
        raise OSError(28, "No space left on device")
    return real_update(*args, **kwargs)


nanomt.training.train.update = update
main(sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_lost_rank_ends_the_others_with_a_clear_error_in_bounded_time(toy_corpus, tmp_path, how):
    cfg = write_config(tmp_path / "cfg", tiny_config(toy_corpus, max_steps=1000, eval_every=1000, save_every=1000))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    port, timeout = free_port(), 5
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            **dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2"),
            **dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FAIL_AT="3", FAIL_HOW=how),
            **dict(MARK=str(tmp_path / "failed_at"), NANOMT_COLLECTIVE_TIMEOUT=str(timeout)),
        }
        cmd = [sys.executable, str(tmp_path / "launch.py"), "train", str(cfg), "--run-dir", str(tmp_path / "run")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        _, err = procs[0].communicate(timeout=90)
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert procs[0].returncode == 1, err
    waited = ended - float((tmp_path / "failed_at").read_text())
    assert waited < timeout + 15, waited
    last = err.strip().splitlines()[-1]
    assert last.startswith("nanomt: error: rank 0: lost the other ranks"), err
    assert f"NANOMT_COLLECTIVE_TIMEOUT={timeout}" in last


@pytest.mark.slow
def test_two_single_process_nodes_equal_one_process_with_accumulation(toy_corpus, tmp_path):
    """torchrun on two "machines" (both 127.0.0.1) with one process each: the update of one process, accum 2."""
    base = tiny_config(toy_corpus, max_steps=4, save_every=4, eval_every=1000, log_every=1)
    base["model"]["dropout"] = 0.0  # the ranks draw different dropout masks than one process would
    one = write_config(tmp_path / "one_cfg", {**base, "train": {**base["train"], "accum_steps": 2}})
    res = run([*NANOMT, "train", str(one), "--run-dir", str(tmp_path / "one")])
    assert res.returncode == 0, res.stderr
    cfg, port = write_config(tmp_path / "nodes_cfg", base), free_port()
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nnodes", "2", "--nproc-per-node", "1"]
    train_cmd = ["-m", "nanomt.cli", "train", str(cfg), "--run-dir", str(tmp_path / "two")]
    nodes = [
        subprocess.Popen(
            [*TORCHRUN, *rdzv, "--node-rank", str(node), *train_cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        errs = [p.communicate(timeout=300)[1] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in nodes] == [0, 0], errs
    assert_same_weights(tmp_path / "one" / "checkpoints" / "step_4", tmp_path / "two" / "checkpoints" / "step_4", False)


def test_threads_are_the_cores_shared_by_the_processes_of_this_machine(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("WORLD_SIZE", "8")  # two machines of four processes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert runtime.default_threads() == 4
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert runtime.default_threads() == 2


def tiny_model() -> Transformer:
    from nanomt.core.config import ModelConfig

    return Transformer(ModelConfig(20, 20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32))


def test_the_loss_scaler_is_saved_and_restored(tmp_path):
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
    scaler.load_state_dict({**scaler.state_dict(), "scale": 256.0, "_growth_tracker": 3})
    TrainState(step=7).save(tmp_path, model, optimizer, scaler, keep_last=1)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
    state, found = TrainState.resume_or_new(tmp_path, model, optimizer, fresh)
    assert state.step == 7 and found == tmp_path / "checkpoints" / "step_7"
    assert fresh.state_dict() == scaler.state_dict() and fresh.get_scale() == 256.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_loss_of_cuda_equals_the_cpu_loss_in_value_and_gradient(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(3, 30, 50) * 3).to(dtype).requires_grad_()
    target = torch.randint(0, 50, (3, 30))
    target[:, -5:] = 0  # padding
    fused = label_smoothed_loss(logits, target, 0.1, pad_id=0, fused=True)
    blocks = label_smoothed_loss(logits, target, 0.1, pad_id=0)  # the CPU's default
    assert type(blocks.grad_fn).__name__ != type(fused.grad_fn).__name__
    tol = {"rtol": 1e-6, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(fused, blocks, **tol)
    (g_fused,) = torch.autograd.grad(fused * 3.0, logits)
    (g_blocks,) = torch.autograd.grad(blocks * 3.0, logits)
    assert g_fused.dtype == g_blocks.dtype == dtype
    torch.testing.assert_close(g_fused.float(), g_blocks.float(), **tol)


def test_background_collation_follows_the_plan_across_epochs_and_counts_all_ranks_tokens(toy_corpus, tmp_path):
    import threading

    import nanomt.training.train as t

    cfg = config_from_dict(tiny_config(toy_corpus, max_tokens=20000))  # a few batches an epoch
    one = runtime.Runtime(0, 1, torch.device("cpu"), "fp32")
    cfg, data = t.prepare_data(cfg, tmp_path / "run", one)
    names, collate = set(), t.collate
    t.collate = lambda corpus, idx, ids: names.add(threading.current_thread().name) or collate(corpus, idx, ids)
    try:
        n = len(t.epoch_batches(data, 0, cfg, one).batches)
        stream = t.BatchStream(data, 0, n - 2, cfg, one)  # from the end of epoch 0, as a resumed run would
        got = [stream.get() for _ in range(n + 3)]
        stream.close()
    finally:
        t.collate = collate
    assert names == {"nanomt-collate"}
    plan = [(0, n - 2), (0, n - 1), *((1, i) for i in range(n)), (2, 0)]
    assert [(e, i) for e, i, _, _ in got] == plan
    for (epoch, i), (_, _, _, b) in zip(plan, got, strict=True):
        ep = t.epoch_batches(data, epoch, cfg, one)
        assert torch.equal(b.tgt_out, collate(ep.corpus, ep.batches[i], cfg.model.special_ids).tgt_out)
    # Under DDP each rank knows the target tokens of every rank's batch at a position: the loss's denominator.
    ranks = [t.epoch_batches(data, 1, cfg, runtime.Runtime(r, 2, torch.device("cpu"), "fp32")) for r in (0, 1)]
    ids = cfg.model.special_ids
    assert ranks[0].tokens == ranks[1].tokens
    for i in range(len(ranks[0].batches)):
        assert ranks[0].tokens[i] == sum(collate(ep.corpus, ep.batches[i], ids).n_tgt_tokens for ep in ranks)


def test_batches_for_a_gpu_are_padded_to_multiples_of_8_without_changing_the_loss():
    import nanomt.training.train as t
    from nanomt.training.data import Batch

    torch.manual_seed(0)
    model = tiny_model()
    src, tgt = torch.randint(4, 20, (3, 11)), torch.randint(4, 20, (3, 6))
    b = Batch(src=src, tgt_in=tgt, tgt_out=torch.roll(tgt, -1, 1), n_src_tokens=33, n_tgt_tokens=18)
    p = t.pad_width(b, 8, 0)
    assert p.src.shape == (3, 16) and p.tgt_in.shape == p.tgt_out.shape == (3, 8)
    assert torch.equal(p.src[:, :11], src) and (p.src[:, 11:] == 0).all() and (p.tgt_out[:, 6:] == 0).all()
    model.eval()
    losses = [label_smoothed_loss(model(x.src, x.tgt_in), x.tgt_out, 0.1, 0) for x in (b, p)]
    torch.testing.assert_close(losses[0], losses[1])
