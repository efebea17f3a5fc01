"""Topic names and layout, derived in this one module (docs/design.md §3).

``ns.persist``, ``ns.acks`` and ``ns.ledger`` are co-partitioned: partition i of all three
belongs to the same acker, and producers choose ``srid mod P`` explicitly. Every service runs
``check`` at start-up and refuses to run when the layout is off.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from broker.errors import ConfigurationError, TopologyError
from broker.kafka_io import configs_of, kafka_errors, partition_counts, wait_visible
from broker.settings import KafkaSettings

REPLAY_SUFFIX = ".replay"

log = logging.getLogger(__name__)

# On a cluster of at least 3 brokers every topic of a namespace gets 3 replicas, and a write
# (acks=all) needs 2 of them in sync: one broker can fail without losing a persist record, a
# ledger entry or an acknowledged completion, and without stopping writes.
REPLICATION = 3
MIN_INSYNC = 2


@dataclass(frozen=True)
class Replication:
    factor: int
    min_insync: int
    brokers: int
    warning: str | None = None


def replication_for(brokers: int, factor: int | None = None, min_insync: int | None = None) -> Replication:
    """The replication of a namespace's topics on a cluster of ``brokers``: the given values,
    else 3 and 2 when the cluster has at least 3 brokers, else 1 and 1 - with a warning that
    names the risk."""
    if factor is None:
        factor = REPLICATION if brokers >= REPLICATION else 1
    if min_insync is None:
        min_insync = MIN_INSYNC if factor >= REPLICATION else 1
    if factor > brokers:
        raise TopologyError(f"replication factor {factor} needs at least {factor} brokers; the cluster has {brokers}")
    if not 1 <= min_insync <= factor:
        raise TopologyError(f"min.insync.replicas must be between 1 and the replication factor {factor}, not {min_insync}")
    warning = None
    if factor == 1:
        fix = ("use replication 3, min.insync.replicas 2" if brokers >= REPLICATION else
               "use a cluster of at least 3 brokers (replication 3, min.insync.replicas 2) in production")
        warning = (
            f"replication factor 1 ({brokers} broker{'s' if brokers != 1 else ''}): losing one broker's disk loses "
            f"persist records and ledger entries - records under the guarantee would be lost; {fix}"
        )
    elif min_insync < 2:
        warning = (
            f"min.insync.replicas {min_insync}: a write acknowledged by one replica is lost if that broker fails "
            "before the others copy it"
        )
    return Replication(factor, min_insync, brokers, warning)


@dataclass(frozen=True)
class Namespace:
    """A namespace's topic names (cached: the hot paths read them per record)."""

    name: str

    def __post_init__(self) -> None:
        check_namespace_name(self.name)

    @cached_property
    def persist(self) -> str:
        return f"{self.name}.persist"

    @cached_property
    def acks(self) -> str:
        return f"{self.name}.acks"

    @cached_property
    def ledger(self) -> str:
        return f"{self.name}.ledger"

    @cached_property
    def dlq(self) -> str:
        return f"{self.name}.dlq"

    @cached_property
    def superseded(self) -> str:
        return f"{self.name}.superseded"

    @cached_property
    def ledger_topics(self) -> tuple[str, str, str]:
        return (self.persist, self.acks, self.ledger)

    @cached_property
    def own_topics(self) -> tuple[str, ...]:
        """The topics of the broker itself: no task or bridge reads or writes them as data."""
        return (*self.ledger_topics, self.dlq, self.superseded, f"{self.dlq}.redriven")


# A namespace's name is the first part of every name of its own: NAME.persist, NAME.acker ...
# Without a "." in it no namespace's names can begin with another's ("a" and "a.acker" would
# share the group prefix a.acker.); the rest is what Kafka allows in a topic name.
NAMESPACE_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")


def check_namespace_name(name: str) -> str:
    if not isinstance(name, str) or not NAMESPACE_NAME.fullmatch(name):
        raise ConfigurationError(
            f"namespace {name!r}: 1 to 200 letters, digits, '_' or '-' (no '.': it separates "
            "the namespace from the names within it)"
        )
    return name


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
# Superseded markers (replay srid -> original srid) matter while their replay may still be
# read: compacted, and deleted after the replay topics' retention.
SUPERSEDED = {**COMPACTED, "cleanup.policy": "compact,delete", "retention.ms": REPLAY["retention.ms"]}


def layout(
    ns: Namespace, partitions: int, data_topics: Mapping[str, int]
) -> dict[str, tuple[int, dict[str, str]]]:
    """{topic: (partitions, config)} of a namespace and its data topics' replay topics."""
    topics = {
        ns.persist: (partitions, dict(COMPACTED)),
        ns.acks: (partitions, dict(ACKS)),
        ns.ledger: (partitions, dict(COMPACTED)),
        ns.dlq: (1, dict(DLQ)),
        ns.superseded: (partitions, dict(SUPERSEDED)),
    }
    for topic, n in data_topics.items():
        topics[topic] = (n, {})
        topics[replay_topic(topic)] = (n, dict(REPLAY))
    return topics


