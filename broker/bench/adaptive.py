"""Adaptive timeouts against a fixed timeout sized for the worst case, under a latency shift.

Two runs of the same traffic at the same time, one namespace each (source -> holding task ->
acker, all in this process, in threads): ``records`` at ``RATE``/s, the source's timeout
fixed in one run and ``"auto"`` in the other. The task acks each record ``hold`` after it
received it; ``hold`` follows the task's wall clock since the first send (``SHAPE``, seconds):
``BASE_HOLD_MS`` for 4 s, rising linearly to 5x over 5 s, 5x for 2 s, back over one second,
then base again. A few records (``DROPS``: four before the slow-down, one in it, three
after the estimate has forgotten it) are never acked on their first attempt: a task that lost
them.

- ``replay.{fixed,adaptive}_detect_p50_ms`` / ``_max_ms``: send of a dropped record -> its
  replay read from ``<topic>.replay`` (read_committed: the acker's transaction committed);
- ``replay.{fixed,adaptive}_spurious_per_1e5``: replays of records that were not dropped -
  a task that was only slow - per 10^5 records sent;
- ``replay.adaptive_detect_speedup``: fixed / adaptive detection p50 (goal >= 3).

The fixed timeout is sized for the worst case the way the adaptive one is sized for the
present: ``SAFETY`` x (the slow hold + ``PIPELINE_MS`` for the rest of the pipeline); it is
also the adaptive run's ceiling and initial timeout. A shift that is a step, faster than one
completion latency, is not followed: the records registered just before it get the old
estimate (docs/design.md §6); a ramp is followed while the latency grows by less than the
safety factor within one latency. The speed-up depends on the share of the latency that
shifts: the pipeline's own floor (commit interval, fetch waits) and the replay's path (a tick,
a commit) are the same for both.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.bench.figures import Figures
from broker.bench.hops import Env
from broker.bench.procs import BenchError
from broker.headers import Tracking
from broker.schemas import XorBatch
from broker.source import Source, SourceConfig, Timeout

RATE = 200.0  # records/s
BASE_HOLD_MS = 600.0  # the task's own latency (e.g. a call it makes), above the pipeline's
SHIFT = 5.0  # the task slows down 5x
SAFETY = 3.0
PIPELINE_MS = 500.0  # the rest of the pipeline's p99.9, in the fixed timeout's worst case
FLOOR_MS = 500
MIN_SAMPLES = 200
WINDOW_MS = 4_000
SHAPE = (4.0, 9.0, 11.0, 12.0)  # s since the first send: the ramp up starts, 5x, the ramp down, base
# s since the first send: four before the slow-down, one during it, three once the estimate
# has forgotten it (the last slow completions ~15 s, + the window)
DROPS = (2.5, 3.0, 3.5, 3.9, 10.0, 20.0, 20.5, 21.0)
FIXED_MS = int(SAFETY * (BASE_HOLD_MS * SHIFT + PIPELINE_MS))


def hold_ms(t: float) -> float:
    """The task's hold ``t`` s after the first send: base, a ramp to 5x, 5x, back."""
    up = np.interp(t, SHAPE, (0.0, 1.0, 1.0, 0.0))
    return float(BASE_HOLD_MS * (1.0 + (SHIFT - 1.0) * up))


class HoldingTask:
    """A task that acks each record ``hold_ms`` after receiving it, except the dropped ones'
    first attempts; it records when each origin's replay arrived."""

    def __init__(self, env: Env, ns: topics.Namespace, topic: str, started: float, dropped: set[bytes]) -> None:
        self.ns, self.started, self.dropped = ns, started, dropped
        self.consumer = Consumer(env.settings.consumer_config(
            env.unique("adaptive-task"), defaults={"fetch.wait.max.ms": 10, "auto.offset.reset": "earliest"},
        ))
        self.consumer.subscribe([topic, topics.replay_topic(topic)])
        self.producer = Producer(env.settings.producer_config(defaults={"linger.ms": 5}))
        self.partitions = env.partitions
        self.due: list[tuple[float, int, int]] = []  # (ack at, srid, record id), in receive order
        self.replayed_at: dict[int, float] = {}  # origin -> first replay received (wall s)
        self.replays: dict[int, int] = defaultdict(int)  # origin -> replays received
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for msg in self.consumer.consume(500, 0.02):
                    if msg.error() is None:
                        self._received(msg)
                self._ack_due()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            self.producer.flush(10)
            self.consumer.close()

    def _received(self, msg: Any) -> None:
        t = Tracking.from_headers(msg.headers())
        if t is None:
            return
        now = time.time()
        if t.attempt > 1:
            self.replays[t.origin] += 1
            self.replayed_at.setdefault(t.origin, now)
        elif msg.value() in self.dropped:
            return  # lost by the task: never acked
        hold = hold_ms(now - self.started) / 1000
        self.due.append((now + hold, t.srid, t.record_id))

    def _ack_due(self) -> None:
        """Send the events of every record whose hold is over (holds only grow or shrink
        slowly, so receive order is close to due order; a later one waits for its turn)."""
        now = time.time()
        n = 0
        while n < len(self.due) and self.due[n][0] <= now:
            n += 1
        if not n:
            return
        done, self.due = self.due[:n], self.due[n:]
        srids = np.array([s for _, s, _ in done], np.int64)
        xors = np.array([x for _, _, x in done], np.int64)
        lps = srids % self.partitions
        for lp in np.unique(lps).tolist():
            mine = lps == lp
            batch = XorBatch(lp, srids[mine], xors[mine], np.empty(0, np.int64), "bench-adaptive")
            self.producer.produce(self.ns.acks, value=batch.encode(), partition=lp)
        self.producer.poll(0)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise BenchError(f"holding task failed: {self.error!r}")


