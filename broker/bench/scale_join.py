"""A task's longest pause while a second task joins its group: the consumer group protocol
(KIP-848, what tasks use) against the classic protocol with the eager ``range`` assignor
(what tasks used before; every member gives up every partition at each rebalance).

Two ``Task`` instances in this process share a group over a data topic of 8 partitions and
its replay topic; a source sends at a fixed rate. The first task's handler notes when it
handles each record. Once it handles records steadily the second starts; the figure is the
longest gap between the first task's records from the join until ``seconds`` later (the
steady gap before the join is its baseline). Nothing is acked to an acker: the gap is in the
task's own processing, which is what a rebalance stops.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from broker import topics
from broker.bench.figures import Figures
from broker.bench.hops import Env
from broker.bench.procs import BenchError
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord

DATA_PARTITIONS = 8


class EagerTask(Task):
    """A task on the classic protocol with the eager ``range`` assignor: the baseline only.
    ``TaskConfig`` offers cooperative-sticky as the classic fallback, never this."""

    def _consumer_config(self) -> dict[str, Any]:
        return {**super()._consumer_config(), "partition.assignment.strategy": "range"}


def _gap_ms(times: list[float], start: float, end: float) -> float:
    """The longest gap between ``start``, the times in [start, end] and ``end``, ms."""
    inside = [start, *sorted(t for t in times if start <= t <= end), end]
    return 1000 * max(b - a for a, b in itertools.pairwise(inside))


def _one(env: Env, eager: bool, seconds: float, rate: float) -> dict[str, float]:
    ns = topics.Namespace(env.unique("join-eager" if eager else "join"))
    data = f"{ns.name}.data"
    topics.create(env.settings, ns, 16, {data: DATA_PARTITIONS})
    handled: dict[str, list[float]] = {"a": [], "b": []}
    kind = EagerTask if eager else Task
    config = TaskConfig(group_protocol="classic" if eager else "consumer")

    def task(name: str) -> Task:
        def handler(_record: TaskRecord, _ctx: TaskContext) -> None:
            handled[name].append(time.monotonic())

        return kind(env.settings, ns, [data, topics.replay_topic(data)], f"{ns.name}.task", handler, config)

    stop = threading.Event()
    source = Source(env.settings, ns, SourceConfig(timeout_ms=600_000))

    def send() -> None:
        i = 0
        while not stop.wait(1 / rate):
            source.send(data, b"key-%d" % (i % 1000), b"v")
            i += 1

    tasks = {"a": task("a")}
    threads = [threading.Thread(target=send, daemon=True), threading.Thread(target=tasks["a"].run, daemon=True)]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 120
        while len(handled["a"]) < 2 * rate or time.monotonic() - handled["a"][-int(rate)] > 1.5:
            if time.monotonic() > deadline:
                raise BenchError("the first task never handled records steadily")
            time.sleep(0.1)
        steady_from = time.monotonic()
        time.sleep(min(seconds, 4.0))
        joined = time.monotonic()
        tasks["b"] = task("b")
        threads.append(threading.Thread(target=tasks["b"].run, daemon=True))
        threads[-1].start()
        time.sleep(seconds)
        end = time.monotonic()
        if not handled["b"]:
            raise BenchError(f"the second task handled nothing within {seconds:.0f}s of joining")
        return {
            "join_max_gap_ms": _gap_ms(handled["a"], joined, end),
            "steady_max_gap_ms": _gap_ms(handled["a"], steady_from, joined),
            "b_records": len([t for t in handled["b"] if t <= end]),
            "b_first_s": handled["b"][0] - joined,
        }
    finally:
        stop.set()
        for each in tasks.values():
            each.stop()
        for th in threads:
            th.join(30)
        source.close()


def measure_join(env: Env, figures: Figures, *, seconds: float, rate: float) -> dict[str, Any]:
    runs = {"consumer": _one(env, False, seconds, rate), "eager": _one(env, True, seconds, rate)}
    figures.set("scale.task_join_max_gap_ms", runs["consumer"]["join_max_gap_ms"])
    figures.set("scale.task_join_max_gap_ms_eager", runs["eager"]["join_max_gap_ms"])
    figures.set("scale.task_steady_max_gap_ms", runs["consumer"]["steady_max_gap_ms"])
    return runs
