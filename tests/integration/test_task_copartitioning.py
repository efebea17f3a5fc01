"""Tasks in one group get a data topic and its replay topic co-partitioned: partition i of
``orders`` and of ``orders.replay`` on the same member, through joins and leaves - a replay
lands on the partition index its key hashed to, so it is handled where the key's originals
are. And a Task refuses to start on a data topic whose replay topic has another partition
count (the same index would be another key range)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.testing import create_topics, unique_name
from broker.errors import TopologyError
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord

pytestmark = pytest.mark.integration

PARTITIONS = 6
LIMIT_S = 90.0


class Group:
    """Task instances of one consumer group over ``orders`` and ``orders.replay``."""

    def __init__(self, settings: KafkaSettings, ns: topics.Namespace, orders: str) -> None:
        self.settings, self.ns, self.orders = settings, ns, orders
        self.replay = topics.replay_topic(orders)
        self.group_id = unique_name("copart")
        self.members: dict[str, tuple[Task, threading.Thread]] = {}
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()
        # (member, topic, partition, origin, attempt) of every input handled
        self.handled: list[tuple[str, str, int, int, int]] = []
        self.fail_first_attempt = False
        self.admin = AdminClient(settings.client_config())

    def join(self, name: str) -> None:
        def handler(record: TaskRecord, ctx: TaskContext) -> None:
            t = record.tracking
            assert t is not None
            with self.lock:
                self.handled.append((name, record.topic, record.partition, t.origin, t.attempt))
            if self.fail_first_attempt and t.attempt == 1:
                ctx.fail("first attempt")

        task = Task(
            self.settings, self.ns, [self.orders, self.replay], self.group_id, handler,
            TaskConfig(poll_timeout_ms=50, consumer={"client.id": name}),  # names the member
        )

        def run() -> None:
            try:
                task.run()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.members[name] = (task, thread)

    def leave(self, name: str) -> None:
        task, thread = self.members.pop(name)
        task.stop()
        thread.join(60)  # run() closes the consumer: it leaves the group at once

    def assignments(self) -> tuple[bool, dict[str, dict[str, set[int]]]]:
        """(stable, member -> topic -> partitions) as the group coordinator has them. Asked of
        the broker: a consumer's own ``assignment()`` must not be called from another thread
        while it polls."""
        try:
            description = self.admin.describe_consumer_groups([self.group_id])[self.group_id].result(10)
        except (KafkaException, TimeoutError):  # a group the coordinator does not know yet
            return False, {}
        out: dict[str, dict[str, set[int]]] = {}
        for member in description.members:
            owned: dict[str, set[int]] = {self.orders: set(), self.replay: set()}
            for tp in member.assignment.topic_partitions:
                owned[tp.topic].add(tp.partition)
            out[member.client_id] = owned
        return description.state == ConsumerGroupState.STABLE, out

    def settled(self) -> dict[str, dict[str, set[int]]]:
        """Wait until every member has partitions and together they hold each one once."""
        deadline = time.monotonic() + LIMIT_S
        want = sorted((t, p) for t in (self.orders, self.replay) for p in range(PARTITIONS))
        while True:
            assert not self.errors, self.errors
            stable, now = self.assignments()
            held = sorted((t, p) for owned in now.values() for t, ps in owned.items() for p in ps)
            if stable and held == want and now.keys() == self.members.keys():
                return now
            assert time.monotonic() < deadline, f"assignment did not settle: {now}"
            time.sleep(0.1)


def assert_copartitioned(group: Group, when: str) -> dict[str, set[int]]:
    now = group.settled()
    for name, owned in now.items():
        assert owned[group.orders] == owned[group.replay], (
            f"{when}: {name} holds {group.orders} {sorted(owned[group.orders])} but "
            f"{group.replay} {sorted(owned[group.replay])}; all: {now}"
        )
    return {name: owned[group.orders] for name, owned in now.items()}


def test_tasks_get_topic_and_replay_topic_co_partitioned_through_joins_and_leaves(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("copart"))
    orders = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {orders: PARTITIONS})
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), fail_hold_ms=50))
    stop = threading.Event()
    acker_thread = threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True)
    acker_thread.start()
    source = Source(settings, ns, SourceConfig(timeout_ms=600_000))  # no replay by timeout
    tail = OutcomeTail(settings, ns)
    group = Group(settings, ns, orders)
    sent: set[int] = set()

    def send(n: int, tag: str) -> set[int]:
        origins = {source.send(orders, f"customer-{tag}-{i}", b"order %d" % i).origin for i in range(n)}
        source.flush()
        sent.update(origins)
        return origins

    def wait_completed(origins: set[int], what: str) -> None:
        deadline = time.monotonic() + LIMIT_S
        while not origins <= tail.log.completed_origins().keys():
            assert not group.errors, group.errors
            assert time.monotonic() < deadline, f"{what}: {len(origins - tail.log.completed_origins().keys())} pending"
            tail.poll(0.2)

    try:
        group.join("a")
        group.join("b")
        assert_copartitioned(group, "two members")
        wait_completed(send(200, "two"), "two members")

        group.join("c")
        three = assert_copartitioned(group, "a third member joined")
        # While the three hold still: every record fails once; its replay (orders.replay at
        # the original's partition index) is handled by the member that had the original.
        with group.lock:
            group.handled.clear()
        group.fail_first_attempt = True
        wait_completed(send(300, "three"), "three members, one replay each")
        group.fail_first_attempt = False
        assert {n: o[orders] for n, o in group.settled().items()} == three, "rebalanced meanwhile"
        member_of = {p: name for name, ps in three.items() for p in ps}
        first = {o: (m, p) for m, t, p, o, a in group.handled if t == orders and a == 1}
        replays = [(m, p, o) for m, t, p, o, a in group.handled if t == group.replay]
        assert len(replays) >= 300
        for member, partition, origin in replays:
            assert first[origin] == (member, partition) and member_of[partition] == member

        group.leave("b")
        assert_copartitioned(group, "a member left")
        wait_completed(send(200, "after"), "after a member left")
    finally:
        for name in list(group.members):
            group.leave(name)
        stop.set()
        acker_thread.join(60)
        tail.close()
        source.close()
    assert not group.errors, group.errors
    completions = tail.log.completed_origins()
    assert all(completions[o] == 1 for o in sent)
    # one replay per record of the failing phase and none other: no input was handled twice
    assert tail.log.replays() == 300
    handled = defaultdict(int)
    for _, t, _, o, a in group.handled:
        handled[(t, o, a)] += 1
    assert max(handled.values()) == 1


def test_task_refuses_a_replay_topic_with_another_partition_count(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("copart"))
    topics.create(settings, ns, 2)
    orders = f"{ns.name}.orders"
    create_topics(bootstrap, {orders: PARTITIONS, topics.replay_topic(orders): 4})
    task = Task(settings, ns, [orders, topics.replay_topic(orders)], unique_name("t"), lambda r, c: None)
    with pytest.raises(TopologyError, match=r"\.replay has 4 partitions, .*\.orders has 6"):
        task.run(max_idle_ms=1000)
