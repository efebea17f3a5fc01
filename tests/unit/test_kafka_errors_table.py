"""One table of Kafka errors (broker.kafka_errors): no other module lists error codes, and
each meaning's codes are the ones the services relied on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.errors import KafkaClientError
from broker.kafka_errors import TABLE, Meaning, codes, is_fatal, kafka_error, kafka_errors_in, means

ROOT = Path(__file__).resolve().parents[2]
THE_TABLE = ROOT / "broker" / "kafka_errors.py"


def _is_code(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "KafkaError"


def code_collections(source: str) -> list[int]:
    """Lines of the set, frozenset, tuple or list literals that hold two or more
    ``KafkaError.<CODE>`` - a list of error codes of its own."""
    found: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        listed = isinstance(node, ast.Set | ast.Tuple | ast.List) and sum(map(_is_code, node.elts)) >= 2
        wrapped = (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "frozenset"
            and any(_is_code(n) for arg in node.args for n in ast.walk(arg))
        )
        if listed or wrapped:
            found.add(node.lineno)
    return sorted(found)


def lists_of_codes(root: Path) -> dict[str, list[int]]:
    """Every module under ``root``'s ``broker`` and ``spark_jobs`` but the table itself that
    lists Kafka error codes, with the lines."""
    out = {}
    for path in sorted([*root.glob("broker/**/*.py"), *root.glob("spark_jobs/**/*.py")]):
        if path.resolve() == THE_TABLE:
            continue
        lines = code_collections(path.read_text())
        if lines:
            out[str(path.relative_to(root))] = lines
    return out


def test_no_module_but_the_table_lists_kafka_error_codes() -> None:
    assert lists_of_codes(ROOT) == {}


@pytest.mark.parametrize(
    "source",
    [
        "X = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})",
        "X = frozenset([KafkaError._FENCED])",
        "def f(e):\n    return e.code() in (KafkaError._SSL, KafkaError._AUTHENTICATION)",
        "final = {KafkaError._ALL_BROKERS_DOWN, KafkaError._SSL}",
    ],
)
def test_the_scan_sees_a_list_of_codes(source: str) -> None:
    assert code_collections(source) == [source.count("\n", 0, source.index("KafkaError")) + 1]


def test_the_scan_lets_one_code_compared_alone_pass() -> None:
    assert code_collections("def f(e):\n    return e.code() == KafkaError._PARTITION_EOF") == []


# The codes each service acted on at f6b7ae1 (each was a frozenset of its own).
@pytest.mark.parametrize(
    ("meaning", "expected"),
    [
        (Meaning.PRODUCER_FENCED, {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}),
        (Meaning.CUT_OFF, {KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._MSG_TIMED_OUT,
                           KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}),
        (Meaning.LOST_MEMBERSHIP, {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                                   KafkaError.REBALANCE_IN_PROGRESS, KafkaError.FENCED_INSTANCE_ID,
                                   KafkaError._ASSIGNMENT_LOST, KafkaError._STATE}),
        (Meaning.COORDINATOR_AWAY, {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                    KafkaError.NOT_COORDINATOR, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT,
                                    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._WAIT_COORD}),
        (Meaning.UNKNOWN_TOPIC, {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}),
        (Meaning.REFUSED_RECORD, {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
                                  KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_TIMESTAMP, KafkaError.POLICY_VIOLATION}),
        (Meaning.TOO_LARGE, {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}),
        (Meaning.UNDELIVERABLE, {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
                                 KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_RECORD}),
        (Meaning.STALE_METADATA, {KafkaError._UNKNOWN_PARTITION, KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.LEADER_NOT_AVAILABLE}),
        (Meaning.INSTANCE_IN_USE, {KafkaError.UNRELEASED_INSTANCE_ID, KafkaError.FENCED_INSTANCE_ID}),
    ],
)
def test_each_meaning_has_the_codes_its_services_acted_on(meaning: Meaning, expected: set[int]) -> None:
    assert codes(meaning) == expected


def test_the_bridge_is_fenced_by_a_producer_or_by_a_member_with_its_instance_id() -> None:
    """The acker's fencing is its producer's alone: a member with its instance id is a
    rejoin with back-off (broker.acker.membership), not a fencing."""
    bridge = codes(Meaning.PRODUCER_FENCED | Meaning.INSTANCE_FENCED)
    assert bridge == codes(Meaning.PRODUCER_FENCED) | {KafkaError.FENCED_INSTANCE_ID}


def test_every_code_of_the_table_is_a_kafka_error_code() -> None:
    for code in TABLE:
        assert KafkaError(code).code() == code
        assert not KafkaError(code).str().startswith("Err-")


def test_means_reads_the_error_of_an_exception_and_its_wrapper() -> None:
    err = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)
    exc = KafkaException(err)
    wrapped = KafkaClientError("commit", error=err)
    assert kafka_error(exc) is err and kafka_error(wrapped) is err
    assert means(exc, Meaning.PRODUCER_FENCED) and means(wrapped, Meaning.PRODUCER_FENCED) and means(err, Meaning.PRODUCER_FENCED)
    assert not means(exc, Meaning.CUT_OFF) and not means(None, Meaning.PRODUCER_FENCED)
    assert not means(RuntimeError("x"), Meaning.PRODUCER_FENCED)
    assert is_fatal(exc) and not is_fatal(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    try:
        raise RuntimeError("outer") from exc
    except RuntimeError as outer:
        assert list(kafka_errors_in(outer)) == [err]
