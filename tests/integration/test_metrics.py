"""Prometheus metrics of an acker and a task on a real Kafka, scraped over HTTP and parsed
with prometheus_client's own text parser. Every figure is checked against the topics, not
against the code that counts: completions and replays are the persist tombstones' outcomes,
folded events the (srid, xor) pairs in ``ns.acks``, the task's inputs and outputs the
messages of its topics."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.headers import outcome_of
from broker.kafka_io import read_to_end
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskConfig, TaskContext, TaskRecord
from tests.integration.ground_truth import Services

pytestmark = pytest.mark.integration

P = 2
RECORDS = 400
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, query: str = "") -> Samples:
    """``query`` ``?partitions=all``: every series per partition instead of the totals."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics{query}", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def per_partition(samples: Samples, name: str) -> dict[int, float]:
    return {int(dict(ls)["partition"]): v for (n, ls), v in samples.items() if n == name}


def test_metrics_of_an_acker_and_a_task_match_the_topics(bootstrap: str) -> None:
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("metrics"))
    topic, out = f"{ns.name}.orders", f"{ns.name}.results"
    topics.create(settings, ns, P, {topic: 2, out: 1})

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        assert record.tracking is not None
        if record.tracking.attempt == 1 and record.tracking.origin % 10 == 0:
            ctx.fail("every tenth first attempt")  # replayed, then acked
            return
        ctx.output(out, record.key, record.value)

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000, metrics_port=0))
    task = Task(settings, ns, [topic, topics.replay_topic(topic)], unique_name("task"), handler,
                TaskConfig(poll_timeout_ms=50, metrics_port=0))
    services = Services(settings, ns, acker, task)
    source = Source(settings, ns, SourceConfig(timeout_ms=60_000))
    try:
        origins = {source.send(topic, f"k{i}", f"v{i}").origin for i in range(RECORDS)}
        source.flush()
        log = services.tail.log
        services.wait(lambda: origins <= set(log.completed_origins()), "every record completed", limit_s=120)
        assert acker.metrics_server is not None and task.metrics_server is not None
        acker_port, task_port = acker.metrics_server.port, task.metrics_server.port
        # The acker publishes at each commit: wait for one after the last completion, and for
        # an input lag of every input partition (sampled once a second: absent while unknown).
        deadline = time.monotonic() + 30
        while True:
            a, full = scrape(acker_port), scrape(acker_port, "?partitions=all")
            lags = {(dict(ls)["topic"], dict(ls)["partition"]) for (n, ls), _ in full.items()
                    if n == "replaybroker_acker_input_lag_messages"}
            if (total(full, "replaybroker_acker_decisions_total", decision="completed") >= RECORDS
                    and len(lags) == 2 * P):
                break
            assert time.monotonic() < deadline, f"the acker's metrics never showed every completion and lag: {lags}"
            time.sleep(0.2)
        a = scrape(acker_port)
        t = scrape(task_port)
    finally:
        services.stop()
        source.close()

    # Ground truth, from the topics.
    outcomes = Counter(
        outcome_of(m.headers()).decode()
        for m in read_to_end(settings, ns.persist, P) if m.value() is None
    )
    pairs = sum(XorBatch.decode(m.value()).srids.size for m in read_to_end(settings, ns.acks, P))
    inputs = len(read_to_end(settings, topic, 2)) + len(read_to_end(settings, topics.replay_topic(topic), 2))
    replays = len(read_to_end(settings, topics.replay_topic(topic), 2))
    results = len(read_to_end(settings, out, 1))

    assert outcomes["completed"] == RECORDS and outcomes["replay"] == replays > 0
    for view in (a, full):  # the acker's totals; every partition's series
        assert total(view, "replaybroker_acker_decisions_total", decision="completed") == outcomes["completed"]
        assert total(view, "replaybroker_acker_decisions_total", decision="replayed") == outcomes["replay"]
        assert total(view, "replaybroker_acker_decisions_total", decision="failed") == outcomes["replay"]
        assert total(view, "replaybroker_acker_decisions_total", decision="dlq") == outcomes["dlq"] == 0
        assert total(view, "replaybroker_acker_folded_events_total") == pairs
        assert total(view, "replaybroker_acker_registered_total") == RECORDS + replays
        assert total(view, "replaybroker_acker_owned_partitions") == P
        assert total(view, "replaybroker_acker_commit_duration_seconds_count") >= 1
    assert per_partition(full, "replaybroker_acker_pending_entries") == dict.fromkeys(range(P), 0)
    assert per_partition(full, "replaybroker_acker_oldest_pending_age_seconds") == dict.fromkeys(range(P), 0)
    assert total(a, "replaybroker_acker_pending_entries") == total(a, "replaybroker_acker_oldest_pending_age_seconds") == 0
    assert lags == {(name, str(p)) for name in (ns.persist, ns.acks) for p in range(P)}
    assert {dict(ls)["topic"] for (n, ls) in a if n == "replaybroker_acker_input_lag_messages"} == {ns.persist, ns.acks}

    assert total(t, "replaybroker_task_inputs_total") == inputs == RECORDS + replays
    assert total(t, "replaybroker_task_fails_total") == replays
    assert total(t, "replaybroker_task_outputs_total", kind="sink") == results == RECORDS
    assert total(t, "replaybroker_task_outputs_total", kind="child") == 0


