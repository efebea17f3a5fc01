"""Pipelines with cycles: a task that feeds records back into its own input topic (an
iteration) needs nothing special from the ledger - every emission has a fresh id - only an
iteration bound in the user's code. Each source record completes after its last iteration."""

from __future__ import annotations

import threading
import time

import pytest

from broker import topics
from broker.completions import OutcomeTail
from broker.dev.testing import unique_name
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_iterations_feeding_back_into_their_input_complete(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("cycle"))
    loop, results = f"{ns.name}.loop", f"{ns.name}.results"
    topics.create(settings, ns, 3, {loop: 3, results: 1})
    max_iterations = 200
    iterations: dict[int, int] = {}

    def step(record: TaskRecord, ctx: TaskContext) -> None:
        # value = "n:hops"; iterate the Collatz map until 1 (or the bound), then emit a result.
        n, hops = (int(x) for x in (record.value or b"1:0").split(b":"))
        assert record.tracking is not None
        if n == 1 or hops >= max_iterations:
            iterations[record.tracking.origin] = hops
            ctx.emit(results, record.key, b"%d" % hops)
            return
        nxt = n // 2 if n % 2 == 0 else 3 * n + 1
        ctx.emit(loop, record.key, b"%d:%d" % (nxt, hops + 1))

    def sink(record: TaskRecord, ctx: TaskContext) -> None:
        return None

    from broker.acker import Acker, AckerConfig

    starts = list(range(1, 301))
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker")))
    tail = OutcomeTail(settings, ns)
    done = threading.Event()
    threads = [
        threading.Thread(target=acker.run, kwargs={"until": lambda _a: done.is_set()}, daemon=True),
    ]
    tasks = [
        Task(settings, ns, [loop], unique_name("step"), step),
        Task(settings, ns, [results], unique_name("sink"), sink),
    ]
    threads += [threading.Thread(target=t.run, daemon=True) for t in tasks]
    for thread in threads:
        thread.start()
    source = Source(settings, ns, SourceConfig(timeout_ms=300_000))
    origin_of_start = {source.send(loop, f"n{n}", b"%d:0" % n).origin: n for n in starts}
    source.close()
    deadline = time.monotonic() + 120
    try:
        while len(set(tail.log.completed_origins()) & set(origin_of_start)) < len(starts):
            assert time.monotonic() < deadline, "iterations did not all complete"
            tail.poll(0.2)
    finally:
        done.set()
        for task in tasks:
            task.stop()
        for thread in threads:
            thread.join(30)
        tail.close()
    # Every record went round its loop exactly as often as the iteration says, then completed
    # exactly once, without a replay.
    for origin, n in origin_of_start.items():
        assert iterations[origin] == min(collatz_steps(n), max_iterations)
    assert all(count == 1 for count in tail.log.completed_origins().values())
    assert tail.log.replays() == 0
    assert sum(iterations.values()) > 10_000  # the loops really ran (Collatz 1..300)
