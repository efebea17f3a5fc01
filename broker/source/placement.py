"""Where a ``Source`` puts a record (docs/design.md §8): the partition count of its data topic
(checked once, with its replay topic's), its key's partition (``key_hash_partition``, by the
topic's partitioner, broker.partitioning), and the persist record's placement fields - topic,
key-hash partition, partitioner - encoded once per partition.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from broker.errors import ConfigurationError
from broker.partitioning import get_partitioner
from broker.schemas import avro_placement
from broker.topics import Namespace, replay_topic

MAX_KEYS = 65_536
"""Key partitions kept per topic (keys repeat: that is what keys are for); then forgotten."""
BATCH_KEYS = 32
"""From this many new keys in a batch, ``learn`` hashes them together (numpy): one call has a
fixed cost about that of hashing this many keys one by one."""


class Placements:
    """A source's data topics as far as used: their partition counts, their keys' partitions
    and their encoded placements, each looked up once."""

    __slots__ = ("_encoded", "_keys", "_ledger", "_partition_counts", "max_keys", "ns", "partitioners", "partitions")

    def __init__(
        self, ns: Namespace, partitioners: Mapping[str, str], partition_counts: Callable[[list[str]], Mapping[str, int | None]],
        *, max_keys: int = MAX_KEYS,
    ) -> None:
        self._partition_counts = partition_counts  # a KafkaPort's
        self.max_keys = max_keys  # key partitions kept per topic (``MAX_KEYS``)
        self.ns = ns
        self.partitioners = partitioners  # data topic -> partitioner name; unlisted: "kafka"
        self.partitions: dict[str, int] = {}
        self._keys: dict[str, dict[bytes, int]] = {}  # topic -> key -> partition
        # topic -> key -> ledger partition, for a topic whose partition count is not P's
        self._ledger: dict[str, dict[bytes, int]] = {}
        # topic -> partition -> its persist records' encoded topic, partition and partitioner
        self._encoded: dict[str, list[bytes]] = {}

    def data_partitions(self, topic: str) -> int:
        """The partition count of ``topic``; it and its replay topic must exist with the same
        count (``ConfigurationError`` otherwise)."""
        n = self.partitions.get(topic)
        if n is None:
            replay = replay_topic(topic)
            counts = self._partition_counts([topic, replay])
            n = counts[topic]
            if n is None:
                raise ConfigurationError(f"data topic {topic} does not exist")
            if counts[replay] != n:
                raise ConfigurationError(
                    f"{replay} must exist with the {n} partitions of {topic} (it has "
                    f"{counts[replay]}): replaybroker topics create --namespace "
                    f"{self.ns.name} --data-topic {topic}:{n}"
                )
            self.partitions[topic] = n
        return n

    def key_hash_partition(self, topic: str, key: bytes | None) -> int:
        if key is None:
            return random.randrange(self.data_partitions(topic))
        known = self.known_keys(topic)
        cached = known.get(key)
        if cached is not None:
            return cached
        n = self.data_partitions(topic)
        partition = get_partitioner(self.partitioner(topic)).partition(key, n)
        if len(known) >= self.max_keys:
            known.clear()  # in place: a batch's ``known_keys`` stays this topic's
        known[key] = partition
        return partition

    def ledger_partition(self, topic: str, key: bytes, ledger_partitions: int, partition: int) -> int:
        """The ledger partition of ``key``'s records (``partition``: its key-hash partition):
        the partition the key would have, by ``topic``'s partitioner, in a topic of
        ``ledger_partitions`` - its key-hash partition itself when the data topic has as many.
        So every record of a key, each attempt of it included, is decided by one acker, in one
        table (docs/design.md §6); the keys spread over the ledger partitions as evenly as
        over a topic's partitions."""
        if self.data_partitions(topic) == ledger_partitions:
            return partition
        known = self.known_ledger(topic)
        cached = known.get(key)
        if cached is None:
            if len(known) >= self.max_keys:
                known.clear()
            cached = known[key] = get_partitioner(self.partitioner(topic)).partition(key, ledger_partitions)
        return cached

    def known_ledger(self, topic: str) -> dict[bytes, int]:
        """The keys of ``topic`` whose ledger partition ``ledger_partition`` knows, when it is
        not their key-hash partition (key -> ledger partition)."""
        known = self._ledger.get(topic)
        if known is None:
            known = self._ledger[topic] = {}
        return known

    def learn(self, topic: str, keys: Iterable[Any], ledger_partitions: int | None = None) -> None:
        """Hash the ``keys`` not known yet together, when there are ``BATCH_KEYS`` or more:
        ``key_hash_partition`` then finds each of them known (and ``ledger_partition`` too,
        given ``ledger_partitions``)."""
        known = self.known_keys(topic)
        # None and str keys too; a key of another type is left to the send, which refuses it
        missing: list[Any] = [k for k in keys if k not in known]
        if len(missing) < BATCH_KEYS:
            return
        encoded = {k if type(k) is bytes else k.encode() for k in missing if type(k) in (bytes, str)}
        fresh: list[bytes] = [k for k in encoded if k not in known]
        if len(fresh) < BATCH_KEYS:
            return
        if len(known) + len(fresh) > self.max_keys:
            known.clear()
        partitioner, n = get_partitioner(self.partitioner(topic)), self.data_partitions(topic)
        if ledger_partitions is None or ledger_partitions == n:
            known.update(zip(fresh, partitioner.partition_many(fresh, n), strict=True))
            return
        partitions, lps = partitioner.partition_many_by(fresh, (n, ledger_partitions))  # hashed once
        known.update(zip(fresh, partitions, strict=True))
        ledger = self.known_ledger(topic)
        if len(ledger) + len(fresh) > self.max_keys:
            ledger.clear()
        ledger.update(zip(fresh, lps, strict=True))

    def placement(self, topic: str, partition: int) -> bytes:
        """The persist record's topic, key-hash partition and partitioner fields, encoded."""
        return self.placements(topic)[partition]

    def placements(self, topic: str) -> list[bytes]:
        """``placement`` of each partition of ``topic``, by partition (encoded at first use)."""
        encoded = self._encoded.get(topic)
        if encoded is None:
            partitioner = self.partitioner(topic)
            encoded = self._encoded[topic] = [
                avro_placement(topic, p, partitioner) for p in range(self.data_partitions(topic))
            ]
        return encoded

    def known_keys(self, topic: str) -> dict[bytes, int]:
        """The keys of ``topic`` whose partition ``key_hash_partition`` knows (key -> partition):
        a batch looks them up without a call, and calls it for the others."""
        known = self._keys.get(topic)
        if known is None:
            known = self._keys[topic] = {}
        return known

    def partitioner(self, topic: str) -> str:
        """The name of ``topic``'s partitioner (broker.partitioning)."""
        return self.partitioners.get(topic, "kafka")
