"""Failure injection for tests, the demo and benchmarks - never for a pipeline's own code."""

from __future__ import annotations

from broker.task import TaskContext


def skip_ack(ctx: TaskContext) -> None:
    """Send no event for this input, as if its ack were lost: its source record then
    completes only through its timeout and a replay."""
    ctx._unacked = True
