"""A secured cluster (SASL/SCRAM, StandardAuthorizer, no ACL = denied) and the least ACLs of
each role: a task's principal cannot write ns.persist, a client without credentials gets
nothing, and the demo completes with the source, the tasks and the acker each under their own
principal and nothing but their role's ACLs."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker import acls, topics
from broker.bridge import Bridge, BridgeConfig
from broker.dev.demo import run_demo
from broker.dev.kafka_sasl import ADMIN, MECHANISM, SaslKafka
from broker.dev.testing import unique_name
from broker.kafka_io import read_to_end
from broker.settings import KafkaSettings, Secret

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def collect_clients() -> Iterator[None]:
    """Clients caught in reference cycles (by a raised KafkaException's traceback) are freed
    here, on the main thread: freed on a librdkafka thread they would abort the process."""
    yield
    gc.collect()

ROLES = ("source", "task", "acker")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslKafka]:
    kafka = SaslKafka(tmp_path_factory.mktemp("kafka-sasl"), users=dict.fromkeys((*ROLES, "bridge", "console")))
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def settings_of(kafka: SaslKafka, user: str) -> KafkaSettings:
    return KafkaSettings(
        kafka.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=MECHANISM,
        sasl_username=user, sasl_password=Secret(kafka.passwords[user]),
    )


def test_task_principal_cannot_write_persist(secured: SaslKafka) -> None:
    ns = topics.Namespace(unique_name("sec"))
    admin = settings_of(secured, ADMIN)
    topics.create(admin, ns, 1, {f"{ns.name}.in": 1})
    rules = acls.role_acls(ns, "task", inputs=[f"{ns.name}.in"], group=f"{ns.name}.g")
    acls.apply(admin, "User:task", rules)

    outcomes: dict[str, KafkaError | None] = {}
    producer = Producer(settings_of(secured, "task").producer_config(defaults={"linger.ms": 0}))
    for topic in (ns.acks, ns.persist):
        producer.produce(topic, b"x", partition=0, on_delivery=lambda err, msg: outcomes.__setitem__(msg.topic(), err))
    producer.flush(60)

    assert outcomes[ns.acks] is None  # allowed: the role writes acks
    refused = outcomes[ns.persist]
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.parametrize("who", ["no credentials", "wrong password"])
def test_unauthenticated_client_is_refused(secured: SaslKafka, who: str) -> None:
    if who == "no credentials":
        conf = {"bootstrap.servers": secured.bootstrap}
    else:
        conf = {**settings_of(secured, "task").client_config(), "sasl.password": "not-the-password"}
    errors: list[KafkaError] = []
    client = AdminClient({**conf, "error_cb": errors.append, "log_level": 0})
    with pytest.raises(KafkaException):
        client.list_topics(timeout=10)
    if who == "wrong password":
        client.poll(0)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_demo_with_one_principal_per_role(
    secured: SaslKafka, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing but the roles' rules, and no client of any role is refused anything on the way
    (the tasks' marker readers included)."""
    caplog.set_level(logging.WARNING)
    monkeypatch.chdir(Path(__file__).parents[2])  # the acker subprocess runs this checkout
    for name, value in (
        ("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT"), ("KAFKA_SASL_MECHANISM", MECHANISM),
        ("KAFKA_SASL_USERNAME", ADMIN), ("KAFKA_SASL_PASSWORD", secured.passwords[ADMIN]),
    ):
        monkeypatch.setenv(name, value)
    ns = topics.Namespace(unique_name("demo"))
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    admin = settings_of(secured, ADMIN)
    acls.apply(admin, "User:source", acls.role_acls(ns, "source", data_topics=[orders]))
    acls.apply(admin, "User:acker", acls.role_acls(ns, "acker", data_topics=[orders, enriched]))
    acls.apply(admin, "User:task", acls.role_acls(ns, "task", inputs=[orders], outputs=[enriched],
                                                    group=f"{ns.name}.fan-out"))
    acls.apply(admin, "User:task", acls.role_acls(ns, "task", inputs=[enriched], group=f"{ns.name}.leaf"))

    summary = run_demo(
        secured.bootstrap, 200, partitions=2, timeout_ms=10_000, deadline_ms=60_000, keep=False,
        namespace=ns.name, roles={role: settings_of(secured, role) for role in ROLES},
    )

    log = Path(summary["acker_log"]).read_text(errors="replace")
    assert summary["lost"] == 0, log[-3000:]
    assert summary["completed"] == 200, summary
    assert summary["dlq"] == 0
    assert "AUTHORIZATION" not in log.upper(), log[-3000:]
    refused = [r.getMessage() for r in caplog.records if "AUTHORIZATION" in r.getMessage().upper()]
    assert refused == []


def test_bridge_principal_bridges_with_its_role_only(secured: SaslKafka) -> None:
    """The bridge's least ACLs are enough: under its own principal it reads its input with its
    group, persists, forwards and commits the input offsets in its transactions."""
    ns = topics.Namespace(unique_name("secbr"))
    admin = settings_of(secured, ADMIN)
    clicks = f"{ns.name}.clicks"
    topics.create(admin, ns, 1, {f"{clicks}.guaranteed": 1})
    client = AdminClient(admin.client_config())  # kept: a freed handle fails its futures
    client.create_topics([NewTopic(clicks, 1, 1)])[clicks].result(30)
    acls.apply(admin, "User:bridge", acls.role_acls(ns, "bridge", inputs=[clicks]))
    producer = Producer(admin.producer_config(defaults={"linger.ms": 0}))
    for i in range(20):
        producer.produce(clicks, key=b"k%d" % (i % 3), value=b"click %d" % i)
    assert producer.flush(30) == 0

    bridge = Bridge(settings_of(secured, "bridge"), ns, BridgeConfig(clicks, instance_id="b1"))
    thread = threading.Thread(target=bridge.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while bridge.counters.bridged < 20 and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.1)
    bridge.stop()
    thread.join(30)
    assert bridge.counters.bridged == 20, bridge.counters
    # The transaction's markers are written after its commit returned: until then a
    # read_committed reader's end (the last stable offset) is still before the batch.
    forwarded = read_to_end(admin, f"{clicks}.guaranteed", 1)
    while len(forwarded) < 20 and time.monotonic() < deadline + 30:
        time.sleep(0.2)
        forwarded = read_to_end(admin, f"{clicks}.guaranteed", 1)
    assert sorted(m.value() for m in forwarded) == sorted(b"click %d" % i for i in range(20))


def test_console_principal_reads_with_its_role_and_redrives_only_when_enabled(secured: SaslKafka, tmp_path: Path) -> None:
    """The console's least ACLs: under its own principal it indexes the DLQ, samples the
    status, traces and writes its audit log; a redrive fails on the broker's refusal until the
    role's --redrive ACLs are added, and then sends the record to its replay topic."""
    from broker.acker.replay import dlq_record
    from broker.console.auth import Authenticator
    from broker.console.index import Filter
    from broker.console.server import build
    from broker.ids import new_id
    from broker.schemas import Failure, PersistedRecord

    ns = topics.Namespace(unique_name("seccon"))
    admin = settings_of(secured, ADMIN)
    orders = f"{ns.name}.orders"
    topics.create(admin, ns, 1, {orders: 1})
    acls.apply(admin, "User:console", acls.role_acls(ns, "console", data_topics=[orders]))
    origin = new_id()
    record = PersistedRecord(srid=origin, origin=origin, attempt=1, root_xor=5, record_id=5, topic=orders,
                             key_hash_partition=0, partitioner="kafka", key=b"cust-1", value=b"{}", created_ms=1,
                             headers=(), max_attempts=1)
    out = dlq_record(ns, record, [Failure(origin, 1, "rejected: bad", 1_000)], "rejected: bad")
    producer = Producer(admin.producer_config(defaults={"linger.ms": 0}))
    producer.produce(out.topic, key=out.key, value=out.value, headers=list(out.headers), partition=0)
    assert producer.flush(30) == 0

    server = build(settings_of(secured, "console"), ns.name, Authenticator({}), index_path=tmp_path / "i.sqlite",
                   port=0, sample_every_s=1)
    server.start()
    console = server.console
    try:
        deadline = time.monotonic() + 60
        while console.index.count() < 1 or console.sampler.latest() is None:
            assert console.tailer.error is None and time.monotonic() < deadline, console.tailer.error
            time.sleep(0.2)
        assert console.sampler.error is None
        assert console.sampler.latest()["ackers"] == []  # no acker: described, none running
        from broker import trace

        assert trace.trace(settings_of(secured, "console"), ns.name, origin)["found"]
        plan = console.redrives.plan(Filter(), "local")
        assert plan.count == 1
        run = console.redrives.start(plan, None, "local")
        console.redrives.wait(run.id, 60)
        assert run.state == "failed" and "AUTHORIZATION" in (run.error or "").upper()
        acls.apply(admin, "User:console", acls.role_acls(ns, "console", data_topics=[orders], redrive=True))
        console.redrives.resume(run.id, "local")
        console.redrives.wait(run.id, 60)
        assert (run.state, run.done, run.error) == ("completed", 1, None)
        replayed = read_to_end(admin, topics.replay_topic(orders), 1)
        assert [m.key() for m in replayed] == [b"cust-1"]
        _, offset, _ = console.audit.record("local", "test", {}, "ok")
        deadline = time.monotonic() + 30  # read back by the tailer, with the console's ACLs
        while not any(e["action"] == "test" for e in console.index.audit()[0]):
            assert time.monotonic() < deadline and console.tailer.error is None, console.tailer.error
            time.sleep(0.2)
        assert offset >= 0
    finally:
        server.stop()
