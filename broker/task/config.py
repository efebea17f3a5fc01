"""A task's settings (``TaskConfig``) and counts (``TaskCounters``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ConfigurationError
from broker.retry import RetryPolicy
from broker.serde import BYTES, Serde
from broker.topics import REPLAY_SUFFIX, replay_topic


@dataclass(frozen=True)
class TaskConfig:
    batch_size: int = 1000
    poll_timeout_ms: int = 100
    # An exception in user code fails the input (replay) instead of stopping the task.
    fail_on_exception: bool = True
    # Exceptions that say the input can never succeed (a malformed record, a permanent
    # error): such an exception rejects the input - dead-lettered at once, its DLQ reason
    # naming the exception's class - instead of spending its attempts (ctx.reject).
    fatal: tuple[type[BaseException], ...] = ()
    # Exceptions that say a dependency is down, not that the input is bad (broker.task.outage):
    # the input is put back and tried again after a back-off (``outage_retry``), the task's
    # inputs paused meanwhile and the records it holds touched - no attempt is spent, nothing
    # goes downstream. An input still in an outage ``outage_max_ms`` after it began is failed.
    outage: tuple[type[Exception], ...] = ()
    outage_max_ms: int = 60_000
    outage_retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Outputs (children, sink outputs, events) that fail to deliver are sent again up to this
    # many rounds, the first after retry_backoff_ms, doubling; then their inputs are failed
    # (fail marks: replay or DLQ) and the task moves on - a permanent error never stalls it.
    delivery_retries: int = 3
    retry_backoff_ms: int = 100
    # Outputs and events go out as each batch is handled; waiting for their delivery and
    # committing the input offsets happens once per interval (0: after every batch). A crash
    # redoes at most this interval's inputs (docs/design.md §4) - it costs a replay, never a
    # loss - and in return the task waits for the broker a few times a second instead of
    # once per poll, which is most of its produce and commit requests under load.
    commit_interval_ms: int = 100
    # ctx.touch(): how far past now a touch pushes the record's deadline, unless given.
    touch_timeout_ms: int = 30_000
    # Skip replays the acker marked superseded (their original attempt completed late,
    # docs/design.md §6): ack them without running the handler. The markers come from
    # ns.superseded.
    skip_superseded: bool = True
    # A batch that took longer than slow_batch_ms to handle may have outlived its records'
    # timeouts: a replay of one of its inputs read within superseded_wait_ms after it waits,
    # at most until then, for the acker's marker (written once the late ack is folded, ~a
    # commit interval) - otherwise the replay, queued behind its original, would be handled
    # before the marker can arrive. One window per slow batch, shared by all its replays.
    slow_batch_ms: int = 1000
    superseded_wait_ms: int = 1000
    # Serve Prometheus metrics on this port while run() runs (broker.metrics; 0: any free
    # port, see Task.metrics_server.port); None: no HTTP server.
    metrics_port: int | None = None
    # Values of the inputs (TaskRecord.decoded()) and of ctx.emit / ctx.output (broker.serde);
    # ``serdes``: topic -> its own serde, over ``serde`` (an App's topics with their own).
    serde: Serde = BYTES
    serdes: Mapping[str, Serde] = field(default_factory=dict)
    # The consumer group protocol. "consumer" (KIP-848, Kafka >= 4.0): the broker's range
    # assignor keeps a data topic and its replay topic co-partitioned, and a member joining or
    # leaving moves only the partitions that change owner - the others keep processing; a
    # session.timeout.ms / heartbeat.interval.ms in ``consumer`` is set on the group. On a
    # cluster without it the task falls back to "classic": cooperative-sticky, incremental
    # too, but it balances partitions over all topics and may split a data topic from its
    # replay topic (docs/design.md, Known gaps).
    group_protocol: str = "consumer"
    consumer: Mapping[str, Any] = field(default_factory=dict)
    producer: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.group_protocol not in ("consumer", "classic"):
            raise ConfigurationError(f"TaskConfig.group_protocol must be 'consumer' or 'classic', not {self.group_protocol!r}")
        if self.batch_size < 1:
            raise ConfigurationError(f"TaskConfig.batch_size must be positive, not {self.batch_size}")
        durations = ("poll_timeout_ms", "retry_backoff_ms", "commit_interval_ms", "touch_timeout_ms",
                     "slow_batch_ms", "superseded_wait_ms")
        for name in durations:
            if getattr(self, name) < 0:
                raise ConfigurationError(f"TaskConfig.{name} must not be negative, not {getattr(self, name)}")
        for name in ("fatal", "outage"):
            given = getattr(self, name)
            classes = given if isinstance(given, tuple) else (given,)
            if not all(isinstance(t, type) and issubclass(t, Exception if name == "outage" else BaseException)
                       for t in classes):
                raise ConfigurationError(f"TaskConfig.{name} must be exception classes, not {given!r}")
            object.__setattr__(self, name, classes)
        if self.outage_max_ms < 0:
            raise ConfigurationError(f"TaskConfig.outage_max_ms must not be negative, not {self.outage_max_ms}")
        if not isinstance(self.outage_retry, RetryPolicy):
            raise ConfigurationError(f"TaskConfig.outage_retry must be a RetryPolicy, not {self.outage_retry!r}")


def without_replay_topics(topics: Iterable[str]) -> list[str]:
    """The data topics among ``topics`` whose replay topic is not among them: a replay of one
    of their records is written to a topic nobody reads."""
    names = set(topics)
    return [t for t in dict.fromkeys(topics) if not t.endswith(REPLAY_SUFFIX) and replay_topic(t) not in names]


@dataclass
class TaskCounters:
    processed: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0  # inputs dead-lettered at once (ctx.reject, a fatal exception)
    untracked: int = 0
    emitted: int = 0
    sink_outputs: int = 0  # TaskContext.output records
    errors: int = 0
    retried_batches: int = 0  # batches with outputs sent again after a delivery error
    undeliverable: int = 0  # source records failed because an output could not be delivered
    dropped: int = 0  # untracked outputs given up (no source record to fail)
    commits_lost: int = 0  # batches whose offsets could not be committed after a rebalance
    commits_deferred: int = 0  # commits the group coordinator could not take yet: done later
    # Inputs taken before their partition was revoked: not processed, the owner reads them again.
    dropped_revoked: int = 0
    touches: int = 0  # deadline extensions sent (ctx.touch)
    outages: int = 0  # outages begun (TaskConfig.outage)
    outage_tries: int = 0  # inputs put back in an outage, to be tried again after a back-off
    outage_beats: int = 0  # outage beats sent: the clock of what waits behind the task stops (broker.task.outage)
    skipped: int = 0  # superseded replays acked without running the handler
    superseded_waits: int = 0  # replays of a slow batch's inputs that waited for a marker