def _run(env: Env, timeout: Timeout, records: int, progress: Callable[[float], None]) -> dict[str, Any]:
    ns = topics.Namespace(env.unique("adaptive"))
    topic = f"{ns.name}.orders"
    topics.create(env.settings, ns, env.partitions, {topic: env.partitions})
    env.created_topics += [*ns.ledger_topics, ns.dlq, topic, topics.replay_topic(topic)]
    config = AckerConfig(
        commit_interval_ms=env.commit_interval_ms, stats_interval_ms=3_600_000,
        adaptive_floor_ms=FLOOR_MS, adaptive_ceiling_ms=FIXED_MS, adaptive_safety_factor=SAFETY,
        adaptive_min_samples=MIN_SAMPLES, adaptive_window_ms=WINDOW_MS,
    )
    acker = Acker(env.settings, ns, config)
    acker_thread = threading.Thread(target=acker.run, daemon=True)
    acker_thread.start()
    drop_at = {int(t * RATE) for t in DROPS}
    dropped_values = {f"r{i}".encode() for i in drop_at}
    source = Source(env.settings, ns, SourceConfig(timeout_ms=timeout, max_attempts=3))
    joined = time.monotonic() + 30
    while len(acker.states) < env.partitions:  # the acker joins its group and owns its partitions
        if time.monotonic() > joined:
            raise BenchError("the acker did not get its partitions in 30 s")
        time.sleep(0.1)
    started = time.time()
    task = HoldingTask(env, ns, topic, started, dropped_values)
    sent_at: dict[int, float] = {}
    dropped: set[int] = set()
    # (s since start, hold ms, timeout given now ms, samples, p99.9 ms)
    timeline: list[tuple[float, float, int, int, float | None]] = []
    try:
        for i in range(records):
            if i % 100 == 0 and timeout == "auto":
                now = time.time()
                e = acker.adaptive.estimates(int(now * 1000)).get(topic)
                if e is not None:
                    timeline.append((round(now - started, 2), round(hold_ms(now - started)), e.timeout_ms,
                                     e.samples, None if e.quantile_ms is None else round(e.quantile_ms)))
            time.sleep(max(0.0, started + i / RATE - time.time()))
            origin = source.send(topic, f"k{i}", f"r{i}").origin
            sent_at[origin] = time.time()
            if i in drop_at:
                dropped.add(origin)
            source.poll()
            if i % 200 == 0:
                progress(0.8 * i / records)
        source.flush()
        # Every dropped record's replay, and long enough for any slow record to time out.
        end = time.time() + FIXED_MS / 1000 + 2.0
        limit = end + 30.0
        while time.time() < end or not dropped <= task.replayed_at.keys():
            if time.time() > limit:
                raise BenchError(f"{len(dropped - task.replayed_at.keys())} dropped records never replayed "
                                 f"(timeout {timeout})")
            time.sleep(0.2)
            progress(0.8 + 0.2 * min(1.0, 1.0 - (end - time.time()) / (FIXED_MS / 1000 + 2.0)))
        estimate = acker.adaptive.summary(int(time.time() * 1000))
    finally:
        task.stop()
        source.close()
        acker.stop()
        acker_thread.join(30)
    detect_ms = np.array([(task.replayed_at[o] - sent_at[o]) * 1000 for o in sorted(dropped, key=lambda o: sent_at[o])])
    spurious = sum(n for o, n in task.replays.items() if o not in dropped)
    return {
        "timeout": timeout, "records": records, "drops": len(dropped), "detect_ms": detect_ms,
        "spurious": spurious, "adaptive_deadlines": acker.counters().get("adaptive", 0), "estimate": estimate,
        "timeline": timeline,
    }


def measure_adaptive(env: Env, figures: Figures, *, records: int,
                     progress: Callable[[float, str], None] | None = None) -> dict[str, Any]:
    """Both runs, side by side (the same load on the machine for both); the figures of the
    module doc."""
    if records < DROPS[-1] * RATE + 1:
        raise BenchError(f"{records} records end before the last dropped one ({DROPS[-1]} s at {RATE:g}/s)")
    runs: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    modes: tuple[tuple[str, Timeout], ...] = (("fixed", FIXED_MS), ("adaptive", "auto"))

    def run(name: str, timeout: Timeout) -> None:
        def step(f: float) -> None:
            if progress and name == "adaptive":
                progress(f, "fixed and adaptive timeouts, side by side")
        try:
            runs[name] = _run(env, timeout, records, step)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=mode, daemon=True) for mode in modes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    figures.set("replay.adaptive_fixed_timeout_ms", float(FIXED_MS))
    for name, result in runs.items():
        d = result["detect_ms"]
        figures.set(f"replay.{name}_detect_p50_ms", float(np.percentile(d, 50)), samples=int(d.size))
        figures.set(f"replay.{name}_detect_max_ms", float(d.max()), samples=int(d.size))
        figures.set(f"replay.{name}_spurious_per_1e5", result["spurious"] * 1e5 / result["records"],
                    replays=result["spurious"], records=result["records"])
    figures.ratio("replay.adaptive_detect_speedup", "replay.fixed_detect_p50_ms", "replay.adaptive_detect_p50_ms")
    return {name: {**result, "detect_ms": [round(float(x)) for x in result["detect_ms"]]}
            for name, result in runs.items()}