def test_the_acker_reports_pending_entries_and_their_age_until_they_complete(bootstrap: str) -> None:
    """Records nobody acks stay pending: the gauge counts exactly the live persist records
    and their age grows; no metrics server runs without a port."""
    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("metrics-pending"))
    topic = f"{ns.name}.orders"
    topics.create(settings, ns, P, {topic: 1})
    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("acker"), stats_interval_ms=3_600_000, metrics_port=0))
    quiet = Task(settings, ns, [topic], unique_name("task"), lambda r, c: None, TaskConfig())
    assert quiet.metrics_server is None
    services = Services(settings, ns, acker)
    source = Source(settings, ns, SourceConfig(timeout_ms=300_000))
    try:
        for i in range(50):
            source.send(topic, f"k{i}", "v")
        source.flush()
        sent_ms = time.time() * 1000
        deadline = time.monotonic() + 60
        while True:
            port = acker.metrics_server.port if acker.metrics_server is not None else None
            a = scrape(port) if port is not None else {}
            if total(a, "replaybroker_acker_pending_entries") == 50:
                break
            assert time.monotonic() < deadline, f"pending never reached 50: {a}"
            time.sleep(0.2)
        time.sleep(1.5)
        a = scrape(port, "?partitions=all")
        totals = scrape(port)
    finally:
        services.stop()
        source.close()
        quiet.close()
    live: Counter[int] = Counter()
    keys: dict[bytes, int] = {}
    for m in read_to_end(settings, ns.persist, P):
        if m.value() is None:
            keys.pop(m.key() or b"", None)
        else:
            keys[m.key() or b""] = m.partition()
    live.update(keys.values())
    assert per_partition(a, "replaybroker_acker_pending_entries") == {p: live[p] for p in range(P)}
    assert total(totals, "replaybroker_acker_pending_entries") == sum(live.values()) == 50
    assert per_partition(totals, "replaybroker_acker_worst_pending_entries") == {p: live[p] for p in range(P) if live[p]}
    ages = per_partition(a, "replaybroker_acker_oldest_pending_age_seconds")
    # registered at or before they were sent; scraped 1.5 s later or more
    assert all(1.5 <= age <= (time.time() * 1000 - sent_ms) / 1000 + 5 for p, age in ages.items() if live[p])


def test_the_acker_command_serves_metrics_on_its_port(bootstrap: str) -> None:
    """``replaybroker acker --metrics-port N``: the endpoint answers while it runs."""
    import subprocess
    import sys

    from broker.dev.kafka_local import free_port
    from broker.dev.testing import stop_processes

    settings = KafkaSettings.from_env(bootstrap)
    ns = topics.Namespace(unique_name("metrics-cli"))
    topics.create(settings, ns, P, {})
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "acker", "--bootstrap", bootstrap, "--namespace", ns.name,
         "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                a = scrape(port)
                if total(a, "replaybroker_acker_owned_partitions") == P:
                    break
            except OSError:
                pass
            assert proc.poll() is None, "the acker exited"
            assert time.monotonic() < deadline, "no metrics on the port"
            time.sleep(0.3)
        assert per_partition(scrape(port, "?partitions=all"), "replaybroker_acker_pending_entries") == dict.fromkeys(range(P), 0)
    finally:
        stop_processes([proc])
