"""Ground truth shared by the integration tests of the ledger: what the tasks sent (events
whose delivery was confirmed), what the acker decided (persist tombstones), and the events in
``ns.acks`` - all on the broker's clock (``LogAppendTime`` topics), so "completed before its
last event" is decidable."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from broker import ids, topics
from broker.dev.testing import unique_name
from broker.headers import H_HISTORY, outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import (
    COUNTERS_KEY,
    PersistedRecord,
    XorBatch,
    decode_counters,
    read_persist_prefixes,
)
from broker.settings import KafkaSettings
from broker.task import Task

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}


def fan_out_of(origin: int) -> int:
    return 1 + origin % 3


class GroundTruth:
    """The events the tasks sent, computed by their handlers: srid -> [xor, ...].

    A handler ``stage``s the event of its input; it enters ``events`` only when the batch's
    outputs were delivered (``TruthTask``): an event the broker refused was never sent. Staging
    is per thread - each task runs its batches in its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self.events: dict[int, list[int]] = defaultdict(list)

    def record(self, srid: int, xor: int) -> None:
        """An event known to be delivered."""
        with self._lock:
            self.events[srid].append(xor)

    def stage(self, srid: int, xor: int) -> None:
        """From a handler: the event of its input, recorded once its batch is delivered."""
        staged: list[tuple[int, int]] | None = getattr(self._local, "staged", None)
        if staged is None:
            raise RuntimeError("GroundTruth.stage outside a TruthTask batch")
        staged.append((srid, xor))

    def open_batch(self) -> list[tuple[int, int]]:
        self._local.staged = []
        staged: list[tuple[int, int]] = self._local.staged
        return staged

    def close_batch(self, staged: list[tuple[int, int]], failed: set[int] | None) -> None:
        """``failed`` None: the batch did not finish, nothing is known delivered. Else every
        staged event but those of the srids the task failed as undeliverable (whose event
        batch may not have reached ``ns.acks``) was delivered."""
        self._local.staged = None
        if failed is None:
            return
        with self._lock:
            for srid, xor in staged:
                if srid not in failed:
                    self.events[srid].append(xor)


