"""A non-transactional Source's data records wait for their persist records, accounted per
epoch (broker.delivery.PendingData): released only once the producer of their epoch holds
nothing undelivered, in send order, without those whose persist record failed."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from broker.delivery import PendingData
from broker.schemas import PersistedRecord


class Producer:
    """Holds what was produced as undelivered until ``deliver``; reports failures when polled."""

    def __init__(self) -> None:
        self.undelivered: list[Any] = []
        self.data: list[bytes] = []
        self.reports: list[tuple[Any, Any]] = []

    def produce(self, topic: str, value: bytes | None = None, *_: Any, **__: Any) -> None:
        self.data.append(value)  # type: ignore[arg-type]
        self.undelivered.append(value)

    def deliver(self, failed: Any = None) -> None:
        """Every record delivered; ``failed``: a (callback, message) reported failed."""
        self.undelivered.clear()
        if failed is not None:
            self.reports.append(failed)

    def poll(self, _timeout: float = 0) -> int:
        for callback, msg in self.reports:
            callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), msg)
        self.reports.clear()
        return 0

    def flush(self, _timeout: float = 0) -> int:
        self.poll()
        return len(self)

    def __len__(self) -> int:
        return len(self.undelivered) + len(self.reports)


class Msg:
    def __init__(self, srid: int) -> None:
        self.srid = srid

    def key(self) -> bytes:
        return self.srid.to_bytes(8, "big")

    def value(self) -> bytes:
        return PersistedRecord(
            srid=self.srid, origin=self.srid, attempt=1, root_xor=1, record_id=1, topic="t",
            key_hash_partition=0, partitioner="kafka", key=b"k", value=b"v", headers=(),
            created_ms=1, timeout_ms=1000, max_attempts=5, history=(),
        ).encode()


def test_an_epoch_lasts_the_producers_linger() -> None:
    from broker.settings import KafkaSettings
    from broker.source import Source, SourceConfig

    assert Source(KafkaSettings("fake:9092"), "unit")._pending.epoch_s == 0.01
    assert Source(KafkaSettings("fake:9092"), "unit", SourceConfig(producer={"linger.ms": 25}))._pending.epoch_s == 0.025


def _send(pending: PendingData, srid: int) -> None:
    pending.producer.undelivered.append(b"persist")  # type: ignore[attr-defined]
    pending.add(srid.to_bytes(8, "big"), "t", b"k", b"data-%d" % srid, 0, [])


def test_an_epoch_is_released_only_once_its_producer_is_drained_in_send_order() -> None:
    a, b = Producer(), Producer()
    pending = PendingData(a, b, epoch_s=0.0)  # type: ignore[arg-type]  # every settle closes the open epoch
    for srid in (1, 2, 3):
        _send(pending, srid)
    pending.settle()  # epoch 1 (on a) closed; the next records go to b
    assert pending.producer is b and a.data == b.data == []
    _send(pending, 4)
    pending.settle()  # a still holds undelivered persist records: nothing released
    assert a.data == b.data == [] and len(pending) == 4
    a.deliver()
    pending.settle()
    assert b.data == [b"data-1", b"data-2", b"data-3"]  # into the open epoch's producer
    b.deliver()
    pending.settle()
    pending.settle()
    assert a.data == [b"data-4"] and len(pending) == 0


def test_a_failed_persist_record_drops_its_data_record_and_is_reported() -> None:
    a, b = Producer(), Producer()
    pending = PendingData(a, b, epoch_s=0.0)  # type: ignore[arg-type]  # every settle closes the open epoch
    for srid in (1, 2, 3):
        _send(pending, srid)
    pending.settle()
    a.deliver(failed=(pending.on_persist, Msg(2)))
    pending.settle()  # the failure report is served before the epoch counts as drained
    assert b.data == [b"data-1", b"data-3"]
    assert [f.srid for f in pending.take_failures()] == [2]


def test_drain_waits_for_every_epoch_and_delivers_their_data() -> None:
    a, b = Producer(), Producer()
    pending = PendingData(a, b, epoch_s=0.0)  # type: ignore[arg-type]  # every settle closes the open epoch
    for srid in (1, 2):
        _send(pending, srid)
    pending.settle()
    _send(pending, 3)
    a.flush = lambda _t=0: a.deliver() or 0  # type: ignore[method-assign]
    b.flush = lambda _t=0: b.deliver() or 0  # type: ignore[method-assign]
    assert pending.drain(1.0) == 0
    assert sorted(a.data + b.data) == [b"data-1", b"data-2", b"data-3"] and len(pending) == 0


def test_a_record_with_only_its_tracking_header_is_produced_with_that_header_alone() -> None:
    produced: list[tuple[Any, ...]] = []

    class Recording(Producer):
        def produce(self, topic: str, value: bytes | None = None, *args: Any, **__: Any) -> None:
            super().produce(topic, value)
            produced.append((topic, value, *args))

    a, b = Recording(), Recording()
    pending = PendingData(a, b, epoch_s=0.0)  # type: ignore[arg-type]  # every settle closes the open epoch
    tracking = ("rb-t", b"\x01" * 16)
    pending.add(b"k1", "t", b"k", b"v1", 2, tracking)
    pending.extend([b"k2", "t", b"k", b"v2", 3, [("h", b"x"), tracking]])
    assert len(pending) == 2
    pending.settle()
    pending.settle()  # a is drained: the epoch's data records go out with b
    assert produced == [
        ("t", b"v1", b"k", 2, None, None, 0, [tracking]),
        ("t", b"v2", b"k", 3, None, None, 0, [("h", b"x"), tracking]),
    ]
    assert len(pending) == 0


def test_created_ms_keeps_send_order_across_the_two_producers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Within one producer a partition keeps its records in send order; across the switch the
    created time must say it: a record sent after the switch in the same millisecond - or
    after the clock stepped back - is created later than every record before it."""
    now = [1_000.0]
    a, b = Producer(), Producer()
    pending = PendingData(a, b, epoch_s=0.0, wall_clock=lambda: now[0])  # type: ignore[arg-type]
    created = [pending.created_ms(), pending.created_ms()]
    _send(pending, 1)
    pending.settle()  # a switch of producers within the same millisecond
    assert pending.producer is b
    created.append(pending.created_ms())
    now[0] = 999.0  # the wall clock steps back
    created.append(pending.created_ms())
    now[0] = 1_002.0
    created.append(pending.created_ms())
    assert created == [1_000_000, 1_000_000, 1_000_001, 1_000_001, 1_002_000]
