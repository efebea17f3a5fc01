"""Source guarantees: a persist record that fails is a failed send; a transactional batch
commits persist and data records together or not at all; headers and partitions are right."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import Message

from broker import ids, topics
from broker.dev.testing import unique_name
from broker.errors import DeliveryError
from broker.headers import H_TRACKING, Tracking
from broker.kafka_io import read_to_end
from broker.partitioning import kafka_partition, spark_partition
from broker.schemas import PersistedRecord
from broker.settings import KafkaSettings
from broker.source import SendResult, Source, SourceConfig

pytestmark = pytest.mark.integration


def _namespace(settings: KafkaSettings, data_partitions: int = 5, **overrides: dict[str, str]) -> tuple[topics.Namespace, str]:
    ns = topics.Namespace(unique_name("src"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, 3, {data: data_partitions}, overrides={ns.persist: overrides.get("persist", {})})
    return ns, data


def test_send_persists_then_publishes_with_tracking_headers(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings)
    source = Source(settings, ns)
    results = [source.send(data, f"key-{i}", f"value-{i}", headers=[("trace", b"t")]) for i in range(200)]
    source.close()
    persisted = {PersistedRecord.decode(m.value()).srid: (m, PersistedRecord.decode(m.value()))
                 for m in read_to_end(settings, ns.persist, 3)}
    published = read_to_end(settings, data, 5)
    assert len(persisted) == len(published) == 200
    by_srid = {r.srid: r for r in results}
    for msg in published:
        headers = dict(msg.headers())
        assert set(headers) == {H_TRACKING, "trace"} and len(headers[H_TRACKING]) == 16  # a first send
        tracking = Tracking.from_headers(msg.headers())
        assert tracking is not None
        srid = tracking.srid
        result = by_srid[srid]
        assert tracking.record_id == result.record_id
        assert tracking.origin == srid == result.origin
        assert tracking.attempt == 1 and headers["trace"] == b"t"
        assert msg.partition() == result.key_hash_partition == kafka_partition(msg.key(), 5)
        persist_msg, record = persisted[srid]
        assert persist_msg.key() == ids.encode_id(srid)
        assert persist_msg.partition() == srid % 3  # ledger partition
        assert record.root_xor == record.record_id == result.record_id
        assert record.key_hash_partition == msg.partition() and record.value == msg.value()
        assert record.headers == (("trace", b"t"),)


def test_spark_partitioner_is_selectable_per_topic(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, data_partitions=7)
    source = Source(settings, ns, SourceConfig(partitioners={data: "spark"}))
    results = {f"k{i}": source.send(data, f"k{i}", b"v") for i in range(100)}
    # A batch of new keys, str and bytes, hashed together
    batch = [(f"b{i}" if i % 2 else b"b%d" % i, b"v") for i in range(100)]
    results.update(zip([k if type(k) is str else k.decode() for k, _ in batch], source.send_many(data, batch), strict=True))
    source.close()
    for key, result in results.items():
        assert result.key_hash_partition == spark_partition(key, 7)
    published = read_to_end(settings, data, 7)
    assert len(published) == 200
    for msg in published:
        assert msg.partition() == spark_partition(msg.key().decode(), 7)


def test_a_persist_record_that_fails_is_a_failed_send(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, persist={"max.message.bytes": "2000"})
    source = Source(settings, ns)
    source.send(data, "small", b"x")
    source.flush()
    source.send(data, "big", os.urandom(5000))  # incompressible: the persist topic refuses it
    with pytest.raises(DeliveryError, match="persist record not delivered"):
        source.flush()


def test_transactional_batches_commit_or_abort_together(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings)
    source = Source(settings, ns, transactional_id=unique_name("source"))
    with source.transaction():
        for i in range(50):
            source.send(data, f"c{i}", b"committed")
    with pytest.raises(RuntimeError, match="boom"), source.transaction():
        for i in range(50):
            source.send(data, f"a{i}", b"aborted")
        raise RuntimeError("boom")
    # Settled: right after the commit its markers may not be written yet (read_committed).
    persisted = read_to_end(settings, ns.persist, 3, settled=True)
    published = read_to_end(settings, data, 5, settled=True)
    assert len(persisted) == len(published) == 50
    assert {m.value() for m in published} == {b"committed"}


def _send_all(
    source: Source, data: str, items: list[tuple[str, bytes]]
) -> tuple[list[SendResult], list[DeliveryError]]:
    """Send every item the way a caller should: a ``DeliveryError`` from ``send`` (about
    earlier records; this one was not sent) or from ``flush`` lists the failed records."""
    results: list[SendResult] = []
    errors: list[DeliveryError] = []
    for key, value in items:
        while True:
            try:
                results.append(source.send(data, key, value))
                break
            except DeliveryError as exc:
                errors.append(exc)
    try:
        source.flush()
    except DeliveryError as exc:
        errors.append(exc)
    return results, errors


def _mixed(n_good: int, n_bad: int) -> list[tuple[str, bytes]]:
    """Small values and incompressible ones over the persist topic's max.message.bytes,
    interleaved; keys repeat so key order can be checked. (The broker refuses a whole
    produce batch that is too large, so small records may fail along with a big one.)"""
    items = [(f"k{i % 7}", b"good-%d" % i) for i in range(n_good)]
    for j in range(n_bad):
        items.insert(j * (len(items) // n_bad), (f"k{j % 7}", b"bad-" + os.urandom(5000)))
    return items


def test_every_failed_persist_record_is_reported_with_what_resends_it(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, persist={"max.message.bytes": "2000"})
    source = Source(settings, ns)
    items = _mixed(40, 6)
    results, errors = _send_all(source, data, items)
    failures = [f for exc in errors for f in exc.failures]
    sent = {r.srid: item for r, item in zip(results, items, strict=True)}
    big = {srid for srid, (_, value) in sent.items() if value.startswith(b"bad-")}
    assert len(big) == 6
    failed = [f.srid for f in failures]
    assert len(failed) == len(set(failed)) and big <= set(failed)
    for failure in failures:  # enough to send it again
        key, value = sent[failure.srid]
        assert (failure.topic, failure.key, failure.value) == (data, key.encode(), value)
        assert failure.error is not None
    source.flush()  # each failure is reported once: nothing left to raise
    source.close()


def test_no_data_record_is_published_for_a_failed_persist_record(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, persist={"max.message.bytes": "2000"})
    source = Source(settings, ns)
    items = _mixed(200, 10)
    results, errors = _send_all(source, data, items)
    source.close()
    big = {r.srid for r, (_, value) in zip(results, items, strict=True) if value.startswith(b"bad-")}
    published = read_to_end(settings, data, 5)  # read_committed, to the end
    srids = [tracking_of(m).srid for m in published]
    assert not big & set(srids), f"{len(big & set(srids))} data records published for failed persist records"
    failed = {f.srid for exc in errors for f in exc.failures}
    assert sorted(srids) == sorted({r.srid for r in results} - failed)
    # Data records are released in send order: per key, the topic keeps the order of send().
    order = {r.srid: i for i, r in enumerate(results)}
    by_key: dict[bytes, list[int]] = {}
    for msg, srid in zip(published, srids, strict=True):
        by_key.setdefault(msg.key(), []).append(order[srid])
    assert all(seq == sorted(seq) for seq in by_key.values())


def test_a_failed_transaction_reports_its_failed_persist_records_and_the_next_one_commits(
    bootstrap: str,
) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, persist={"max.message.bytes": "2000"})
    source = Source(settings, ns, transactional_id=unique_name("source"))
    big: list[int] = []
    with pytest.raises(DeliveryError, match="aborted") as excinfo, source.transaction():
        for i in range(20):
            result = source.send(data, f"a{i}", os.urandom(5000) if i % 5 == 0 else b"aborted")
            if i % 5 == 0:
                big.append(result.srid)
    assert set(big) <= {f.srid for f in excinfo.value.failures}
    with source.transaction():  # nothing stale is raised again
        for i in range(10):
            source.send(data, f"c{i}", b"committed")
    published = read_to_end(settings, data, 5)
    assert len(published) == 10 and {m.value() for m in published} == {b"committed"}


def tracking_of(msg: Message) -> Tracking:
    tracking = Tracking.from_headers(msg.headers())
    assert tracking is not None
    return tracking


def test_send_many_persists_then_publishes_each_record_like_send(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings)
    with Source(settings, ns) as source:
        # 113 keys: the first batch's are new and hashed together (Placements.learn), then repeat
        batch = [(f"key-{i % 113}", f"value-{i}", [("trace", b"%d" % i)] if i % 2 else None) for i in range(300)]
        results = source.send_many(data, batch[:100]) + source.send_many(data, batch[100:])
        assert source.sent == 300
    assert len({r.srid for r in results}) == 300 and all(r.origin == r.srid for r in results)
    persisted = {PersistedRecord.decode(m.value()).srid: PersistedRecord.decode(m.value())
                 for m in read_to_end(settings, ns.persist, 3)}
    published = read_to_end(settings, data, 5)
    assert len(persisted) == len(published) == 300
    index = {r.srid: i for i, r in enumerate(results)}
    by_key: dict[bytes, list[int]] = {}
    for msg in published:
        tracking = tracking_of(msg)
        i = index[tracking.srid]
        key, value, headers = batch[i]
        result, record = results[i], persisted[tracking.srid]
        assert (tracking.record_id, tracking.origin, tracking.attempt) == (result.record_id, result.srid, 1)
        assert (msg.key(), msg.value()) == (key.encode(), value.encode())
        assert [h for h in msg.headers() if h[0] != H_TRACKING] == (headers or [])
        assert msg.partition() == result.key_hash_partition == kafka_partition(msg.key(), 5)
        assert record.root_xor == record.record_id == result.record_id and record.value == msg.value()
        assert record.headers == tuple(headers or ())
        by_key.setdefault(msg.key(), []).append(i)
    assert all(seq == sorted(seq) for seq in by_key.values())  # send order, per key


def test_send_many_reports_failed_persist_records_and_publishes_none_of_their_data(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings, persist={"max.message.bytes": "2000"})
    source = Source(settings, ns)
    items = _mixed(200, 10)
    results: list[SendResult] = []
    errors: list[DeliveryError] = []
    for start in range(0, len(items), 50):
        try:
            results += source.send_many(data, items[start : start + 50])
        except DeliveryError as exc:  # about earlier batches: this one was not sent
            errors.append(exc)
            results += source.send_many(data, items[start : start + 50])
    try:
        source.flush()
    except DeliveryError as exc:
        errors.append(exc)
    source.close()
    big = {r.srid for r, (_, value) in zip(results, items, strict=True) if value.startswith(b"bad-")}
    failed = {f.srid for exc in errors for f in exc.failures}
    assert len(big) == 10 and big <= failed
    srids = [tracking_of(m).srid for m in read_to_end(settings, data, 5)]
    assert sorted(srids) == sorted({r.srid for r in results} - failed)


def test_send_many_stops_at_a_record_refused_at_once_and_says_what_was_sent(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings)
    source = Source(settings, ns, SourceConfig(producer={"message.max.bytes": 4000}))
    items = [("a", b"1"), ("b", b"2"), ("c", os.urandom(6000)), ("d", b"4")]
    with pytest.raises(DeliveryError, match="not produced") as excinfo:
        source.send_many(data, items)
    sent = excinfo.value.sent
    assert len(sent) == 2 and [f.key for f in excinfo.value.failures] == [b"c"]
    source.close()
    published = read_to_end(settings, data, 5)
    assert sorted(tracking_of(m).srid for m in published) == sorted(r.srid for r in sent)


def test_send_many_in_a_transaction_commits_or_aborts_with_it(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns, data = _namespace(settings)
    source = Source(settings, ns, transactional_id=unique_name("source"))
    with source.transaction():
        source.send_many(data, [(f"c{i}", b"committed") for i in range(50)])
    with pytest.raises(RuntimeError, match="boom"), source.transaction():
        source.send_many(data, [(f"a{i}", b"aborted") for i in range(50)])
        raise RuntimeError("boom")
    persisted = read_to_end(settings, ns.persist, 3, settled=True)
    published = read_to_end(settings, data, 5, settled=True)
    assert len(persisted) == len(published) == 50
    assert {m.value() for m in published} == {b"committed"}
