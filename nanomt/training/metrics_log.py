"""metrics.jsonl, one JSON object a log step or evaluation: its writer (MetricsLog), the Window of steps a log row
sums up, and its reader (read_metrics)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from nanomt.training.errors import TrainingError

if TYPE_CHECKING:  # the reader needs neither
    from nanomt.core.checkpoint import TrainState
    from nanomt.core.runtime import Runtime


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl (rank 0 only), optionally mirrored to TensorBoard."""

    def __init__(self, path: Path, enabled: bool, resume_step: int, tensorboard: bool):
        self.path, self.enabled, self.writer = path, enabled, None
        if not enabled:
            return
        if path.is_file():  # rows past the checkpoint belong to the lost part of a killed run
            rows = [r for r in path.read_text(encoding="utf-8").splitlines() if r.strip()]
            kept = [r for r in rows if json.loads(r).get("step", 0) <= resume_step]
            path.write_text("".join(r + "\n" for r in kept), encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TrainingError("train.tensorboard=true needs the tensorboard package") from None
            self.writer = SummaryWriter(str(path.parent / "tensorboard"))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, int | float):
                    self.writer.add_scalar(k, v, row["step"])


class Window:
    """The steps since the last log row; their losses and gradient norms stay on the device until read."""

    def __init__(self, step: int):
        self.mark = time.perf_counter()  # the run's clock: state.elapsed counts the time up to here
        self.reset(step)

    def reset(self, step: int) -> None:
        self.first_step, self.losses, self.norms, self.tokens = step + 1, [], [], 0
        self.start, self.paused = time.perf_counter(), 0.0

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int) -> None:
        self.losses.append(loss)
        self.norms.append(grad_norm)
        self.tokens += tokens

    @contextlib.contextmanager
    def pause(self):
        """Time in the block (evaluation, checkpoints) is not training time for tokens/s."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.paused += time.perf_counter() - t0

    def tick(self, state: TrainState, rt: Runtime) -> None:
        """One process: the clock moves every step (it needs no exchange), so max_minutes and the lr follow it."""
        if rt.world == 1:
            now = time.perf_counter()
            state.elapsed, self.mark = state.elapsed + now - self.mark, now

    def read(self, state: TrainState, stop: bool, rt: Runtime) -> tuple[list[float], list[float], bool]:
        """The losses (mean over the ranks) and gradient norms of the steps so far, and whether a rank stops.

        The loop's one wait for the device, and under DDP its one exchange of host values: state.elapsed
        becomes rank 0's clock, so that every rank computes the same lr and stops at the same step.
        """
        now = time.perf_counter()
        clock = state.elapsed + now - self.mark if rt.is_main else 0.0
        self.mark = now
        values = torch.stack([*self.losses, *self.norms]).double()
        values = torch.cat([values, torch.tensor([clock, float(stop)], dtype=torch.float64).to(rt.device)])
        if rt.world > 1:
            dist.all_reduce(values)  # sums: the other ranks' clocks are 0
        *values, state.elapsed, stops = values.tolist()
        n = len(self.losses)
        return [v / rt.world for v in values[:n]], [v / rt.world for v in values[n:]], stops > 0

    def row(self, state: TrainState, losses: list[float], norms: list[float], lr: float, padding: float) -> dict:
        """The log row of the steps read: their mean loss, the last gradient norm, tokens/s of training time."""
        seconds = time.perf_counter() - self.start - self.paused
        return {
            "step": state.step,
            "epoch": state.epoch,
            "loss": sum(losses) / len(losses),
            "lr": lr,
            "tokens_per_s": self.tokens / max(seconds, 1e-9),
            "grad_norm": norms[-1],
            "padding": padding,
            "elapsed_s": round(state.elapsed, 2),
        }


def read_metrics(metrics_path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl file; blank lines skipped, a malformed line is an error naming it."""
    metrics_path = Path(metrics_path)
    if not metrics_path.is_file():
        raise FileNotFoundError(f"metrics file not found: {metrics_path}")
    rows = []
    for number, line in enumerate(metrics_path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{metrics_path}:{number}: not a JSON object: {e}") from e
        if not isinstance(row, dict):
            raise ValueError(f"{metrics_path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    if not rows:
        raise ValueError(f"metrics file is empty: {metrics_path}")
    return rows
