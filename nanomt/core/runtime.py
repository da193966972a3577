"""Hardware facts and workarounds in one place: device, precision, allocator, threads, processes."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import logging
import os
import sys
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

# oneDNN's kernel cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY) is raised by nanomt/__init__.py, which runs before this
# module and so before torch is imported here: oneDNN reads it when it makes its first kernel.

log = logging.getLogger("nanomt")


class DeviceError(ValueError):
    """A device or precision this machine cannot provide."""


def pick_device(name: str | torch.device, option: str = "train.device") -> torch.device:
    """`auto` is CUDA when present, else the CPU; a device (named, or a torch.device) this build or machine lacks is
    a DeviceError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise DeviceError(f"{option} {name}: not a device name (cpu, cuda, cuda:N, mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{option} {name}: CUDA is not available (a CPU-only PyTorch build, or no GPU visible)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"{option} {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"{option} {name}: MPS is not available on this machine")
    return dev


@functools.cache
def cpu_has_bf16_kernels() -> bool:
    """Whether oneDNN has bf16 matmul kernels for this CPU (AVX-512 or AMX); else bf16 falls to a scalar loop."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a PyTorch without this (private) query: fp32 is the safe choice
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is bf16 where the device has bf16 matrix kernels, else fp32; other settings are kept as they are."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        # Not counting emulation: pre-Ampere GPUs (V100, T4) "support" bf16 at a fraction of their fp32 speed.
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_bf16_kernels() else "fp32"


def autocast(precision: str, device: torch.device):
    """Mixed-precision context for the forward pass; the caller owns it, the model knows nothing of it."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise DeviceError("train.precision=fp16 needs CUDA; use bf16 on the CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt parameters (<malloc.h>)


def user_allocator_settings() -> list[str]:
    """The environment variables by which the user chose glibc malloc settings or another allocator."""
    return [k for k in os.environ if k in ("GLIBC_TUNABLES", "LD_PRELOAD") or k.startswith("MALLOC_")]


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve large blocks from its heap and keep what is freed; False where it did nothing."""
    # By default glibc gives each block over its mmap threshold (at most 32 MB, so a step's (B*T, V) logits and
    # their gradient) pages of its own and unmaps them on free: every step faulted ~50,000 fresh pages in again,
    # 1.09-1.25x of the Multi30k fp32 step, 1.01-1.06x of the bf16 one (docs/performance.md). Allocator
    # settings of the user's own win.
    if sys.platform != "linux" or user_allocator_settings():
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: their own malloc
        return False
    return libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**30) == 1


def is_main_thread() -> bool:
    """Signal handlers can only be installed from the main thread."""
    return threading.current_thread() is threading.main_thread()


# Seconds a rank waits in a collective for the others before it gives up with an error, instead of hanging when
# another rank died or hangs (NCCL and Gloo: every all-reduce, barrier and broadcast of the process group).
COLLECTIVE_TIMEOUT_ENV = "NANOMT_COLLECTIVE_TIMEOUT"
COLLECTIVE_TIMEOUT_S = 1800.0
# Seconds the other ranks wait for rank 0 to train the tokenizer and binarize the corpus, which on a large corpus
# takes far longer than any collective should.
PREPARE_TIMEOUT_ENV = "NANOMT_PREPARE_TIMEOUT"
PREPARE_TIMEOUT_S = 6 * 3600.0


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable `name`, else `default`."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{name}={value!r}: want a positive number of seconds")
    return seconds


@dataclass(frozen=True)
class Runtime:
    """Where this process trains: its rank among `world` processes, its device and the precision it computes in."""

    rank: int
    world: int
    device: torch.device
    precision: str  # resolved: fp32, bf16 or fp16
    # Under DDP: a Gloo group over the same ranks for host-side objects (RNG states, translations) and for the
    # long wait while rank 0 prepares the data; its timeout is PREPARE_TIMEOUT_ENV's.
    host_group: object = None
    collective_timeout: float = COLLECTIVE_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def default_threads() -> int:
    """CPU threads per process: the cores shared by the processes of this machine (not of all machines)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return max(1, (os.cpu_count() or 1) // max(local_world, 1))


def setup(device: str, precision: str, num_threads: int | None) -> Runtime:
    """Start the process group under torchrun, pick the device and precision, set the CPU threads."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dev = pick_device(device)
    if world > 1 and dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)  # before the process group: NCCL and every default-device tensor use this GPU
    timeout = env_seconds(COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S)
    host_group = None
    if world > 1:
        if not dist.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        prepare = datetime.timedelta(seconds=env_seconds(PREPARE_TIMEOUT_ENV, PREPARE_TIMEOUT_S))
        host_group = dist.new_group(backend="gloo", timeout=prepare)
    rank = dist.get_rank() if world > 1 else 0
    torch.set_num_threads(num_threads or default_threads())
    resolved = resolve_precision(precision, dev)
    autocast(resolved, dev)  # a DeviceError now (fp16 on a CPU) rather than at the first step
    if rank == 0 and resolved == "bf16" and dev.type == "cpu" and not cpu_has_bf16_kernels():
        # An AVX2-only CPU: PyTorch's fallback bf16 matmul is a scalar loop (0.9 against 51 GFLOP/s in fp32).
        log.warning(
            "train.precision=bf16 on a CPU without bf16 matrix kernels (no AVX-512/AMX): ~60x slower "
            "than fp32; use train.precision=auto or fp32"
        )
    return Runtime(rank, world, dev, resolved, host_group, timeout)
