"""The processes of a run under DDP: rank 0's work first while the others wait, rank 0's values on every rank, a
lost rank as a clear error; and Ctrl-C as a request to stop after a whole step."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading

import torch.distributed as dist

from nanomt.core import runtime
from nanomt.core.runtime import Runtime
from nanomt.training.errors import TrainingError


def first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def main_rank_first(rt: Runtime, what: str, fn):
    """fn() on rank 0 while the other ranks wait (they get None); its failure is every rank's, said clearly."""
    if rt.world == 1:
        return fn()
    status = [None]  # rank 0's error, if any
    if rt.is_main:
        try:
            return fn()
        except BaseException as e:
            status[0] = f"{type(e).__name__}: {e}"
            raise
        finally:
            dist.broadcast_object_list(status, src=0, group=rt.host_group)
    try:  # waits up to PREPARE_TIMEOUT_ENV's seconds (the host group's timeout), not the collective timeout
        dist.broadcast_object_list(status, src=0, group=rt.host_group)
    except RuntimeError as e:
        raise TrainingError(f"rank {rt.rank}: rank 0 died or timed out while {what} ({first_line(e)})") from None
    if status[0] is not None:
        raise TrainingError(f"rank {rt.rank}: rank 0 failed while {what}: {status[0]}")
    return None


def rank0_value(value, rt: Runtime):
    """Rank 0's value of a (picklable) value, on every rank."""
    if rt.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=rt.host_group)
    return box[0]


def lost_ranks_fail_clearly(fn):
    """Under DDP, a collective that fails or times out (another rank died or hangs) is a TrainingError saying so."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:  # torch.distributed's errors (DistError and the backends') are RuntimeErrors
            if not (dist.is_initialized() and dist.get_world_size() > 1) or isinstance(e, TrainingError):
                raise
            if not (isinstance(e, dist.DistError) or any(w in str(e) for w in ("Gloo", "gloo", "NCCL", "nccl"))):
                raise
            timeout = runtime.env_seconds(runtime.COLLECTIVE_TIMEOUT_ENV, runtime.COLLECTIVE_TIMEOUT_S)
            raise TrainingError(
                f"rank {dist.get_rank()}: lost the other ranks: a collective failed, or waited longer than "
                f"{runtime.COLLECTIVE_TIMEOUT_ENV}={timeout:g} seconds; another rank died or hangs (its log says "
                f"why). {first_line(e)}"
            ) from e

    return wrapper


@contextlib.contextmanager
def sigint_requests_stop(enabled: bool):
    """Within the block, Ctrl-C sets the event instead of raising, so the loop can stop after a whole step."""
    stop = threading.Event()
    if not (enabled and runtime.is_main_thread()):
        yield stop
        return
    old = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, old)
