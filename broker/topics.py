"""Topic names and layout, derived in this one module (docs/design.md §3).

``ns.persist``, ``ns.acks`` and ``ns.ledger`` are co-partitioned: partition i of all three
belongs to the same acker, and producers choose ``srid mod P`` explicitly. Every service runs
``check`` at start-up and refuses to run when the layout is off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from broker.errors import TopologyError
from broker.kafka_io import partition_counts, wait_visible
from broker.settings import KafkaSettings

REPLAY_SUFFIX = ".replay"


@dataclass(frozen=True)
class Namespace:
    name: str

    @property
    def persist(self) -> str:
        return f"{self.name}.persist"

    @property
    def acks(self) -> str:
        return f"{self.name}.acks"

    @property
    def ledger(self) -> str:
        return f"{self.name}.ledger"

    @property
    def dlq(self) -> str:
        return f"{self.name}.dlq"

    @property
    def ledger_topics(self) -> tuple[str, str, str]:
        return (self.persist, self.acks, self.ledger)


def replay_topic(data_topic: str) -> str:
    return data_topic + REPLAY_SUFFIX


# Compacted topics keep one value per srid; tombstones are dropped an hour after cleaning,
# long enough for any consumer that watches completions.
COMPACTED = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.1",
    "segment.ms": "600000",
    "delete.retention.ms": "3600000",
    "min.compaction.lag.ms": "0",
}
ACKS = {"cleanup.policy": "delete", "retention.ms": "86400000"}
REPLAY = {"cleanup.policy": "delete", "retention.ms": str(7 * 86400000)}
DLQ = {"cleanup.policy": "delete", "retention.ms": str(30 * 86400000)}


def layout(
    ns: Namespace, partitions: int, data_topics: Mapping[str, int]
) -> dict[str, tuple[int, dict[str, str]]]:
    """{topic: (partitions, config)} of a namespace and its data topics' replay topics."""
    topics = {
        ns.persist: (partitions, dict(COMPACTED)),
        ns.acks: (partitions, dict(ACKS)),
        ns.ledger: (partitions, dict(COMPACTED)),
        ns.dlq: (1, dict(DLQ)),
    }
    for topic, n in data_topics.items():
        topics[topic] = (n, {})
        topics[replay_topic(topic)] = (n, dict(REPLAY))
    return topics


def create(
    settings: KafkaSettings,
    ns: Namespace,
    partitions: int,
    data_topics: Mapping[str, int] | None = None,
    *,
    replication: int = 1,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """Create what is missing; topics that exist are left alone (``check`` verifies them).

    Returns the names created.
    """
    admin = AdminClient(settings.client_config())
    existing = set(admin.list_topics(timeout=30).topics)
    wanted = layout(ns, partitions, data_topics or {})
    new = []
    for name, (n, config) in wanted.items():
        if name in existing:
            continue
        config = {**config, **(overrides or {}).get(name, {})}
        new.append(NewTopic(name, n, replication, config=config))
    if new:
        for future in admin.create_topics(new, operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        wait_visible(admin, {t.topic: t.num_partitions for t in new})
    return [t.topic for t in new]


def delete(settings: KafkaSettings, names: Iterable[str], timeout_s: float = 30.0) -> list[str]:
    """Delete the topics of ``names`` that exist; returns the names deleted."""
    admin = AdminClient(settings.client_config())
    existing = set(admin.list_topics(timeout=30).topics)
    doomed = sorted(set(names) & existing)
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=timeout_s).values():
            future.result(timeout=timeout_s * 2)
    return doomed


def check(settings: KafkaSettings, ns: Namespace, data_topics: Iterable[str] = ()) -> int:
    """Verify the layout; return P (the ledger partition count) or raise TopologyError.

    - persist, acks, ledger exist and have the same partition count (co-partitioning);
    - persist and ledger are compacted;
    - each data topic and its replay topic exist with equal partition counts (a replay goes
      to the same partition index as the original).
    """
    data_topics = list(data_topics)
    wanted = [*ns.ledger_topics, ns.dlq]
    for topic in data_topics:
        wanted += [topic, replay_topic(topic)]
    counts = partition_counts(settings, wanted)
    problems = [f"topic {t} does not exist" for t, n in counts.items() if n is None]
    ledger_counts = {t: counts[t] for t in ns.ledger_topics if counts[t] is not None}
    if len(set(ledger_counts.values())) > 1:
        shown = ", ".join(f"{t}={n}" for t, n in ledger_counts.items())
        problems.append(f"{ns.persist}, {ns.acks} and {ns.ledger} must be co-partitioned: {shown}")
    for topic in data_topics:
        n, r = counts[topic], counts[replay_topic(topic)]
        if n is not None and r is not None and n != r:
            problems.append(f"{replay_topic(topic)} has {r} partitions, {topic} has {n}")
    if not problems:
        problems += _check_compaction(settings, [ns.persist, ns.ledger])
    if problems:
        raise TopologyError(
            f"namespace {ns.name!r} is not usable:\n- "
            + "\n- ".join(problems)
            + f"\n(create it with: replaybroker topics create --namespace {ns.name} ...)"
        )
    count = next(iter(ledger_counts.values()))
    assert count is not None
    return count


def _check_compaction(settings: KafkaSettings, topics: list[str]) -> list[str]:
    admin = AdminClient(settings.client_config())
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    problems = []
    for resource, future in admin.describe_configs(resources).items():
        policy = future.result(timeout=30)["cleanup.policy"].value
        if "compact" not in policy:
            problems.append(f"{resource.name} must be compacted (cleanup.policy={policy})")
    return problems


def data_topics_of(settings: KafkaSettings, names: Iterable[str]) -> dict[str, int]:
    """Partition counts of existing data topics (for replay partitioning)."""
    counts = partition_counts(settings, names)
    missing = [t for t, n in counts.items() if n is None]
    if missing:
        raise TopologyError(f"data topics do not exist: {', '.join(missing)}")
    return {t: n for t, n in counts.items() if n is not None}
