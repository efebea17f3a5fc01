"""A handler's side of a task: its inputs (``TaskRecord``), what it does with each
(``TaskContext``: emit, output, touch, fail, reject) and how that becomes the input's event or
fail mark (``settle``, ``fail_all``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from broker import ids
from broker.errors import ConfigurationError
from broker.headers import (
    H_ORIGIN,
    H_PATH,
    H_TRACKING,
    Headers,
    Tracking,
    as_bytes,
    child_path_header,
    path_of,
    user_headers,
)
from broker.ids import encode_id
from broker.retry import checked_retry_after_ms
from broker.serde import BYTES, Serde
from broker.task.acks import Events
from broker.task.config import TaskConfig, TaskCounters

log = logging.getLogger(__name__)


class PutBack(Exception):  # a signal inside Task.handle_batch, never raised out of it
    """The handler met an outage exception (``TaskConfig.outage``): put ``records`` back."""

    def __init__(self, records: list[TaskRecord]) -> None:
        super().__init__()
        self.records = records

class TaskRecord(NamedTuple):
    """One input of a handler: where it was read, its key, value (bytes) and headers, and its
    tracking (None for an untracked record). ``decoded()`` is the value through the task's
    serde (``TaskConfig.serde``)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    tracking: Tracking | None
    serde: Serde = BYTES

    def decoded(self) -> Any:
        """The value deserialized by the task's serde (decoded on each call); raises
        ``SerializationError`` - which fails the input - when it cannot be."""
        return self.serde.deserialize(self.value)


def _record(
    key: bytes | str | None, value: Any, headers: list[tuple[str, bytes | None]], partition: int | None, serde: Serde
) -> dict[str, Any]:
    """Produce arguments of one record; no partition lets the producer's partitioner choose."""
    kwargs: dict[str, Any] = {"key": as_bytes(key), "value": serde.serialize(value), "headers": headers}
    if partition is not None:
        kwargs["partition"] = partition
    return kwargs


class TaskSide(Protocol):
    """What a ``TaskContext`` uses of its task (``broker.task.service.Task``)."""

    config: TaskConfig
    counters: TaskCounters

    def serde(self, topic: str) -> Serde: ...

    def emit_record(self, topic: str, record: dict[str, Any]) -> None:
        """A child, tracked: its tree waits for its ack."""
        ...

    def output_record(self, topic: str, srid: int | None, record: dict[str, Any]) -> None:
        """A sink output: delivered before its input's event goes out."""
        ...

    def touch_input(self, srid: int, deadline_ms: int) -> None: ...


