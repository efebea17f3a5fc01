"""``kafka_partition`` against the real thing: records keyed by a Java producer and by
confluent-kafka with ``partitioner=murmur2_random`` land where ``kafka_partition`` says.

The Java producer is Kafka's own ``org.apache.kafka.tools.ConsoleProducer`` (``kafka-tools``,
the version ``kafka_classpath()`` resolves), which reads ``key<TAB>value`` lines from stdin.
What it does, read from its 4.3 bytecode and checked at run time where possible:

- it sets no ``partitioner.class`` and leaves ``partitioner.ignore.keys`` at ``false``, so
  ``KafkaProducer.partition`` sends every non-null key through
  ``BuiltInPartitioner.partitionForKey`` = ``toPositive(murmur2(key)) % partitionsForTopic``.
  The test asserts both settings in the producer's logged ``ProducerConfig``;
- ``LineMessageReader`` decodes stdin as UTF-8, splits lines with ``BufferedReader.readLine``
  (on ``\\n``, ``\\r`` and ``\\r\\n``: keys hold none of them, nor the tab separator) and
  re-encodes the key with ``getBytes(UTF_8)``;
- an EMPTY key (``"\\tvalue"``) is ``"".getBytes(UTF_8)``: a non-null, zero-length key, hashed
  like any other (``murmur2(b"")``). Only a key equal to ``null.marker`` (unset here) becomes
  null, and null keys go to the sticky partitioner instead, so the empty-key records are
  checked on their own: non-null on the wire and at ``kafka_partition(b"", n)``.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from broker.dev import kafka_local
from broker.dev.testing import unique_name
from broker.partitioning import kafka_partition

pytestmark = pytest.mark.integration

TAB = "\t"
PRODUCER_TIMEOUT_S = 180

# Characters by UTF-8 length, so a key can be built to an exact byte length. Non-ASCII bytes
# (>= 0x80) in the tail exercise murmur2's ``& 0xff`` on Java's signed bytes.
ASCII = [chr(c) for c in range(0x20, 0x7F)]  # printable, no tab
DIGITS = list("0123456789")
TWO_BYTE = [*"éßñüçøÅЖжπΩאبŁ", "\u0085", "\u00a0", "\u07ff"]  # NEL: no line break to Java
THREE_BYTE = [*"€中文日本語한국어ｶ", "\u2028", "\u2029", "\ufeff", "\ufffd", "\u0800", "\uffef"]
FOUR_BYTE = ["😀", "🎉", "𝄞", "\U00010000", "\U0010ffff", "𠜎"]
CONTROL = ["\x00", "\x01", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f"]  # but not \t, \n, \r
ALPHABETS = {
    "ascii": ASCII,
    "digits": DIGITS,
    "utf8-2": TWO_BYTE,
    "utf8-3": THREE_BYTE,
    "utf8-4": FOUR_BYTE,
    "mixed": ASCII + DIGITS + TWO_BYTE + THREE_BYTE + FOUR_BYTE + CONTROL,
}
SPECIAL_KEYS = [
    "21",  # murmur2 = -973932308
    "foobar",  # murmur2 = -790332482
    " ",
    "  leading and trailing spaces  ",
    "key:with,header=like;chars",
    "\\t literally backslash-t",
    "null",
    "0",
    "-1",
    "2147483647",
    "\x00\x00\x00\x00",
    "\x7f\x7f\x7f",
    "ÿÿÿ",
    "x" * 255,
    "y" * 256,
    "z" * 257,
    "é" * 150,
]


def _key_of_length(rng: random.Random, alphabet: list[str], length: int) -> str:
    """A key of exactly ``length`` UTF-8 bytes, drawn from ``alphabet`` (ASCII fills gaps)."""
    chars: list[str] = []
    left = length
    while left:
        fitting = [c for c in alphabet if len(c.encode()) <= left]
        char = rng.choice(fitting or ASCII)
        chars.append(char)
        left -= len(char.encode())
    key = "".join(chars)
    assert len(key.encode()) == length
    return key


def make_keys(seed: int = 20240607, per_length: int = 12) -> list[str]:
    """~3000 keys: every byte length 0..40 in each alphabet, longer keys, and special cases."""
    rng = random.Random(seed)
    keys = [
        _key_of_length(rng, alphabet, length)
        for length in range(41)
        for alphabet in ALPHABETS.values()
        for _ in range(per_length if length else 1)  # one empty key per alphabet
    ]
    keys += [_key_of_length(rng, ALPHABETS["mixed"], rng.randint(41, 300)) for _ in range(60)]
    keys += [str(rng.randint(-(2**63), 2**63 - 1)) for _ in range(40)]
    keys += SPECIAL_KEYS
    for key in keys:
        assert not set(key) & {TAB, "\n", "\r"}, f"{key!r} cannot be one console line"
    return keys


def _java_log4j2(path: Path) -> Path:
    """Console producer logging on stderr: warnings, and its config dump (INFO)."""
    path.write_text(
        "status = warn\n"
        "appender.err.type = Console\n"
        "appender.err.name = err\n"
        "appender.err.target = SYSTEM_ERR\n"
        "appender.err.layout.type = PatternLayout\n"
        "appender.err.layout.pattern = %p %c: %m%n\n"
        "rootLogger.level = WARN\n"
        "rootLogger.appenderRef.err.ref = err\n"
        # Kafka 4.x logs "ProducerConfig values:" from AbstractConfig's own logger.
        "logger.config.name = org.apache.kafka.common.config.AbstractConfig\n"
        "logger.config.level = INFO\n"
    )
    return path


def produce_with_java(bootstrap: str, topic: str, keys: list[str], tmp_path: Path) -> str:
    """Send ``key<TAB>index`` for every key through ConsoleProducer; return its stderr."""
    java = kafka_local.require_java()
    _, jars = kafka_local.kafka_classpath()
    log4j = _java_log4j2(tmp_path / "log4j2-console-producer.properties")
    cmd = [
        java,
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        ":".join(jars),
        "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        # --property still works in 4.3 but is deprecated in favour of --reader-property.
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        f"key.separator={TAB}",
        "--request-timeout-ms",
        "30000",
    ]
    lines = "".join(f"{key}{TAB}{index}\n" for index, key in enumerate(keys))
    proc = subprocess.run(
        cmd,
        input=lines.encode(),
        capture_output=True,
        timeout=PRODUCER_TIMEOUT_S,
        check=False,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"ConsoleProducer exited with {proc.returncode}:\n{stderr[-3000:]}"
    return stderr


def read_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> list[Message]:
    """Every record of ``topic``: all partitions assigned from offset 0, read up to their EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("g"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        messages: list[Message] = []
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_eof) < partitions:
            assert time.monotonic() < deadline, f"only {sorted(at_eof)} of {partitions} at EOF"
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                error = msg.error()
                if error is None:
                    messages.append(msg)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                else:
                    raise AssertionError(f"consume failed: {error}")
        return messages
    finally:
        consumer.close()


