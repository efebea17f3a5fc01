"""Source, Task, Bridge and Acker on the in-memory cluster (tests/unit/log_cluster.py), each
handed it as its Kafka port: a record sent is processed, acked and completed - read from what
the cluster holds (the persist tombstones' outcomes, the output topic), never from counters."""

from __future__ import annotations

import itertools

from broker import ids
from broker.acker import Acker, AckerConfig
from broker.bridge import Bridge, BridgeConfig
from broker.headers import outcome_of
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from broker.topics import Namespace
from tests.unit.log_cluster import Cluster

NS = Namespace("unit")
SETTINGS = KafkaSettings("memory:9092")


def _cluster() -> Cluster:
    return Cluster(partitions=2, topic_partitions={t: 2 for t in ("orders", "orders.replay", "out", "out.replay",
                                                                  "legacy", "legacy.guaranteed",
                                                                  "legacy.guaranteed.replay")})


def _outcomes(cluster: Cluster) -> dict[int, str]:
    """srid -> the outcome of its persist tombstone."""
    return {ids.decode_id(m.key() or b""): outcome_of(m.headers()).decode()
            for m in cluster.records(NS.persist) if m.value() is None}


def _acker_until_decided(cluster: Cluster, srids: set[int]) -> None:
    acker = Acker(SETTINGS, NS, AckerConfig(commit_interval_ms=0, instance_id="unit", stats_interval_ms=10**12, fail_hold_ms=0),
                  kafka=cluster)
    steps = itertools.count()
    acker.run(until=lambda _: srids <= _outcomes(cluster).keys() or next(steps) > 200)


def test_records_sent_processed_and_acked_complete_on_the_in_memory_cluster() -> None:
    cluster = _cluster()
    source = Source(SETTINGS, NS, kafka=cluster)
    srids = {source.send("orders", f"k{i}", f"v{i}".encode()).srid for i in range(6)}
    source.flush()

    def copy(record: TaskRecord, ctx: TaskContext) -> None:
        ctx.output("out", record.key, record.value)  # a sink output: the input is a leaf

    task = Task(SETTINGS, NS, ["orders"], "g", copy, TaskConfig(poll_timeout_ms=1, skip_superseded=False),
                kafka=cluster)
    task.run(max_idle_ms=100)
    assert sorted(m.value() for m in cluster.records("out")) == sorted(f"v{i}".encode() for i in range(6))
    assert cluster.offsets[("g", "orders", 0)] + cluster.offsets[("g", "orders", 1)] == 6  # committed

    _acker_until_decided(cluster, srids)
    assert _outcomes(cluster) == dict.fromkeys(srids, "completed")


def test_a_failed_input_is_replayed_on_the_in_memory_cluster() -> None:
    cluster = _cluster()
    source = Source(SETTINGS, NS, SourceConfig(retry=None), kafka=cluster)  # replayed at once
    srid = source.send("orders", "k", b"v").srid
    source.flush()

    def refuse(record: TaskRecord, ctx: TaskContext) -> None:
        ctx.fail("refused")

    Task(SETTINGS, NS, ["orders"], "g", refuse, TaskConfig(poll_timeout_ms=1, skip_superseded=False),
         kafka=cluster).run(max_idle_ms=100)
    _acker_until_decided(cluster, {srid})
    assert _outcomes(cluster) == {srid: "replay"}
    (replay,) = cluster.records("orders.replay")
    assert replay.value() == b"v"


def test_a_bridge_puts_the_input_under_the_guarantee_on_the_in_memory_cluster() -> None:
    cluster = _cluster()
    for i in range(3):
        cluster.append("legacy", i % 2, f"k{i}".encode(), f"v{i}".encode())
    bridge = Bridge(SETTINGS, NS, BridgeConfig(input_topic="legacy"), kafka=cluster)
    bridge.start()
    try:
        while sum(bridge.step() for _ in range(3)):
            pass
    finally:
        bridge.close()
    out = cluster.records("legacy.guaranteed")
    assert sorted(m.value() for m in out) == [b"v0", b"v1", b"v2"]
    assert len(cluster.records(NS.persist)) == 3  # each under the guarantee
    assert cluster.offsets[(bridge.group_id, "legacy", 0)] + cluster.offsets[(bridge.group_id, "legacy", 1)] == 3
