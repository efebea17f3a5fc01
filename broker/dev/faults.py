"""Failure injection for tests, the demo and benchmarks - never for a pipeline's own code.

The production classes know nothing of it: ``skip_ack`` puts a filter in front of a task's
writer to ``ns.acks`` from the outside, the first time it is used on that task."""

from __future__ import annotations

from collections import Counter
from typing import Any

from broker.task import Task, TaskContext
from broker.task.acks import Events, TaskAcks


class _LosingAcks:
    """A task's ``TaskAcks`` that loses the events of the srids in ``lost`` (one event per
    count: an input read twice in a batch was skipped once or twice): they leave the batch's
    events before it is sent, as if the event had never been written. Everything else
    (touches, fail marks, undeliverable outputs) goes to the task's writer unchanged."""

    def __init__(self, task: Task, acks: TaskAcks) -> None:
        self._task = task
        self._acks = acks
        self.lost: Counter[int] = Counter()
        self.skipped = 0

    def send(self, events: Events) -> None:
        """The batch's events without those of ``lost`` (noted while its handler ran)."""
        lost, self.lost = self.lost, Counter()
        if lost:
            kept = []
            for srid, xor in zip(events.srids, events.xors, strict=True):
                if lost[srid] > 0:
                    lost[srid] -= 1
                else:
                    kept.append((srid, xor))
            dropped = len(events.srids) - len(kept)
            events.srids[:] = [s for s, _ in kept]
            events.xors[:] = [x for _, x in kept]
            self.skipped += dropped
            self._task.counters.acked -= dropped  # the task counted them acked as it settled them
        self._acks.send(events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._acks, name)


def _losing(task: Task) -> _LosingAcks:
    acks = task._acks
    if isinstance(acks, _LosingAcks):
        return acks
    losing = _LosingAcks(task, acks)
    task._acks = losing  # type: ignore[assignment]  # the same interface, by delegation
    return losing


def skip_ack(ctx: TaskContext) -> None:
    """Send no event for this input, as if its ack were lost: its source record then
    completes only through its timeout and a replay. A failed (``ctx.fail``) or untracked
    input is left as it is: it has no event to lose."""
    tracking = ctx.record.tracking
    if tracking is not None and ctx.failed is None:
        task = ctx._task
        assert isinstance(task, Task), "skip_ack needs a TaskContext of a Task"
        _losing(task).lost[tracking.srid] += 1


def skipped_acks(task: Task) -> int:
    """The events ``skip_ack`` kept ``task`` from sending."""
    acks = task._acks
    return acks.skipped if isinstance(acks, _LosingAcks) else 0
