"""What one completed record costs Kafka: records, bytes and transaction markers appended per
topic, and where the broker's CPU goes (per JVM thread group).

A ``Snapshot`` before and after a measured run reads, for every topic the run touches
(its own topics and Kafka's internal ``__consumer_offsets`` / ``__transaction_state``):

- the log end offset of each partition: offsets appended = records + control records
  (transaction markers take an offset each);
- the records in ``[before, after)``, read back read_uncommitted (control records are not
  returned): markers = offsets appended - records read;
- the size of the partition's log segments on disk, when the broker's log directory is on
  this host (the embedded broker): bytes appended, as stored (batch headers, compression).
  Compacted topics are not cleaned during a run (their ``segment.ms`` keeps the segment
  active), so the difference is what was appended;
- the CPU time of each broker thread (``/proc/<pid>/task``), grouped by thread name
  without its number: which part of the broker does the work (network threads, request
  handlers, the group coordinator, the log cleaner, GC, JIT...).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INTERNAL = ("__consumer_offsets", "__transaction_state")


@dataclass
class Snapshot:
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    sizes: dict[tuple[str, int], int] = field(default_factory=dict)
    threads: dict[str, float] = field(default_factory=dict)  # thread group -> CPU seconds
    at: float = 0.0


def _partitions(settings: Any, topics: list[str]) -> dict[str, int]:
    from broker.kafka_io import partition_counts

    counts = partition_counts(settings, topics)
    return {t: n for t, n in counts.items() if n}


def _end_offsets(settings: Any, parts: dict[str, int]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.consumer_config(None, defaults={"group.id": f"bench-cost-{uuid.uuid4().hex[:8]}"}))
    try:
        ends = {}
        for topic, n in parts.items():
            for p in range(n):
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                ends[(topic, p)] = int(high)
        return ends
    finally:
        consumer.close()


def _disk_sizes(log_dir: Path | None, parts: dict[str, int]) -> dict[tuple[str, int], int]:
    if log_dir is None:
        return {}
    sizes = {}
    for topic, n in parts.items():
        for p in range(n):
            d = log_dir / f"{topic}-{p}"
            if d.is_dir():
                sizes[(topic, p)] = sum(f.stat().st_size for f in d.glob("*.log"))
    return sizes


_DIGITS = re.compile(r"[-#]?\d+")


def thread_cpu(pid: int | None) -> dict[str, float]:
    """CPU seconds of each thread group of process ``pid`` (Linux), by name less its numbers
    (the kernel keeps the first 15 characters of a Java thread's name)."""
    if pid is None:
        return {}
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        fields = rest.split()
        out[_DIGITS.sub("", name).strip("-") or name] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(out)


def snapshot(settings: Any, topics: list[str], *, log_dir: Path | None, kafka_pid: int | None) -> Snapshot:
    parts = _partitions(settings, [*topics, *INTERNAL])
    ends = _end_offsets(settings, parts)
    at = time.time()  # when the log ends were read: the edge bench.requests counts to as well
    return Snapshot(ends, _disk_sizes(log_dir, parts), thread_cpu(kafka_pid), at)


def _count_records(settings: Any, ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
    """Records (not control records) in each ``[start, end)``, read_uncommitted."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    todo = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    counts = {tp: 0 for tp in ranges}
    if not todo:
        return counts
    consumer = Consumer(settings.consumer_config(None, defaults={
        "group.id": f"bench-cost-{uuid.uuid4().hex[:8]}", "isolation.level": "read_uncommitted",
        "enable.partition.eof": True}))
    consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in todo.items()])
    open_ = set(todo)
    deadline = time.monotonic() + 120
    try:
        while open_ and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                tp = (msg.topic(), msg.partition())
                if tp not in open_:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        open_.discard(tp)
                    continue
                if msg.offset() < todo[tp][1]:
                    counts[tp] += 1
                if msg.offset() >= todo[tp][1] - 1:
                    open_.discard(tp)
    finally:
        consumer.close()
    return counts


def role_of(topic: str, namespace: str | None) -> str:
    """persist, acks, ledger, dlq, data, replay, __consumer_offsets, __transaction_state."""
    if topic in INTERNAL:
        return topic
    if namespace is not None and topic.startswith(namespace + "."):
        rest = topic[len(namespace) + 1:]
        return "replay" if rest.endswith(".replay") else rest
    return "replay" if topic.endswith(".replay") else "data"


def compare(settings: Any, before: Snapshot, after: Snapshot, records: int, namespace: str | None) -> dict[str, Any]:
    """Per topic role: records, markers and bytes appended per completed record; the broker's
    CPU per thread group (µs per record)."""
    ranges = {tp: (before.ends.get(tp, 0), end) for tp, end in after.ends.items()}
    counts = _count_records(settings, ranges)
    per: dict[str, dict[str, float]] = defaultdict(lambda: {"records": 0.0, "markers": 0.0, "bytes": 0.0})
    have_bytes = bool(after.sizes)
    for tp, (start, end) in ranges.items():
        role = role_of(tp[0], namespace)
        appended = end - start
        per[role]["records"] += counts[tp]
        per[role]["markers"] += appended - counts[tp]
        if have_bytes:
            per[role]["bytes"] += after.sizes.get(tp, 0) - before.sizes.get(tp, 0)
    n = max(records, 1)
    topics = {role: {"writes_per_record": v["records"] / n, "markers_per_record": v["markers"] / n,
                     **({"bytes_per_record": v["bytes"] / n} if have_bytes else {})}
              for role, v in sorted(per.items()) if v["records"] or v["markers"]}
    cpu = {name: after.threads[name] - before.threads.get(name, 0.0) for name in after.threads}
    busy = {name: round(1e6 * s / n, 1) for name, s in sorted(cpu.items(), key=lambda kv: -kv[1]) if s > 0}
    return {
        "records": records,
        "seconds": round(after.at - before.at, 2),
        "topics": topics,
        "writes_per_record": sum(v["records"] for v in per.values()) / n,
        "markers_per_record": sum(v["markers"] for v in per.values()) / n,
        "bytes_per_record": sum(v["bytes"] for v in per.values()) / n if have_bytes else None,
        "broker_cpu_us_per_record": busy,
    }
