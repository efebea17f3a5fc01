"""A replay topic that is missing must not block the acker: the record goes to the DLQ with
the reason, every other record keeps completing. And a Source refuses a data topic whose
replay topic is missing in the first place."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka.admin import AdminClient

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.completions import OutcomeTail
from broker.dev.testing import create_topics, unique_name
from broker.errors import ConfigurationError
from broker.headers import H_REASON
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig
from broker.task import Task, TaskContext, TaskRecord

pytestmark = pytest.mark.integration


def test_source_refuses_a_data_topic_without_its_replay_topic(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("norep"))
    topics.create(settings, ns, 2)
    bare = unique_name("bare")
    create_topics(bootstrap, {bare: 3})
    source = Source(settings, ns)
    with pytest.raises(ConfigurationError, match=r"\.replay must exist with the 3 partitions"):
        source.send(bare, "k", b"v")


def test_failed_record_without_replay_topic_goes_to_the_dlq(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("norep"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, 2, {data: 3})
    source = Source(settings, ns, SourceConfig(timeout_ms=300_000))
    poison = source.send(data, "poison", b"bad").origin
    good = {source.send(data, f"k{i}", b"ok").origin for i in range(200)}
    source.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topics.replay_topic(data)], operation_timeout=30)[topics.replay_topic(data)].result(30)

    def handler(record: TaskRecord, ctx: TaskContext) -> None:
        if record.value == b"bad":
            ctx.fail("rejected")

    acker = Acker(settings, ns, AckerConfig(instance_id=unique_name("a")))
    task = Task(settings, ns, [data], unique_name("t"), handler)
    tail = OutcomeTail(settings, ns)
    stop = threading.Event()
    threads = [threading.Thread(target=acker.run, kwargs={"until": lambda _a: stop.is_set()}, daemon=True),
               threading.Thread(target=task.run, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (good <= set(tail.log.completed_origins()) and poison in tail.log.dlq_origins()):
            assert time.monotonic() < deadline, "records did not complete / reach the DLQ"
            tail.poll(0.2)
    finally:
        stop.set()
        task.stop()
        for thread in threads:
            thread.join(30)
        tail.close()
    [dead] = read_to_end(settings, ns.dlq, 1)
    reason = dict(dead.headers())[H_REASON].decode()
    assert reason.startswith("failed; cannot replay:") and "does not exist" in reason
    assert dead.key() == b"poison" and dead.value() == b"bad"
    assert acker.totals["dlq"] == 1 and acker.totals["completed"] == 200
