"""What each of the acker's Kafka clients is configured with, and why (docs/design.md §5).

Every client's settings come in two kinds: what the acker's guarantee depends on
(``required``: a user override that contradicts it is refused) and tunables (``defaults``:
``KafkaSettings.extra`` and ``AckerConfig.consumer`` win over them). Building them needs no
live cluster: the clients talk to Kafka only from ``Acker.start()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.acker.config import AckerConfig
from broker.acker.limits import producer_limit
from broker.acker.membership import group_client_logging
from broker.errors import ConfigurationError
from broker.kafka_io import CONSUMER_PROTOCOL, GROUP_SIDE
from broker.settings import KafkaSettings
from broker.topics import Namespace

COMMITTED = {"isolation.level": "read_committed"}
"""Records of aborted transactions (persist records, acks, the changelog) never count."""

# What sets each of the client settings librdkafka refuses with the consumer group protocol.
_INSTEAD = {
    "session.timeout.ms": "use AckerConfig.session_timeout_ms (--session-timeout-ms), set on the group",
    "heartbeat.interval.ms": "use AckerConfig.heartbeat_interval_ms, set on the group",
    "partition.assignment.strategy": "the broker's range assignor is used",
}


STANDBY_MARK = "+standby"
"""Ends the group consumer's ``client.id`` of an acker that keeps standbys (``--standby``):
its standby consumer has no group, so the group's description (the console's Overview) shows
the role only through the member's own name."""

FETCH_WAIT_MS = 20
"""The group consumer's ``fetch.wait.max.ms`` at a small P (``fetch_wait_ms``)."""
FETCH_WAIT_MAX_MS = 200
IDLE_FETCH_BUDGET = 10_000
"""Partitions an idle acker fleet may ask the brokers for each second (``fetch_wait_ms``)."""


def fetch_wait_ms(partitions: int) -> int:
    """The group consumer's ``fetch.wait.max.ms`` at ``partitions`` ledger partitions.

    An idle fetch waits this long for ``fetch.min.bytes`` and comes back empty; librdkafka
    has no incremental fetch sessions (KIP-227), so every fetch lists every owned partition
    of both inputs, and an idle fleet of ackers asks for 2 P partitions per wait whatever
    the number of instances: at a fixed wait, the brokers' work for an idle fleet grows with
    P. The wait grows with P so that stays within ``IDLE_FETCH_BUDGET``; what it adds to a
    completion's latency at a low rate (at most the wait) is small against a commit at that
    P. Under load, ``fetch.min.bytes`` ends a fetch before the wait."""
    return min(max(FETCH_WAIT_MS, 2 * partitions * 1000 // IDLE_FETCH_BUDGET), FETCH_WAIT_MAX_MS)


@dataclass
class AckerClients:
    """The librdkafka settings of one acker's clients (``config`` may change once: the
    fallback to the classic group protocol, broker.acker.membership; ``partitions`` once,
    when ``Acker.start`` learns P)."""

    settings: KafkaSettings
    ns: Namespace
    config: AckerConfig
    partitions: int = 0  # P, once known: the group consumer's fetch wait follows it

    @property
    def group_id(self) -> str:
        return f"{self.ns.name}.acker"

    def producer(self, persist_max_bytes: int | None = None) -> dict[str, object]:
        """The transactional producer. ``message.max.bytes`` follows what ``ns.persist`` takes
        (every output is made of a persist record, broker.acker.limits); a user's setting stays."""
        required: dict[str, object] = {
            # A replay topic checked before producing (broker.acker.commit) must not be
            # created by that very look-up, with the broker's default partition count.
            "allow.auto.create.topics": False,
        }
        defaults: dict[str, object] = {
            # Everything is produced inside a commit, which flushes (a flush sends at once,
            # librdkafka #3494): a longer linger costs no latency, a shorter one splits a
            # commit's batch of a partition into several requests (one partition a Produce
            # request, librdkafka #1700) while the loop is still producing it.
            "linger.ms": 10, "partitioner": "murmur2_random", "message.max.bytes": producer_limit(persist_max_bytes),
        }
        if self.config.exactly_once:
            required["transactional.id"] = f"{self.ns.name}.acker.{self.config.instance_id}"
            defaults["transaction.timeout.ms"] = self.config.transaction_timeout_ms
        return self.settings.producer_config(required=required, defaults=defaults)

    def group(self) -> dict[str, object]:
        """The group consumer of ``ns.persist`` and ``ns.acks``, for the configured protocol."""
        cfg = self.config
        required: dict[str, object] = {
            **COMMITTED,
            # Offsets are stored with the transaction that folded them.
            "enable.auto.offset.store": False,
            # A new group that skipped persist records would never track them.
            "auto.offset.reset": "earliest",
        }
        defaults: dict[str, object] = {
            # Names the member in the group's description and the broker's logs.
            "client.id": f"{self.ns.name}.acker.{cfg.instance_id}",
            "fetch.wait.max.ms": fetch_wait_ms(self.partitions),
            "fetch.min.bytes": 262_144,
            "max.poll.interval.ms": 60_000,
        }
        if cfg.group_protocol == "consumer":
            # Partition i of ns.persist, ns.acks and ns.ledger is one ledger partition: the
            # broker-side range assignor gives equal-sized topics' partition i to one member,
            # and moves only what changes owner. Session and heartbeat are the group's
            # (set in start()); librdkafka refuses them here.
            required.update(CONSUMER_PROTOCOL)
            for key, instead in _INSTEAD.items():
                if key in cfg.consumer or key in self.settings.extra:
                    raise ConfigurationError(f"{key} cannot be set on the acker's consumer with group_protocol='consumer': {instead}")
        else:
            required["partition.assignment.strategy"] = "range"
            defaults["session.timeout.ms"] = cfg.session_timeout_ms
            defaults["heartbeat.interval.ms"] = cfg.heartbeat_interval_ms
        if cfg.static:
            required["group.instance.id"] = f"{self.ns.name}.acker.{cfg.instance_id}"
        conf = self.settings.consumer_config(self.group_id, required=required, user=cfg.consumer, defaults=defaults)
        if cfg.group_protocol == "consumer":
            for key in GROUP_SIDE:  # the common consumer defaults' (a user's were refused above)
                conf.pop(key, None)
        if cfg.standby:  # on whichever client.id is set, a user's too
            conf["client.id"] = f"{conf['client.id']}{STANDBY_MARK}"
        return conf | group_client_logging()

    def restorer(self) -> dict[str, object]:
        """Reads whole changelog partitions on assignment and rewind."""
        return self.settings.consumer_config(
            f"{self.ns.name}.acker.restore",
            required={**COMMITTED, "enable.partition.eof": True},
            # EOF is only seen when a fetch comes back empty, and the broker holds an empty
            # fetch (and the requests queued behind it) for this long.
            defaults={
                "fetch.wait.max.ms": 10,
                # A restore reads whole partitions: big fetches, few round trips.
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
                "fetch.max.bytes": 64 * 1024 * 1024,
            },
        )

    def standby(self) -> dict[str, object]:
        """Tails the changelogs of the partitions not owned (``--standby``)."""
        return self.settings.consumer_config(f"{self.ns.name}.acker.standby", required=COMMITTED)

    def fetcher(self) -> dict[str, object]:
        """Reads the payloads of failed records from ``ns.persist``."""
        return self.settings.consumer_config(
            f"{self.ns.name}.acker.fetch",
            required={**COMMITTED, "enable.auto.offset.store": False, "enable.partition.eof": True},
            defaults={"fetch.wait.max.ms": 10},
        )