class TaskContext:
    """Handed to user code for one input record. A pipeline's records end in one of three
    ways: ``emit`` a child into a topic another task reads (tracked: the tree waits for it);
    ``output`` a record out of the pipeline (untracked: the last hop); or neither - the
    handler wrote to the outside world itself - and return. Returning acks the input;
    ``fail`` replays it instead, ``reject`` dead-letters it at once."""

    __slots__ = ("_task", "children", "children_xor", "failed", "record", "rejected", "retry_after_ms")

    def __init__(self, task: TaskSide, record: TaskRecord) -> None:
        self._task = task
        self.record = record
        self.children_xor = 0
        self.children = 0
        self.failed: str | None = None
        self.rejected = False
        self.retry_after_ms: int | None = None

    def emit(
        self,
        topic: str,
        key: bytes | str | None,
        value: Any,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> int:
        """Produce a child anchored to the input's tree; returns its record id. The tree
        completes only once a task reads and acks the child: ``topic`` must be an input of a
        running task (a topic nobody reads holds its record until it is replayed, and at
        last dead-lettered). The last hop of a pipeline is ``output``.

        ``value``: bytes as they are, anything else through ``TaskConfig.serde``. Untracked
        inputs produce untracked children (plain records)."""
        user = list(user_headers(headers))
        tracking = self.record.tracking
        child_id = 0
        if tracking is not None:
            child_id = ids.new_id()
            self.children_xor ^= child_id
            user.append((H_TRACKING, tracking.child(child_id)))
            # rb-path: its emit index, the same child on every attempt, different per sibling.
            user.append(child_path_header(self.record.headers, self.children))
        self._task.emit_record(topic, _record(key, value, user, partition, self._task.serde(topic)))
        self.children += 1
        return child_id

    def output(
        self,
        topic: str,
        key: bytes | str | None,
        value: Any,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        """The last hop: write a result out of the pipeline - a sink record, untracked: nothing
        downstream acks it. It is delivered before the input is acked, so a tree never
        completes without its outputs (one that stays undeliverable fails the input instead).
        Carries ``rb-origin`` and ``rb-path`` (the output identity): a replay writes the same
        output again, and sinks deduplicate on the pair."""
        user = list(user_headers(headers))
        tracking = self.record.tracking
        if tracking is not None:
            # The output identity (docs/design.md §8): origin + the input's path.
            user += [(H_ORIGIN, encode_id(tracking.origin)), (H_PATH, path_of(self.record.headers).encode())]
        self._task.output_record(topic, None if tracking is None else tracking.srid,
                                 _record(key, value, user, partition, self._task.serde(topic)))

    def touch(self, timeout_ms: int | None = None) -> None:
        """Push the input's source record's deadline forward to now + ``timeout_ms``
        (default ``TaskConfig.touch_timeout_ms``) - Storm's ``resetTimeout`` - so work that
        takes longer than the record's timeout is not replayed while it runs. Call it
        periodically during long work. The touch goes out at once, to ``ns.acks[srid mod P]``
        with the task's producer, ahead of the input's event; the acker never shortens a
        deadline with it and ignores it once the record is decided. Untracked input: nothing."""
        tracking = self.record.tracking
        if tracking is None:
            return
        timeout = self._task.config.touch_timeout_ms if timeout_ms is None else timeout_ms
        self._task.touch_input(tracking.srid, int(time.time() * 1000) + timeout)

    def fail(self, reason: str = "failed", retry_after_ms: int | None = None) -> None:
        """Fail the input's source record now: the acker replays it (or sends it to the DLQ).

        ``retry_after_ms``: how long the replay waits, instead of the source's back-off
        (``SourceConfig.retry``; without one it waits too) - a rate limit's ``Retry-After``, say.
        0 replays it at once; at most ``broker.retry.MAX_RETRY_AFTER_MS`` (24 h); anything else
        raises ValueError (the input is then failed by the exception, with the back-off)."""
        self.retry_after_ms = None if retry_after_ms is None else checked_retry_after_ms(retry_after_ms)
        self.failed = reason

    def reject(self, reason: str = "rejected") -> None:
        """Dead-letter the input's source record now, whatever attempts it has left: it fails
        the same way every time (a malformed record, a permanent error). ``reason`` goes into
        its DLQ record."""
        self.failed = reason
        self.rejected = True


Handler = Callable[[TaskRecord, TaskContext], None]
Offsets = dict[tuple[str, int], int]  # the offset to commit per (topic, partition)
BatchHandler = Callable[[list[TaskRecord], list[TaskContext]], None]
"""A handler of a poll batch at once: ``contexts[i]`` is ``records[i]``'s, with the handler's
semantics per input (emit, output, fail, touch; returning acks every input not failed). An
exception fails every input not failed already."""


def _no_handler(_record: TaskRecord, _ctx: TaskContext) -> None:
    raise ConfigurationError("a Task with a batch_handler has no per-record handler")


def settle(ctx: TaskContext, events: Events, counters: TaskCounters) -> None:
    """The input's event (``input.id ^ children``) or fail mark, in ``events``."""
    if ctx.children:
        counters.emitted += ctx.children
    tracking = ctx.record.tracking
    if tracking is None:
        counters.untracked += 1
    elif ctx.rejected:
        events.rejected[tracking.srid] = ctx.failed or "rejected"
        counters.rejected += 1
    elif ctx.failed is not None:
        events.failed.append(tracking.srid)
        if ctx.retry_after_ms is not None:
            events.retry_after_ms[tracking.srid] = ctx.retry_after_ms
        counters.failed += 1
    else:
        events.srids.append(tracking.srid)
        events.xors.append(tracking.record_id ^ ctx.children_xor)
        counters.acked += 1


def fail_all(exc: Exception, contexts: list[TaskContext], fatal: bool = False) -> None:
    """User code raised: fail its inputs (replay; ``fatal``: reject them, the DLQ record
    naming the exception's class), in one log line."""
    if len(contexts) == 1:
        r = contexts[0].record
        log.warning("handler failed on %s[%d]@%d: %r", r.topic, r.partition, r.offset, exc)
    elif contexts:
        r = contexts[0].record
        log.warning("batch handler failed: %d inputs failed (from %s[%d]@%d): %r",
                    len(contexts), r.topic, r.partition, r.offset, exc)
    reason = f"exception: {type(exc).__name__}: {exc}"
    for ctx in contexts:
        if fatal:
            ctx.reject(reason)
        else:
            ctx.fail(reason)

