"""What a Source writes for a fixed and for an adaptive timeout (no cluster: the producer is a
stand-in that keeps what was produced)."""

from __future__ import annotations

from typing import Any

import pytest

from broker import ids
from broker.errors import ConfigurationError
from broker.headers import ADAPTIVE_FALLBACK_MS, AUTO_TIMEOUT_MS
from broker.schemas import (
    PERSIST_ADAPTIVE,
    PERSIST_BACKOFF,
    PersistedRecord,
    PersistPrefixes,
    read_persist_prefixes,
)
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig


class KeepingProducer:
    def __init__(self) -> None:
        self.produced: list[dict[str, Any]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Any = None, callback: Any = None, timestamp: int = 0,
                headers: list[tuple[str, bytes | None]] | None = None) -> None:
        self.produced.append({"topic": topic, "value": value, "key": key, "partition": partition, "headers": headers})

    def poll(self, *_: Any) -> int:
        return 0


def source(config: SourceConfig) -> tuple[Source, KeepingProducer]:
    src = Source(KafkaSettings("fake:9092"), "unit", config)
    src._ledger_partitions = 2  # what topics.check would have found
    src._placements.partitions["orders"] = 4
    producer = KeepingProducer()
    src._producer = producer  # type: ignore[assignment]
    src._pending.use(producer)  # type: ignore[arg-type]  # the persist records' producer too
    return src, producer


def persist_of(producer: KeepingProducer) -> tuple[PersistPrefixes, PersistedRecord]:
    (p,) = [p for p in producer.produced if p["topic"] == "unit.persist"]
    assert not p.get("headers")  # the acker registers it from its value's prefix
    assert ids.decode_id(p["key"]) == PersistedRecord.decode(p["value"]).srid
    return read_persist_prefixes([p["value"]]), PersistedRecord.decode(p["value"])


def test_a_fixed_timeout_is_the_deadline_in_the_prefix() -> None:
    src, producer = source(SourceConfig(timeout_ms=7_000))
    src.send("orders", "k", "v")
    prefix, record = persist_of(producer)
    backoff = PERSIST_BACKOFF if record.retry is not None else 0  # the record's layout
    assert (int(prefix.srids[0]), int(prefix.roots[0]), int(prefix.flags[0])) == (record.srid, record.root_xor, backoff)
    assert int(prefix.deadlines_ms[0]) == record.created_ms + 7_000 and record.timeout_ms == 7_000


@pytest.mark.parametrize("how", ["config", "send"])
def test_an_auto_timeout_marks_the_persist_record_for_the_acker(how: str) -> None:
    src, producer = source(SourceConfig(timeout_ms="auto") if how == "config" else SourceConfig())
    src.send("orders", "k", "v", timeout_ms="auto" if how == "send" else None)
    prefix, record = persist_of(producer)
    backoff = PERSIST_BACKOFF if record.retry is not None else 0  # the record's layout
    assert int(prefix.flags[0]) == PERSIST_ADAPTIVE | backoff and record.topic == "orders"
    assert record.timeout_ms == AUTO_TIMEOUT_MS  # a replay, built from the value, is auto too
    assert int(prefix.deadlines_ms[0]) == record.created_ms + ADAPTIVE_FALLBACK_MS


@pytest.mark.parametrize("bad", [0, -1, -30_000, "fast", 1.5, True])
def test_a_timeout_is_positive_ms_or_auto(bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        Source(KafkaSettings("fake:9092"), "unit", SourceConfig(timeout_ms=bad))
    src, _ = source(SourceConfig())
    if bad != 0:  # 0 (falsy) means "the configured one", as it always did
        with pytest.raises(ConfigurationError):
            src.send("orders", "k", "v", timeout_ms=bad)


@pytest.mark.parametrize("bad", [-1, 1001, 2**31, 1.5, "5", True])
def test_max_attempts_is_a_whole_number_up_to_the_bound(bad: Any) -> None:
    """The acker quarantines a persist record with more than MAX_ATTEMPTS attempts: the source
    refuses them first, in its config and per send."""
    with pytest.raises(ConfigurationError, match="max_attempts must be a whole number from 1 to 1000"):
        Source(KafkaSettings("fake:9092"), "unit", SourceConfig(max_attempts=bad))
    src, producer = source(SourceConfig())
    with pytest.raises(ConfigurationError):
        src.send("orders", "k", "v", max_attempts=bad)
    with pytest.raises(ConfigurationError):
        src.send_many("orders", [("k", "v")], max_attempts=bad)
    assert not producer.produced
    src.send("orders", "k", "v", max_attempts=1000)
    assert persist_of(producer)[1].max_attempts == 1000
