"""Tasks rebalance incrementally: a task joining or leaving a group moves only the partitions
that change owner, and the others keep processing. A task that gives up a partition settles
what it handled of it (events sent, offsets committed) before it lets go: under steady
traffic, through a join and a leave, every record completes once, none is replayed, and no
input is handled twice."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

PARTITIONS = 6
LIMIT_S = 90.0

Partition = tuple[str, int]


class RecordingTask(Task):
    """A Task that records its rebalance callbacks: ("assign" | "revoke" | "lost", partitions)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, frozenset[Partition]]] = []

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.calls.append(("assign", frozenset((tp.topic, tp.partition) for tp in partitions)))
        super()._on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.calls.append(("revoke", frozenset((tp.topic, tp.partition) for tp in partitions)))
        super()._on_revoke(consumer, partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.calls.append(("lost", frozenset((tp.topic, tp.partition) for tp in partitions)))
        super()._on_lost(consumer, partitions)

    def owned(self) -> frozenset[Partition]:
        """What the callbacks left assigned (read from another thread: a snapshot)."""
        out: set[Partition] = set()
        for kind, partitions in list(self.calls):
            out = out | partitions if kind == "assign" else out - partitions
        return frozenset(out)


def test_a_join_and_a_leave_move_only_the_partitions_that_change_owner(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("rebal"))
    orders = f"{ns.name}.orders"
    replay = topics.replay_topic(orders)
    topics.create(settings, ns, 2, {orders: PARTITIONS})
    every = frozenset((t, p) for t in (orders, replay) for p in range(PARTITIONS))
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker")))
    stop, sending = threading.Event(), threading.Event()  # the acker's, the traffic's
    errors: list[BaseException] = []
    threads = [threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True)]
    source = Source(settings, ns, SourceConfig(timeout_ms=600_000))  # no replay by timeout
    tail = OutcomeTail(settings, ns)
    group_id = unique_name("rebal")
    lock = threading.Lock()
    handled: Counter[tuple[int, int]] = Counter()  # (origin, attempt) -> times handled
    sent: set[int] = set()
    tasks: list[RecordingTask] = []

    def handler(record: TaskRecord, _ctx: TaskContext) -> None:
        t = record.tracking
        assert t is not None
        with lock:
            handled[(t.origin, t.attempt)] += 1

    def start(name: str) -> RecordingTask:
        task = RecordingTask(
            settings, ns, [orders, replay], group_id, handler,
            TaskConfig(poll_timeout_ms=50, consumer={"client.id": name}),
        )
        thread = threading.Thread(target=guarded(task.run), name=name, daemon=True)
        thread.start()
        threads.append(thread)
        tasks.append(task)
        return task

    def guarded(target: Any) -> Any:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
        return run

    def traffic() -> None:
        i = 0
        while not sending.is_set():
            for _ in range(20):
                sent.add(source.send(orders, f"customer-{i}", b"order %d" % i).origin)
                i += 1
            source.flush()
            time.sleep(0.02)

    def wait(done: Any, what: str) -> None:
        deadline = time.monotonic() + LIMIT_S
        while not done():
            assert not errors, errors
            assert time.monotonic() < deadline, what
            tail.poll(0.1)

    def completed(count: int) -> bool:
        return len(tail.log.completed_origins()) >= count

    threads[0].start()
    a = start("a")
    try:
        wait(lambda: a.owned() == every, "a owns every partition")
        sender = threading.Thread(target=guarded(traffic), name="traffic", daemon=True)
        threads.append(sender)
        sender.start()
        wait(lambda: completed(200), "traffic flows through a")

        # b joins mid-stream: a gives up only what b takes, and never gets a revoke for a
        # partition it keeps (an eager rebalance revokes all of it, then assigns some back).
        joined = len(a.calls)
        b = start("b")
        wait(lambda: a.owned() | b.owned() == every and a.owned() and b.owned()
             and not a.owned() & b.owned(), "a and b share the partitions")
        kept, moved = a.owned(), b.owned()
        for name, owned in (("a", kept), ("b", moved)):  # co-partitioned
            assert {p for t, p in owned if t == orders} == {p for t, p in owned if t == replay}, (name, owned)
        revoked = frozenset().union(*(ps for kind, ps in a.calls[joined:] if kind == "revoke"))
        assert revoked == moved, f"a revoked {sorted(revoked)}, b took {sorted(moved)}: {a.calls[joined:]}"
        assert not any(ps for kind, ps in a.calls[joined:] if kind != "revoke"), a.calls[joined:]
        done = len(tail.log.completed_origins())
        wait(lambda: completed(done + 200), "traffic flows through a and b")

        # b leaves: a takes its partitions back without giving up any of its own.
        left = len(a.calls)
        b.stop()
        wait(lambda: a.owned() == every, "a owns every partition again")
        assert not any(ps for kind, ps in a.calls[left:] if kind != "assign"), a.calls[left:]
        done = len(tail.log.completed_origins())
        wait(lambda: completed(done + 200), "traffic flows through a alone")
        sending.set()
        sender.join(60)
        wait(lambda: sent <= tail.log.completed_origins().keys(), "every record sent completes")
    finally:
        sending.set()
        for task in tasks:
            task.stop()
        for thread in threads[1:]:
            thread.join(60)
        stop.set()
        threads[0].join(60)
        tail.close()
        source.close()
    assert not errors, errors
    # Every record sent completed once, none was replayed, and no input was handled twice:
    # what a partition's owner handled was committed before the partition moved.
    completions = tail.log.completed_origins()
    assert all(completions[o] == 1 for o in sent)
    assert tail.log.replays() == 0
    assert len(handled) == len(sent) and max(handled.values()) == 1, handled.most_common(3)