def check_partitions(
    messages: Iterable[Message], sent_keys: list[bytes], partitions: int
) -> list[int]:
    """Assert each record is the one sent and sits at ``kafka_partition``; return the
    partition counts."""
    mismatches, wrong_keys, seen = [], [], []
    counts = [0] * partitions
    for msg in messages:
        index = int(msg.value())
        seen.append(index)
        key = msg.key()
        if key != sent_keys[index]:
            wrong_keys.append((index, sent_keys[index], key))
            continue
        expected = kafka_partition(key, partitions)
        if expected != msg.partition():
            mismatches.append((key, expected, msg.partition()))
        counts[msg.partition()] += 1
    assert not wrong_keys, f"{len(wrong_keys)} keys changed in transit, e.g. {wrong_keys[:10]}"
    assert not mismatches, (
        f"{len(mismatches)} of {len(seen)} records not at kafka_partition(key, {partitions}); "
        "(key, expected, actual): " + "; ".join(map(repr, mismatches[:20]))
    )
    assert sorted(seen) == list(range(len(sent_keys))), "records lost or duplicated"
    return counts


# --------------------------------------------------------------------------------------------


def test_key_set_covers_what_it_claims() -> None:
    keys = [k.encode() for k in make_keys()]
    assert 2500 <= len(keys) <= 3500
    assert {len(k) % 4 for k in keys} == {0, 1, 2, 3}
    assert set(range(41)) <= {len(k) for k in keys}
    assert b"" in keys
    assert any(len(k) > 256 for k in keys)
    # Non-ASCII bytes in the 1..3-byte tail murmur2 mixes by hand, for every tail length.
    assert {len(k) % 4 for k in keys if any(b >= 0x80 for b in k[len(k) & ~3 :])} == {1, 2, 3}


