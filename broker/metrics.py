"""Prometheus metrics of the services (``--metrics-port``; docs/design.md §10).

Every series is named ``replaybroker_*``. Each service object has its own
``CollectorRegistry`` - never the global one: tests run many ackers and tasks in one process,
and two registrations of one name in a registry are refused.

Nothing here is updated per event. The acker folds millions of events a second in batches
and already counts each decision once per batch (``PartitionState.count``); at every commit
it hands a frozen ``AckerSnapshot`` of those counters, its pending figures and its input lag
to ``AckerMetrics`` (one reference swap), and a scrape reads the latest snapshot from the
HTTP server's thread. The commit duration is one histogram observation per commit. A task's
figures are its ``TaskCounters``, read at scrape time.

An acker's series are its totals, plus the ``WORST`` partitions of each ranking (pending
entries, oldest pending age, input lag): one scrape is about a hundred lines whatever the
number of partitions it owns. The totals of counters are this instance's committed decisions
(``Acker.totals`` as of its last commit), so they only grow, and ``sum by (decision)`` of their
``rate()`` over instances holds when partitions move. ``/metrics?partitions=all`` adds nothing
but serves every series per ledger partition and per input partition instead; there the
counters are the cumulative, exactly-once ones of the changelog (what ``replaybroker status``
sums): when a partition moves, its new owner's series go on from the same count.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

#: The acker counters exported as ``replaybroker_acker_decisions_total{decision=...}``: what
#: became of entries and input. The names are the counters' own (broker.acker.state).
DECISIONS = (
    "completed", "timed_out", "failed", "replayed", "dlq", "quarantined", "orphans", "payload_lost", "refused",
    "superseded", "superseded_settled", "completed_late", "rejections", "replays_waited", "replays_backed_off",
    "retry_afters",
)

#: Upper bounds of the attempts histogram (the attempt a record ends at): most records end at
#: their first, a policy's max_attempts is small, and none has more than MAX_ATTEMPTS (1 000).
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 20, 50, 100, 1000)
#: The outcomes it is kept for: completed (the tree of that attempt), dead-lettered.
ENDED = ("completed", "dlq")

#: Commit durations span an idle commit (~1 ms) to one that reads thousands of payloads.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: How many partitions of each ranking the default view exports by name.
WORST = 10


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """The HTTP endpoint of a registry, stoppable: a service that closes frees its port.
    ``/metrics?partitions=all`` serves ``full`` instead, where one is given."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "0.0.0.0",
                 full: CollectorRegistry | None = None) -> None:
        default = make_wsgi_app(registry)
        every = make_wsgi_app(full) if full is not None else default

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            wanted = parse_qs(environ.get("QUERY_STRING", "")).get("partitions")
            return (every if wanted == ["all"] else default)(environ, start_response)

        self._server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.port = int(self._server.server_port)  # the bound one: port 0 picks a free port
        log.info("metrics on http://%s:%d/metrics", addr, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class PartitionFigures:
    """One owned ledger partition as of a commit."""

    counters: Mapping[str, int]
    pending: int | None  # None: not computed since the state was restored
    oldest_pending_ms: int | None  # None: nothing pending, or its time is unknown
    replays_waiting: int = 0  # replays due but held back: the replay rate, their key's earlier ones
    replays_backing_off: int = 0  # replays waiting for their back-off (or their task's retry-after)
    tasks_in_outage: int = 0  # tasks whose outage beats stop the partition's clock now (broker.ledger.outages)


@dataclass(frozen=True)
class TopicEstimate:
    """One source topic's adaptive timeout (docs/design.md §6) as of a commit."""

    timeout_ms: int  # what a record registered now gets
    quantile_ms: float | None  # None: too few latencies in the window, the initial timeout applies
    samples: int


@dataclass(frozen=True)
class AckerSnapshot:
    """What an acker exports, as of its last commit."""

    partitions: Mapping[int, PartitionFigures] = field(default_factory=dict)
    lag: Mapping[tuple[str, int], int | None] = field(default_factory=dict)  # (topic, partition)
    adaptive: Mapping[str, TopicEstimate] = field(default_factory=dict)  # source topic ->
    # This instance's committed decisions over every partition it owned (``Acker.totals``):
    # they only grow, whichever partitions come and go.
    totals: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Gauges:
    """The gauges of one partition, or the acker's over its partitions."""

    pending: int | None
    oldest_age_s: float | None
    replays_waiting: int
    replays_backing_off: int
    tasks_in_outage: int


def _age_s(fig: PartitionFigures, now_ms: int) -> float | None:
    if fig.pending is None:
        return None
    if fig.pending == 0:
        return 0.0
    return None if fig.oldest_pending_ms is None else max(0.0, (now_ms - fig.oldest_pending_ms) / 1000)


def _partition_gauges(fig: PartitionFigures, now_ms: int) -> _Gauges:
    return _Gauges(fig.pending, _age_s(fig, now_ms), fig.replays_waiting, fig.replays_backing_off, fig.tasks_in_outage)


def _acker_gauges(snap: AckerSnapshot, now_ms: int) -> _Gauges:
    """Sums, except the oldest age and the tasks in an outage: the largest of any partition."""
    figs = snap.partitions.values()
    known = [f.pending for f in figs if f.pending is not None]
    ages = [a for f in figs if (a := _age_s(f, now_ms)) is not None]
    return _Gauges(
        sum(known) if known else None, max(ages) if ages else None,
        sum(f.replays_waiting for f in figs), sum(f.replays_backing_off for f in figs),
        max((f.tasks_in_outage for f in figs), default=0),
    )


def _counter_families(rows: Iterable[tuple[list[str], Mapping[str, int]]], labels: list[str]) -> Iterable[Metric]:
    """The counters' series, a sample per row (label values, counters)."""
    decisions = CounterMetricFamily(
        "replaybroker_acker_decisions", "Decisions of the acker's ledger partitions", labels=["decision", *labels],
    )
    folded = CounterMetricFamily(
        "replaybroker_acker_folded_events", "(srid, xor) events folded into the ledger", labels=labels
    )
    registered = CounterMetricFamily(
        "replaybroker_acker_registered", "Persist records registered in the ledger", labels=labels
    )
    adaptive = CounterMetricFamily(
        "replaybroker_acker_adaptive_deadlines",
        "Deadlines given from the latency estimate (timeout auto)", labels=labels,
    )
    stopped = CounterMetricFamily(
        "replaybroker_acker_outage_stopped_seconds",
        "How long the ledger's timeout clock stood still for tasks in an outage (TaskConfig.outage)", labels=labels,
    )
    held = CounterMetricFamily(
        "replaybroker_acker_outage_held_deadlines",
        "Deadlines held back by outage beats (each beat that moved one counts it)", labels=labels,
    )
    attempts = HistogramMetricFamily(
        "replaybroker_acker_attempts",
        "The attempt at which records ended: completed (its tree) or dead-lettered", labels=["outcome", *labels],
    )
    failures = CounterMetricFamily(
        "replaybroker_acker_failures",
        "Attempts that failed, by class: transient (a fail mark), timeout, rejected (ctx.reject, a fatal exception)",
        labels=["class", *labels],
    )
    for values, c in rows:
        for name in DECISIONS:
            decisions.add_metric([name, *values], c.get(name, 0))
        folded.add_metric(values, c.get("folded", 0))
        registered.add_metric(values, c.get("registered", 0))
        adaptive.add_metric(values, c.get("adaptive", 0))
        stopped.add_metric(values, c.get("outage_stopped_ms", 0) / 1000)
        held.add_metric(values, c.get("outage_held", 0))
        # The attempt records ended at (PartitionState.count_ended), cumulative per bucket.
        for outcome in ENDED:
            seen, buckets = 0, []
            for bound in (*ATTEMPT_BUCKETS, None):
                seen += c.get(f"ended_{outcome}_le_{bound or 'inf'}", 0)
                buckets.append(("+Inf" if bound is None else str(float(bound)), seen))
            attempts.add_metric([outcome, *values], buckets, c.get(f"ended_{outcome}_attempts", 0))
        rejected = c.get("failed_rejected", 0)
        failures.add_metric(["transient", *values], c.get("failed", 0) - rejected)
        failures.add_metric(["timeout", *values], c.get("timed_out", 0))
        failures.add_metric(["rejected", *values], rejected)
    return decisions, folded, registered, adaptive, stopped, held, attempts, failures


def _gauge_families(rows: Iterable[tuple[list[str], _Gauges]], labels: list[str]) -> Iterable[Metric]:
    pending = GaugeMetricFamily(
        "replaybroker_acker_pending_entries", "Registered entries of the ledger not decided yet", labels=labels,
    )
    age = GaugeMetricFamily(
        "replaybroker_acker_oldest_pending_age_seconds",
        "Age of the oldest pending entry's registration (0: none pending)", labels=labels,
    )
    waiting = GaugeMetricFamily(
        "replaybroker_acker_replays_waiting",
        "Replays due but waiting for their turn: under replay_rate_per_s, or behind their key's earlier ones",
        labels=labels,
    )
    backing_off = GaugeMetricFamily(
        "replaybroker_acker_replays_backing_off",
        "Replays waiting for their back-off (SourceConfig.retry, or the task's retry_after_ms)", labels=labels,
    )
    in_outage = GaugeMetricFamily(
        "replaybroker_acker_tasks_in_outage", "Tasks whose outage beats stop the ledger's clock now", labels=labels,
    )
    for values, g in rows:
        if g.pending is not None:  # None: not computed since the state was restored
            pending.add_metric(values, g.pending)
        if g.oldest_age_s is not None:
            age.add_metric(values, g.oldest_age_s)
        waiting.add_metric(values, g.replays_waiting)
        backing_off.add_metric(values, g.replays_backing_off)
        in_outage.add_metric(values, g.tasks_in_outage)
    return pending, age, waiting, backing_off, in_outage


class AckerMetrics(Collector):
    """The acker's series, from the latest ``AckerSnapshot`` and the commit histogram:
    ``registry`` its totals and worst partitions, ``partitions_registry`` every partition's."""

    def __init__(self, clock_ms: Callable[[], int] | None = None, worst: int = WORST) -> None:
        self.registry = CollectorRegistry()
        self.partitions_registry = CollectorRegistry()
        self.snapshot = AckerSnapshot()
        self.worst = worst
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.commit_seconds = Histogram(
            "replaybroker_acker_commit_duration_seconds",
            "Duration of the acker's commits that wrote a transaction (decisions, outputs, changelog, offsets)",
            buckets=COMMIT_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(self)
        self.partitions_registry.register(self.commit_seconds)
        self.partitions_registry.register(_PerPartition(self))

    def publish(self, snapshot: AckerSnapshot) -> None:
        self.snapshot = snapshot  # one reference: a scrape sees one commit's figures

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot
        now_ms = self._clock_ms()
        yield from _counter_families([([], snap.totals)], [])
        yield from _gauge_families([([], _acker_gauges(snap, now_ms))], [])
        lag = GaugeMetricFamily(
            "replaybroker_acker_input_lag_messages", "High watermark minus the acker's position, summed per input topic",
            labels=["topic"],
        )
        per_topic: dict[str, int] = {}
        for (topic, _), messages in snap.lag.items():
            if messages is not None:
                per_topic[topic] = per_topic.get(topic, 0) + messages
        for topic, messages in sorted(per_topic.items()):
            lag.add_metric([topic], messages)
        yield lag
        yield from self._worst(snap, now_ms)
        yield from _common(snap)

    def _worst(self, snap: AckerSnapshot, now_ms: int) -> Iterable[Metric]:
        """The ``worst`` partitions of each ranking, by name: where to look first."""
        k = self.worst
        pending = GaugeMetricFamily(
            "replaybroker_acker_worst_pending_entries",
            f"The {k} ledger partitions with the most pending entries", labels=["partition"],
        )
        for lp, fig in heapq.nlargest(k, ((lp, f) for lp, f in snap.partitions.items() if f.pending),
                                      key=lambda item: item[1].pending or 0):
            pending.add_metric([str(lp)], fig.pending or 0)
        age = GaugeMetricFamily(
            "replaybroker_acker_worst_oldest_pending_age_seconds",
            f"The {k} ledger partitions whose oldest pending entry is the oldest", labels=["partition"],
        )
        ages = ((lp, a) for lp, f in snap.partitions.items() if f.pending and (a := _age_s(f, now_ms)) is not None)
        for lp, seconds in heapq.nlargest(k, ages, key=lambda item: item[1]):
            age.add_metric([str(lp)], seconds)
        lag = GaugeMetricFamily(
            "replaybroker_acker_worst_input_lag_messages",
            f"The {k} input partitions furthest behind their high watermark", labels=["topic", "partition"],
        )
        lags = ((key, m) for key, m in snap.lag.items() if m)
        for (topic, partition), messages in heapq.nlargest(k, lags, key=lambda item: item[1]):
            lag.add_metric([topic, str(partition)], messages)
        return pending, age, lag


class _PerPartition(Collector):
    """Every series per ledger partition (and per input partition): ``?partitions=all``."""

    def __init__(self, metrics: AckerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        snap = self._metrics.snapshot
        now_ms = self._metrics._clock_ms()
        rows = sorted(snap.partitions.items())
        yield from _counter_families([([str(lp)], fig.counters) for lp, fig in rows], ["partition"])
        yield from _gauge_families([([str(lp)], _partition_gauges(fig, now_ms)) for lp, fig in rows], ["partition"])
        lag = GaugeMetricFamily(
            "replaybroker_acker_input_lag_messages", "High watermark minus the acker's position, per input partition",
            labels=["topic", "partition"],
        )
        for (topic, partition), messages in sorted(snap.lag.items()):
            if messages is not None:
                lag.add_metric([topic, str(partition)], messages)
        yield lag
        yield from _common(snap)


def _common(snap: AckerSnapshot) -> Iterable[Metric]:
    """The series of both views: partitions owned, the adaptive timeouts per source topic."""
    owned = GaugeMetricFamily("replaybroker_acker_owned_partitions", "Ledger partitions this acker owns")
    owned.add_metric([], len(snap.partitions))
    timeout = GaugeMetricFamily(
        "replaybroker_acker_adaptive_timeout_seconds",
        "Timeout a record of the topic registered now gets (timeout auto)", labels=["topic"],
    )
    quantile = GaugeMetricFamily(
        "replaybroker_acker_adaptive_latency_quantile_seconds",
        "The completion latency quantile the timeout is computed from (absent: too few samples)",
        labels=["topic"],
    )
    samples = GaugeMetricFamily(
        "replaybroker_acker_adaptive_latency_samples", "Completion latencies in the estimate's window",
        labels=["topic"],
    )
    for topic, est in sorted(snap.adaptive.items()):
        timeout.add_metric([topic], est.timeout_ms / 1000)
        samples.add_metric([topic], est.samples)
        if est.quantile_ms is not None:
            quantile.add_metric([topic], est.quantile_ms / 1000)
    return owned, timeout, quantile, samples


class TaskFigures(Protocol):
    """What a task counts (broker.task.TaskCounters): plain ints, only ever increased."""

    processed: int
    failed: int
    rejected: int
    outages: int
    outage_tries: int
    outage_beats: int
    undeliverable: int
    errors: int
    emitted: int
    sink_outputs: int
    skipped: int


class TaskMetrics(Collector):
    """A task's series, read from its counters at scrape time (plain ints: a read from the
    server's thread sees a whole value)."""

    def __init__(self, counters: Callable[[], TaskFigures], outage_s: Callable[[], float] = lambda: 0.0) -> None:
        self.registry = CollectorRegistry()
        self._counters = counters
        self._outage_s = outage_s
        self.registry.register(self)

    def collect(self) -> Iterable[Metric]:
        c = self._counters()
        for name, what, value in (
            ("inputs", "Input records handled", c.processed),
            ("fails", "Inputs failed (explicitly, or by an exception in the handler)", c.failed),
            ("rejects", "Inputs rejected: dead-lettered at once (explicitly, or by a fatal exception)", c.rejected),
            ("undeliverable", "Source records failed because an output could not be delivered",
             c.undeliverable),
            ("errors", "Exceptions raised by the handler", c.errors),
            ("skipped", "Superseded replays acked without running the handler", c.skipped),
            ("outages", "Outages of a dependency begun (TaskConfig.outage)", c.outages),
            ("outage_tries", "Inputs put back in an outage, tried again after a back-off", c.outage_tries),
        ):
            family = CounterMetricFamily(f"replaybroker_task_{name}", what)
            family.add_metric([], value)
            yield family
        outage = GaugeMetricFamily(
            "replaybroker_task_outage_seconds", "How long the current outage of a dependency has lasted (0: none)"
        )
        outage.add_metric([], self._outage_s())
        yield outage
        failures = CounterMetricFamily(
            "replaybroker_task_failures",
            "Inputs that failed, by class: transient (ctx.fail, an exception), rejected (ctx.reject, a fatal "
            "exception), outage (put back in a dependency's outage: no attempt spent)", labels=["class"],
        )
        failures.add_metric(["transient"], c.failed)
        failures.add_metric(["rejected"], c.rejected)
        failures.add_metric(["outage"], c.outage_tries)
        yield failures
        in_outage = GaugeMetricFamily(
            "replaybroker_task_in_outage", "1 while a dependency is down (TaskConfig.outage): the task sends outage beats"
        )
        in_outage.add_metric([], 1.0 if self._outage_s() > 0 else 0.0)
        yield in_outage
        beats = CounterMetricFamily(
            "replaybroker_task_outage_beats", "Outage beats sent: the timeout clock of what waits behind the task stops"
        )
        beats.add_metric([], c.outage_beats)
        yield beats
        outputs = CounterMetricFamily(
            "replaybroker_task_outputs", "Records written: children (anchored) and sink outputs", labels=["kind"]
        )
        outputs.add_metric(["child"], c.emitted)
        outputs.add_metric(["sink"], c.sink_outputs)
        yield outputs


def serve(registry: CollectorRegistry, port: int | None, full: CollectorRegistry | None = None) -> MetricsServer | None:
    """Serve ``registry`` on ``port`` (None: no server; 0: any free port), and ``full`` at
    ``?partitions=all``."""
    return None if port is None else MetricsServer(registry, port, full=full)