class TruthTask(Task):
    """A Task whose handler's staged events enter the ground truth only once ``finish``
    returned - that is, after the children and events of every batch handled since were
    flushed and confirmed (``Task`` retries what failed and reports the srids it could not
    deliver, from ``handle_batch`` for sink outputs and from ``finish`` for the rest)."""

    def __init__(self, truth: GroundTruth, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.truth = truth
        self._staged: list[tuple[int, int]] | None = None  # since the last finish
        self._failed: set[int] = set()

    def handle_batch(self, batch: list[Message]) -> set[int]:
        if self._staged is None:
            self._staged = self.truth.open_batch()
        else:
            self.truth._local.staged = self._staged  # the same thread: the run loop's
        try:
            failed = super().handle_batch(batch)
        except BaseException:
            self._close(None)
            raise
        self._failed |= failed
        return failed

    def finish(self) -> set[int]:
        failed: set[int] | None = None
        try:
            failed = super().finish()
        finally:
            self._close(None if failed is None else failed | self._failed)
        return failed

    def _close(self, failed: set[int] | None) -> None:
        if self._staged is not None:
            self.truth.close_batch(self._staged, failed)
        self._staged, self._failed = None, set()


class PersistWatch:
    """Tails ``ns.persist`` (read_committed): srid -> [(outcome, broker append time)]."""

    def __init__(self, settings: KafkaSettings, ns: topics.Namespace, partitions: int) -> None:
        self._consumer = Consumer(settings.consumer_config(None, defaults={"group.id": unique_name("watch")}))
        self._consumer.assign([TopicPartition(ns.persist, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.tombstones: dict[int, list[tuple[str, int]]] = defaultdict(list)
        self.completed: set[int] = set()
        self.last_completion_ms = 0

    def poll(self, timeout_s: float = 0.2) -> int:
        msgs = self._consumer.consume(10_000, timeout_s)
        for msg in msgs:
            if msg.error() is not None:
                raise KafkaException(msg.error())
            if msg.value() is not None or len(msg.key() or b"") != 8:
                continue
            ts_type, ts = msg.timestamp()
            assert ts_type == TIMESTAMP_LOG_APPEND_TIME
            outcome = outcome_of(msg.headers()).decode()
            srid = ids.decode_id(msg.key())
            self.tombstones[srid].append((outcome, ts))
            if outcome == "completed":
                self.completed.add(srid)
                self.last_completion_ms = max(self.last_completion_ms, ts)
        return len(msgs)

    def drain(self) -> None:
        while self.poll(0.3):
            pass

    def close(self) -> None:
        self._consumer.close()



def read_events(settings: KafkaSettings, ns: topics.Namespace, partitions: int) -> dict[int, list[tuple[int, int]]]:
    """Every event in ``ns.acks``: srid -> [(xor, broker append time ms)]."""
    events: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for msg in read_to_end(settings, ns.acks, partitions):
        ts_type, ts = msg.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        batch = XorBatch.decode(msg.value())
        for srid, xor in zip(batch.srids.tolist(), batch.xors.tolist(), strict=True):
            events[srid].append((xor, ts))
    return events


def read_fail_marks(settings: KafkaSettings, ns: topics.Namespace, partitions: int) -> dict[int, int]:
    """Every srid failed explicitly in ``ns.acks``: srid -> the create time (ms) of its first
    fail mark (the task's clock: on one machine, the acker's)."""
    marks: dict[int, int] = {}
    for msg in read_to_end(settings, ns.acks, partitions):
        _, ts = msg.timestamp()
        for srid in XorBatch.decode(msg.value()).failed.tolist():
            marks[srid] = min(ts, marks.get(srid, ts))
    return marks


class Attempts:
    """What ``ns.persist`` and ``ns.dlq`` show of every attempt: its deadline (from its persist
    record), and how it was decided when it failed - the reason in the history its replay's
    persist record, or its dead letter, carries (``timeout``, or the failure's reason)."""

    def __init__(self, settings: KafkaSettings, ns: topics.Namespace, partitions: int) -> None:
        self.deadlines: dict[int, int] = {}
        self.decided: dict[int, str] = {}
        for msg in read_to_end(settings, ns.persist, partitions):
            if msg.value() is None:
                continue
            prefix = read_persist_prefixes([msg.value()])
            self.deadlines[ids.decode_id(msg.key() or b"")] = int(prefix.deadlines_ms[0])
            for failure in PersistedRecord.decode(msg.value()).history:
                self.decided[failure.srid] = failure.reason
        for msg in read_to_end(settings, ns.dlq, 1):
            history = dict(msg.headers() or ()).get(H_HISTORY)
            for failure in json.loads(history or b"[]"):
                self.decided[failure["srid"]] = failure["reason"]


def read_changelog(settings: KafkaSettings, ns: topics.Namespace, partitions: int = 4) -> tuple[int, dict[str, int]]:
    """Live entries left in ``ns.ledger``, and the acker's counters summed over partitions."""
    latest: dict[tuple[int, bytes], bytes | None] = {}
    for msg in read_to_end(settings, ns.ledger, partitions):
        latest[(msg.partition(), msg.key() or b"")] = msg.value()
    counters: Counter[str] = Counter()
    live = 0
    for (_, key), value in latest.items():
        if key == COUNTERS_KEY and value is not None:
            counters.update(decode_counters(value)[0])
        elif value is not None:
            live += 1
    return live, dict(counters)


def group_owners(admin: AdminClient, group: str, topic: str) -> dict[int, str]:
    """Partition of ``topic`` -> the member the group coordinator assigned it to (its instance
    id, else its client id); {} while the coordinator cannot describe the group."""
    try:
        desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except (KafkaException, TimeoutError):  # a busy coordinator: the caller asks again
        return {}
    owners: dict[int, str] = {}
    for member in desc.members:
        tps = member.assignment.topic_partitions if member.assignment else []
        owners.update(dict.fromkeys((tp.partition for tp in tps if tp.topic == topic),
                                    member.group_instance_id or member.client_id))
    return owners


def wait_assigned(settings: KafkaSettings, groups: dict[str, str], partitions: int, limit_s: float = 120.0) -> None:
    """Until every partition of each group's topic (``groups``: group -> topic) is assigned:
    the services are up and a record sent now is processed without waiting for a join."""
    admin = AdminClient(settings.client_config())
    deadline = time.monotonic() + limit_s
    for group, topic in groups.items():
        while len(group_owners(admin, group, topic)) < partitions:
            assert time.monotonic() < deadline, f"group {group} did not get {topic}'s partitions assigned"
            time.sleep(0.5)


class Services:
    """Services (anything with ``run()`` and ``stop()``: an Acker, a Task) each in a daemon
    thread, and an ``OutcomeTail`` to wait on. An exception in a service is kept and fails the
    next ``wait``; ``stop`` stops them all, joins them and closes the tail."""

    def __init__(self, settings: KafkaSettings, ns: topics.Namespace, *services: Any) -> None:
        from broker.completions import OutcomeTail

        self.services = services
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guarded(s.run), daemon=True) for s in services]
        for thread in self.threads:
            thread.start()
        self.tail = OutcomeTail(settings, ns)

    def _guarded(self, target: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
                self.errors.append(exc)

        return run

    def wait(self, done: Callable[[], bool], what: str, limit_s: float = 60.0,
             detail: Callable[[], str] = lambda: "") -> None:
        """Poll the tail until ``done()``; fail when a service died or after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while not done():
            assert not self.errors, f"a pipeline thread died: {self.errors[0]!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}{detail()}"
            self.tail.poll(0.2)

    def stop(self) -> None:
        for service in self.services:
            service.stop()
        for thread in self.threads:
            thread.join(60)
        self.tail.close()


def outcomes_under(settings: KafkaSettings, ns: topics.Namespace, acker: Any, origins: set[int], *,
                   limit_s: float = 90.0, settle_s: float = 0.5) -> dict[int, list[str]]:
    """Run ``acker`` (an ``Acker``) in a thread until every origin has an outcome in
    ``ns.persist`` and ``settle_s`` more (a false timeout's outcome would come by then); the
    outcomes per origin, as the broker holds them."""
    from broker.completions import OutcomeTail

    errors: list[BaseException] = []

    def run() -> None:
        try:
            acker.run()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    tail = OutcomeTail(settings, ns)
    try:
        deadline = time.monotonic() + limit_s
        while not origins <= tail.log.outcomes.keys():
            assert not errors, f"the acker died: {errors[0]!r}"
            assert time.monotonic() < deadline, "not every record has an outcome"
            tail.poll(0.2)
        time.sleep(settle_s)
        tail.poll(0.5)
    finally:
        acker.stop()
        thread.join(60)
        tail.close()
    assert not errors, f"the acker died: {errors[0]!r}"
    return {o: [e[1] for e in tail.log.outcomes[o]] for o in origins}
