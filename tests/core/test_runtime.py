"""Runtime: precision from the CPU's kernels, malloc that keeps freed memory, oneDNN's kernel cache, devices."""

import json
import logging
import os
import platform
import subprocess
import sys

import pytest
import torch
from conftest import tiny_config

from nanomt.core import runtime
from nanomt.core.config import config_from_dict
from nanomt.core.runtime import DeviceError, autocast, pick_device, resolve_precision
from nanomt.training.train import train


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kernels", [True, False])
def test_auto_precision_is_bf16_only_on_a_cpu_with_bf16_kernels(monkeypatch, kernels):
    monkeypatch.setattr(runtime, "cpu_has_bf16_kernels", lambda: kernels)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == ("bf16" if kernels else "fp32")
    assert [resolve_precision(p, cpu) for p in ("fp32", "bf16")] == ["fp32", "bf16"]  # explicit settings stay
    a = torch.randn(4, 8)
    with autocast("auto", cpu):
        assert (a @ a.T).dtype == (torch.bfloat16 if kernels else torch.float32)


def test_bf16_on_a_cpu_without_bf16_kernels_trains_with_one_warning(toy_corpus, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(runtime, "cpu_has_bf16_kernels", lambda: False)
    malloc_calls = []  # and a CPU run sets up malloc once (test_training_reuses_freed_memory_...)
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: malloc_calls.append(1) or True)
    cfg = config_from_dict(
        tiny_config(toy_corpus, max_steps=2, eval_every=100, save_every=100, precision="bf16", device="cpu")
    )
    with caplog.at_level(logging.WARNING, logger="nanomt"):
        train(cfg, tmp_path / "run")
    assert malloc_calls == [1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "train.precision=auto or fp32" in warnings[0]
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [2]


FAULTS_CODE = """
import resource, sys, torch
from nanomt.core.runtime import keep_freed_memory
if sys.argv[1] != "default":  # "keep", or "user" where the user set allocator variables
    assert keep_freed_memory() == (sys.argv[1] == "keep")
def faults(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        torch.ones(16 * 2**20)  # 64 MB allocated, written and freed, as a step's logits
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
# Warm-up: torch's 64-byte-aligned allocations leave small head/tail pieces that glibc parks in its per-thread
# cache (7 per size) without merging them back, so the freed block is too small for the next request until those
# slots are full; 1 to 8 iterations of fresh pages depending on the heap's layout, then none for good.
faults(24)
print(faults(10))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc settings")
@pytest.mark.slow
def test_training_reuses_freed_memory_instead_of_faulting_it_in_again():
    chosen = set(runtime.user_allocator_settings())
    env = {k: v for k, v in os.environ.items() if k not in chosen}
    faults = {
        mode: int(
            subprocess.run(
                [sys.executable, "-c", FAULTS_CODE, mode], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        for mode in ("default", "keep")
    }
    if faults["default"] < 10 * 1000:
        pytest.skip(f"this kernel maps large blocks without per-page faults ({faults['default']} faults)")
    assert faults["keep"] < faults["default"] / 20  # ~16,000 fresh 4 KB pages per block by default, ~0 kept
    env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_max=65536"  # the user's own setting is left alone
    res = subprocess.run([sys.executable, "-c", FAULTS_CODE, "user"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_onednn_kernel_cache_is_raised_unless_the_user_set_it():
    """Importing nanomt raises oneDNN's kernel cache (length-bucketed batches thrash 1,024); a user's value wins."""
    code = "import os, nanomt; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert default.stdout.strip() == "65536"
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "2048"
    user = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert user.stdout.strip() == "2048"


def test_a_device_this_machine_lacks_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="train.device cuda: CUDA is not available"):
        pick_device("cuda")
    with pytest.raises(DeviceError, match="train.device gpu0: not a device name"):
        pick_device("gpu0")
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(DeviceError, match="fp16 needs CUDA"):
        autocast("fp16", torch.device("cpu"))
