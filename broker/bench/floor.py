"""The client-side floor of the data path: what confluent-kafka itself costs per record.

The pipeline's Python processes touch every source record through the client library: the
source produces a persist record (two headers, a delivery callback: the data record waits
for it) and a data record (its tracking header, ``rb-t``: the ``*_4_headers`` figures keep
the name they had when it was four headers); the task consumes the data record and
reads its headers; the acker consumes the persist record and produces its tombstone (one
header). Each of those calls has a price in the library that no code of ours can lower,
and headers and per-record callbacks are most of it. These figures measure them in one
process on the bench's broker - CPU of the whole process (the library's threads included)
per record, produce until delivered, consume until read - next to the same calls without
headers, which is what the raw baseline pays. ``floor.pipeline_us_per_record`` adds up the
calls one completed record makes in the pipeline as designed; a pipeline on this data path
cannot cost less.
"""

from __future__ import annotations

import resource
import time
import uuid
from collections.abc import Callable
from typing import Any

from broker.bench.figures import Figures

ID = b"\x00\x00\x01\x8c\x12\x34\x56\x78"
VALUE = b"v" * 100
PERSIST_VALUE = b"p" * 150
DATA_HEADERS = [("rb-t", ID + ID)]
PERSIST_HEADERS = [("rb-root", ID), ("rb-deadline", ID)]
OUTCOME_HEADERS = [("rb-outcome", b"completed")]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _produce_cost(producer: Any, topic: str, n: int, partitions: int, headers: list[tuple[str, bytes]] | None,
                  value: bytes | None, callback: bool) -> float:
    """µs of CPU per record to produce ``n`` records and have them delivered."""
    def done(_err: Any, _msg: Any) -> None:
        return None

    kwargs: dict[str, Any] = {}
    if headers is not None:
        kwargs["headers"] = headers
    if callback:
        kwargs["on_delivery"] = done
    produce, poll = producer.produce, producer.poll
    began = _cpu_s()
    for i in range(n):
        key = i.to_bytes(8, "big")
        while True:
            try:
                produce(topic, value, key, partition=i % partitions, **kwargs)
                break
            except BufferError:
                poll(0.005)
        if not i & 1023:
            poll(0)
    producer.flush(60)
    return (_cpu_s() - began) / n * 1e6


def _consume_cost(make_consumer: Callable[[], Any], topic: str, n: int, read_headers: bool) -> float | None:
    """µs of CPU per record to consume ``n`` records (and their headers)."""
    consumer = make_consumer()
    consumer.subscribe([topic])
    seen, began, deadline = 0, None, time.monotonic() + 60
    try:
        while seen < n and time.monotonic() < deadline:
            msgs = consumer.consume(1000, 0.5)
            if msgs and began is None:
                began = _cpu_s()
            for m in msgs:
                m.value()
                m.key()
                if read_headers:
                    m.headers()
            seen += len(msgs)
    finally:
        consumer.close()
    if began is None or seen < n:
        return None
    return (_cpu_s() - began) / n * 1e6


def measure_floor(bootstrap: str, settings: Any, figures: Figures, *, records: int, partitions: int,
                  created: list[str]) -> dict[str, float | None]:
    """Fill ``floor.*``; the topics made are appended to ``created``."""
    from confluent_kafka import Consumer, Producer

    from broker.dev.testing import create_topics

    run = uuid.uuid4().hex[:8]
    plain, headed = f"bench-floor-{run}-plain", f"bench-floor-{run}-headers"
    create_topics(bootstrap, {plain: partitions, headed: partitions})
    created += [plain, headed]
    # The Source's producer settings (idempotent, acks=all, lz4), its linger.
    producer = Producer(settings.producer_config(defaults={"linger.ms": 10}))
    _produce_cost(producer, plain, min(records, 5_000), partitions, None, VALUE, False)  # warm-up
    costs: dict[str, float | None] = {
        "produce": _produce_cost(producer, plain, records, partitions, None, VALUE, False),
        "produce_4_headers": _produce_cost(producer, headed, records, partitions, DATA_HEADERS, VALUE, False),
        "produce_2_headers_callback": _produce_cost(
            producer, plain, records, partitions, PERSIST_HEADERS, PERSIST_VALUE, True),
        "produce_tombstone_1_header": _produce_cost(
            producer, plain, records, partitions, OUTCOME_HEADERS, None, False),
    }

    def consumer() -> Any:
        return Consumer(settings.consumer_config(
            f"bench-floor-{uuid.uuid4().hex[:8]}", defaults={"auto.offset.reset": "earliest", "enable.auto.commit": False}))

    costs["consume"] = _consume_cost(consumer, plain, records, False)
    costs["consume_4_headers"] = _consume_cost(consumer, headed, records, True)
    for name, value in costs.items():
        figures.set(f"floor.{name}_us_per_record", value,
                    unavailable=None if value is not None else "the records were not all read back in 60 s")
    parts = [costs["produce_2_headers_callback"], costs["produce_4_headers"], costs["consume_4_headers"],
             costs["consume_4_headers"], costs["produce_tombstone_1_header"]]
    if all(p is not None for p in parts):
        # source: persist (+ callback) and data; task: the data record; acker: the persist
        # record (two headers, counted at the data record's four: ~1 µs high) and its tombstone.
        figures.set("floor.pipeline_us_per_record", sum(p for p in parts if p is not None))
    else:
        figures.set("floor.pipeline_us_per_record", None, unavailable="a part was not measured")
    if costs["produce"] is not None and costs["consume"] is not None:
        figures.set("floor.raw_us_per_record", costs["produce"] + costs["consume"])
    else:
        figures.set("floor.raw_us_per_record", None, unavailable="a part was not measured")
    # CPU-bound on the same cores, throughput goes as 1 / CPU per record: the best pipeline/raw
    # throughput ratio this data path allows, before any code of ours or the broker's work.
    figures.ratio("floor.best_pipeline_vs_raw", "floor.raw_us_per_record", "floor.pipeline_us_per_record")
    return costs