_WARNED_REPLICATION: set[str] = set()  # clusters already warned about low replication


@kafka_errors("creating topics")
def create(
    settings: KafkaSettings,
    ns: Namespace,
    partitions: int,
    data_topics: Mapping[str, int] | None = None,
    *,
    replication: int | None = None,
    min_insync: int | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    admin: AdminClient | None = None,
) -> list[str]:
    """Create what is missing; topics that exist are left alone (``check`` verifies them).
    Replication: ``replication_for`` the cluster's size unless given. ``admin``: the client
    to ask (default: a new one of ``settings``), as in ``check_replication`` and ``delete``.

    Returns the names created.
    """
    admin = admin or AdminClient(settings.client_config())
    metadata = admin.list_topics(timeout=30)
    existing = set(metadata.topics)
    wanted = layout(ns, partitions, data_topics or {})
    new = []
    rep: Replication | None = None
    for name, (n, config) in wanted.items():
        if name in existing:
            continue
        if rep is None:
            rep = replication_for(len(metadata.brokers), replication, min_insync)
            if rep.warning:
                # Once per cluster and process: a test suite or a bench creates hundreds of
                # namespaces on one small development broker.
                first = settings.bootstrap_servers not in _WARNED_REPLICATION
                _WARNED_REPLICATION.add(settings.bootstrap_servers)
                log.log(logging.WARNING if first else logging.DEBUG, "namespace %s: %s", ns.name, rep.warning)
        config = {**config, "min.insync.replicas": str(rep.min_insync), **(overrides or {}).get(name, {})}
        new.append(NewTopic(name, n, rep.factor, config=config))
    if new:
        for future in admin.create_topics(new, operation_timeout=30).values():
            try:
                future.result(timeout=60)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        wait_visible(admin, {t.topic: t.num_partitions for t in new})
    return [t.topic for t in new]


@kafka_errors("checking replication")
def check_replication(
    settings: KafkaSettings, ns: Namespace, data_topics: Iterable[str] = (), *, admin: AdminClient | None = None
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the namespace's replication on this cluster. Problems: on a
    cluster of at least 3 brokers a topic with fewer than 3 replicas or min.insync.replicas
    below 2; any partition whose in-sync replicas are fewer than its replicas right now
    (a broker down or behind). Warnings: replication 1 on a smaller cluster."""
    names = [*ns.ledger_topics, ns.dlq]
    for topic in data_topics:
        names += [topic, replay_topic(topic)]
    admin = admin or AdminClient(settings.client_config())
    metadata = admin.list_topics(timeout=30)
    brokers = len(metadata.brokers)
    present = [t for t in names if t in metadata.topics and metadata.topics[t].error is None]
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in present]
    insync = {r.name: int(f.result(timeout=30)["min.insync.replicas"].value) for r, f in admin.describe_configs(resources).items()} if resources else {}
    problems: list[str] = []
    warnings: list[str] = []
    single: list[str] = []
    for topic in present:
        parts = metadata.topics[topic].partitions.values()
        factor = min(len(p.replicas) for p in parts)
        short = sorted(p.id for p in parts if len(p.isrs) < len(p.replicas))
        if short:
            problems.append(f"{topic}: partitions {short} are under-replicated now (in-sync replicas < replicas)")
        if brokers >= REPLICATION and factor < REPLICATION:
            problems.append(f"{topic}: replication factor {factor} on a cluster of {brokers} brokers (want {REPLICATION})")
        elif brokers >= REPLICATION and insync[topic] < MIN_INSYNC:
            problems.append(f"{topic}: min.insync.replicas {insync[topic]} (want {MIN_INSYNC})")
        elif factor == 1:
            single.append(topic)
    if single:
        warnings.append(f"{', '.join(single)}: {replication_for(brokers, 1).warning}")
    return problems, warnings


@kafka_errors("deleting topics")
def delete(
    settings: KafkaSettings, names: Iterable[str], timeout_s: float = 30.0, *, admin: AdminClient | None = None
) -> list[str]:
    """Delete the topics of ``names`` that exist; returns the names deleted."""
    admin = admin or AdminClient(settings.client_config())
    existing = set(admin.list_topics(timeout=30).topics)
    doomed = sorted(set(names) & existing)
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=timeout_s).values():
            future.result(timeout=timeout_s * 2)
    return doomed


@kafka_errors("checking the namespace")
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
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    problems = []
    for topic, configs in zip(topics, configs_of(settings, resources, "reading the cleanup policies"), strict=True):
        policy = configs["cleanup.policy"].value
        if "compact" not in policy:
            problems.append(f"{topic} must be compacted (cleanup.policy={policy})")
    return problems