@pytest.mark.parametrize("partitions", [7, 13, 16])
def test_java_console_producer_agrees_with_kafka_partition(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, partitions: int
) -> None:
    keys = make_keys()
    sent = [k.encode() for k in keys]
    topic = new_topic(partitions=partitions, prefix="java-part")

    stderr = produce_with_java(bootstrap, topic, keys, tmp_path)
    # The default partitioner really is in use (no custom class, keys not ignored).
    assert "ProducerConfig values" in stderr, stderr[-3000:]
    assert "partitioner.class = null" in stderr
    assert "partitioner.ignore.keys = false" in stderr
    assert " ERROR " not in f" {stderr}", stderr[-3000:]

    messages = read_topic(bootstrap, topic, partitions)
    assert len(messages) == len(sent)
    counts = check_partitions(messages, sent, partitions)
    assert all(counts), f"some partition got no record: {counts}"

    # The empty key, explicitly: Java sends it as a non-null empty key and hashes it.
    empty = [m for m in messages if not m.key()]
    assert len(empty) == sent.count(b"")
    assert all(m.key() == b"" for m in empty), "an empty key came back as a null key"
    assert {m.partition() for m in empty} == {kafka_partition(b"", partitions)}


def _bytes_keys(seed: int = 7) -> list[bytes]:
    """Keys for the librdkafka case: UTF-8 keys plus raw bytes no console line can carry."""
    rng = random.Random(seed)
    keys = [k.encode() for k in make_keys(seed, per_length=1)]
    keys += [bytes(rng.randrange(256) for _ in range(n)) for n in range(1, 41) for _ in range(3)]
    keys += [b"\t", b"\n", b"\r\n", b"\xff", b"\xff\xfe", b"\x80\x81\x82", b"\xff" * 7]
    return keys


def test_confluent_kafka_murmur2_random_agrees_with_kafka_partition(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    partitions = 13
    keys = _bytes_keys()
    murmur_topic = new_topic(partitions=partitions, prefix="murmur2")
    default_topic = new_topic(partitions=partitions, prefix="crc32")

    for topic, config in (
        (murmur_topic, {"partitioner": "murmur2_random"}),  # what our producers set
        (default_topic, {}),  # librdkafka's default, consistent_random (CRC32)
    ):
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
        for index, key in enumerate(keys):
            producer.produce(topic, key=key, value=str(index).encode())
        assert producer.flush(30) == 0

    messages = read_topic(bootstrap, murmur_topic, partitions)
    assert len(messages) == len(keys)
    check_partitions(messages, keys, partitions)
    empty = [m for m in messages if not m.key()]
    assert empty and all(m.key() == b"" for m in empty), "an empty key came back as a null key"

    # The comparison can fail: librdkafka's default partitioner disagrees on many keys.
    default = read_topic(bootstrap, default_topic, partitions)
    differ = sum(kafka_partition(m.key(), partitions) != m.partition() for m in default)
    assert differ > len(keys) // 2, f"consistent_random agreed with murmur2 on all but {differ}"
