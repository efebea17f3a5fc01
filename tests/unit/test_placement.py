"""A source's placements (broker.source.placement): the persist record's placement fields encoded per
partition, and the known key partitions a batch looks up without a call."""

from __future__ import annotations

import pytest

import broker.source.placement
from broker.partitioning import get_partitioner
from broker.schemas import avro_placement
from broker.source.placement import Placements
from broker.topics import Namespace


def _placements(max_keys: int = broker.source.placement.MAX_KEYS) -> Placements:
    placements = Placements(Namespace("unit"), {"b": "murmur2_random"}, lambda names: dict.fromkeys(names),
                            max_keys=max_keys)
    placements.partitions.update({"a": 4, "b": 3})  # as if checked on the cluster
    return placements


def test_each_partitions_placement_is_encoded_once_with_the_topics_partitioner() -> None:
    placements = _placements()
    for topic, n in (("a", 4), ("b", 3)):
        encoded = placements.placements(topic)
        assert encoded == [avro_placement(topic, p, placements.partitioner(topic)) for p in range(n)]
        assert placements.placements(topic) is encoded
        assert [placements.placement(topic, p) for p in range(n)] == encoded


def test_known_keys_are_the_partitions_key_hash_partition_computed() -> None:
    placements = _placements(max_keys=3)
    known = placements.known_keys("a")
    assert known == {}
    keys = [b"k%d" % i for i in range(3)]
    partitions = [placements.key_hash_partition("a", k) for k in keys]
    assert partitions == [get_partitioner("kafka").partition(k, 4) for k in keys]
    assert known == dict(zip(keys, partitions, strict=True)) and placements.known_keys("a") is known
    placements.key_hash_partition("a", b"k3")  # over MAX_KEYS: forgotten in place
    assert placements.known_keys("a") is known and known == {b"k3": get_partitioner("kafka").partition(b"k3", 4)}
    assert placements.key_hash_partition("a", None) in range(4) and None not in known


def test_a_batch_learns_its_new_keys_together(monkeypatch: pytest.MonkeyPatch) -> None:
    placements = _placements()
    kafka = get_partitioner("kafka")
    calls: list[int] = []
    partition_many = type(kafka).partition_many
    monkeypatch.setattr(type(kafka), "partition_many",
                        lambda self, keys, n: calls.append(len(keys)) or partition_many(self, keys, n))
    few = [(b"f%d" % i, b"v") for i in range(broker.source.placement.BATCH_KEYS - 1)]
    placements.learn("a", [k for k, _ in few])  # too few to hash together: key_hash_partition does them
    assert placements.known_keys("a") == {} and calls == []
    records = [(b"k%d" % (i % 50), b"v") for i in range(200)] + [("text", b"v"), (None, b"v")]
    placements.learn("a", [k for k, _ in records])
    assert calls == [51]  # each new key once; the str key as UTF-8; no None
    expected = {k: kafka.partition(k, 4) for k in [b"k%d" % i for i in range(50)] + [b"text"]}
    assert placements.known_keys("a") == expected
    placements.learn("a", [k for k, _ in records])  # nothing new
    assert calls == [51]


def test_a_batch_over_max_keys_forgets_the_old_ones() -> None:
    placements = _placements(max_keys=60)
    placements.learn("a", [b"old%d" % i for i in range(40)])
    placements.learn("a", [b"new%d" % i for i in range(40)])
    assert placements.known_keys("a") == {b"new%d" % i: get_partitioner("kafka").partition(b"new%d" % i, 4) for i in range(40)}


def test_a_keys_ledger_partition_is_its_partition_in_a_topic_of_p_partitions() -> None:
    placements = _placements()  # "a" has 4 partitions
    kafka = get_partitioner("kafka")
    keys = [b"k%d" % i for i in range(200)]
    # as many ledger partitions as the topic has: the key-hash partition itself
    assert [placements.ledger_partition("a", k, 4, kafka.partition(k, 4)) for k in keys] == [
        kafka.partition(k, 4) for k in keys]
    assert placements.known_ledger("a") == {}
    # another count: the key's partition among P, spread over all P (not only the topic's 4)
    got = [placements.ledger_partition("a", k, 16, kafka.partition(k, 4)) for k in keys]
    assert got == [kafka.partition(k, 16) for k in keys] and set(got) == set(range(16))
    assert placements.known_ledger("a") == dict(zip(keys, got, strict=True))


def test_a_batch_learns_its_new_keys_ledger_partitions_too() -> None:
    placements = _placements()
    keys = [b"n%d" % i for i in range(64)]
    placements.learn("a", keys, 16)
    kafka = get_partitioner("kafka")
    assert placements.known_ledger("a") == {k: kafka.partition(k, 16) for k in keys}
    placements.learn("a", [b"m%d" % i for i in range(64)], 4)  # the same count: nothing to learn
    assert len(placements.known_ledger("a")) == 64
