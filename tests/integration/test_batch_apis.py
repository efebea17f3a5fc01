"""The batch APIs end to end on a real broker: records sent with ``Source.send_many`` through a
task with a batch handler (children, fail marks, replays) and a per-record task after it; every
source record completes exactly once, the failed first attempts after one replay."""

from __future__ import annotations

import threading
import time

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord
from broker.topics import replay_topic

pytestmark = pytest.mark.integration


def test_send_many_and_a_batch_handler_complete_every_record_once(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("batch"))
    orders, out = f"{ns.name}.orders", f"{ns.name}.out"
    topics.create(settings, ns, 3, {orders: 3, out: 2})
    batches: list[int] = []
    children: dict[int, tuple[int, int]] = {}  # origin -> attempt of the parent, of the child
    lock = threading.Lock()

    def split(records: list[TaskRecord], contexts: list[TaskContext]) -> None:
        batches.append(len(records))
        for record, ctx in zip(records, contexts, strict=True):
            assert record.tracking is not None and ctx.record is record
            if record.value == b"fail" and record.tracking.attempt == 1:
                ctx.fail("first attempts of 'fail' fail")
            else:
                ctx.emit(out, record.key, record.value)

    def sink(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        with lock:
            children[record.tracking.origin] = (record.tracking.attempt, record.tracking.srid)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker")))
    tail = OutcomeTail(settings, ns)
    done = threading.Event()
    tasks = [
        Task(settings, ns, [orders, replay_topic(orders)], unique_name("split"), batch_handler=split),
        Task(settings, ns, [out], unique_name("sink"), sink),
    ]
    threads = [threading.Thread(target=acker.run, kwargs={"until": lambda _a: done.is_set()}, daemon=True)]
    threads += [threading.Thread(target=t.run, daemon=True) for t in tasks]
    for thread in threads:
        thread.start()
    values = [b"fail" if i % 10 == 0 else b"ok-%d" % i for i in range(300)]
    with Source(settings, ns, SourceConfig(timeout_ms=300_000)) as source:
        results = source.send_many(orders, [(f"k{i % 17}", v) for i, v in enumerate(values[:150])])
        results += source.send_many(orders, [(f"k{i % 17}", v) for i, v in enumerate(values[150:])])
    origins = {r.origin for r in results}
    deadline = time.monotonic() + 120
    try:
        while len(set(tail.log.completed_origins()) & origins) < len(origins):
            assert time.monotonic() < deadline, "not every record completed"
            tail.poll(0.2)
    finally:
        done.set()
        for task in tasks:
            task.stop()
        for thread in threads:
            thread.join(30)
        tail.close()
    assert all(count == 1 for o, count in tail.log.completed_origins().items() if o in origins)
    assert tail.log.replays() == values.count(b"fail") == 30
    assert sum(batches) == 300 + 30  # each first attempt and each replay, once
    failed_first = {r.origin for r, v in zip(results, values, strict=True) if v == b"fail"}
    assert set(children) == origins  # every record's child, with its parent's origin and attempt
    assert all(children[o][0] == (2 if o in failed_first else 1) for o in origins)
