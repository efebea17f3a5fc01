"""The tracking headers and the XOR events as Spark SQL, against the Python definitions.

No Kafka here: DataFrames shaped like the Kafka source's output, checked against
``broker.ids`` / ``broker.client.Tracking`` and a Python fold of the same events.
"""

from __future__ import annotations

import random
import sys
from collections import defaultdict

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from broker import ids
from broker.errors import ConfigurationError
from broker.headers import H_PATH, H_TRACKING, Tracking, path_of, tracking_headers
from broker.schemas import XorBatch
from broker.settings import KafkaSettings, Secret
from spark_jobs import kafka_options
from spark_jobs.acking import (
    CHILD_ID,
    BatchFailed,
    BatchInterrupted,
    BatchResult,
    _for_spark,
    catching_udf,
    collect_xor_batches,
    decide,
    pin,
    with_tracking,
    xor_batches,
    xor_events,
)
from spark_jobs.observed import EventObserver
from spark_jobs.session import build_spark_session
from spark_jobs.tracking import (
    id_from_bytes,
    id_to_bytes,
    new_id,
    packed_ids_sql,
    with_tracking_columns,
)
from spark_jobs.tracking import (
    tracking_headers as spark_tracking_headers,
)

pytestmark = pytest.mark.e2e

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
EDGE_IDS = [
    1,
    -1,
    2**63 - 1,
    -(2**63),
    2**63 - 2,
    -(2**63) + 1,
    255,
    256,
    -256,
    2**31,
    -(2**31),
    2**32 - 1,
    -(2**32),
    0x0102030405060708,
    -0x0102030405060708,
    *[ids.new_id() for _ in range(200)],
]


def test_ids_decode_and_encode_like_broker_ids(spark: SparkSession) -> None:
    """Negative ids included: ``conv(hex(b), 16, 10)`` alone would be unsigned."""
    rows = [(ids.encode_id(v), v) for v in [*EDGE_IDS, 0]]
    df = spark.createDataFrame(rows, "b binary, v bigint")
    got = df.select(
        "v", id_from_bytes(F.col("b")).alias("decoded"), id_to_bytes(F.col("v")).alias("encoded")
    ).collect()
    assert [r["decoded"] for r in got] == [v for _, v in rows]
    assert [bytes(r["encoded"]) for r in got] == [b for b, _ in rows]


def test_id_from_bytes_is_null_unless_eight_bytes(spark: SparkSession) -> None:
    df = spark.createDataFrame([(b"",), (b"\x01" * 7,), (b"\x01" * 9,), (None,)], "b binary")
    assert [r[0] for r in df.select(id_from_bytes(F.col("b"))).collect()] == [None] * 4


def test_packed_ids_sql_is_each_id_big_endian_in_order(spark: SparkSession) -> None:
    df = spark.createDataFrame([(list(EDGE_IDS),), ([],)], "v array<bigint>")
    packed = [bytes(r[0]) for r in df.select(F.expr(packed_ids_sql("v"))).collect()]
    assert packed == [np.array(EDGE_IDS, dtype=">i8").tobytes(), b""]


def test_new_id_is_random_non_zero_and_distinct(spark: SparkSession) -> None:
    values = [r[0] for r in spark.range(20_000).select(new_id()).collect()]
    assert 0 not in values
    assert len(set(values)) == len(values)
    assert any(v < 0 for v in values) and any(v > 0 for v in values)


def _header_cases() -> list[list[tuple[str, bytes | None]] | None]:
    s, r, o = ids.new_id(), ids.new_id(), ids.new_id()
    good = tracking_headers(s, r, o, 3)
    (_, t), = good
    assert t is not None
    return [
        good,
        tracking_headers(-5, -7, -9, 12),
        tracking_headers(s, r, s, 1),  # 16 bytes: origin = srid, attempt 1
        tracking_headers(s, r, o, 1),  # 24 bytes: attempt 1
        [(H_TRACKING, t[:24] + (2**31 - 1).to_bytes(4, "big"))],  # the largest attempt
        [("user", b"x"), *good, ("other", None)],
        [*good, (H_TRACKING, ids.encode_id(42) + t[8:])],  # the last one wins, as in Tracking
        [(H_TRACKING, t[:8])],  # untracked: no record id
        [(H_TRACKING, t[:20])],  # malformed: 20 bytes
        [(H_TRACKING, t + b"\x00")],  # malformed: 29 bytes
        [(H_TRACKING, t[:24] + bytes(4))],  # attempt 0
        [(H_TRACKING, t[:24] + (2**31).to_bytes(4, "big"))],  # attempt beyond an int
        [(H_TRACKING, None)],  # null value
        [("rb-srid", ids.encode_id(s)), ("rb-id", ids.encode_id(r))],  # not the tracking header
        tracking_headers(0, r, o, 1),  # srid 0: the acker would quarantine the batch
        tracking_headers(s, 0, o, 1),  # record id 0
        [],
        None,
    ]


def test_tracking_columns_read_headers_like_tracking(spark: SparkSession) -> None:
    cases = _header_cases()
    df = spark.createDataFrame(
        [(i, h) for i, h in enumerate(cases)],
        StructType([StructField("i", LongType()), StructField("headers", HEADERS)]),
    )
    got = {r["i"]: r for r in with_tracking_columns(df).collect()}
    for i, headers in enumerate(cases):
        expected = Tracking.from_headers(headers)
        row = got[i]
        actual = (
            None
            if row["srid"] is None
            else Tracking(row["srid"], row["record_id"], row["origin"], row["attempt"])
        )
        assert actual == expected, (i, headers)


def test_tracking_headers_round_trip(spark: SparkSession) -> None:
    rows = [(v, -v if v != -(2**63) else 1, v ^ 5, i % 7 + 1) for i, v in enumerate(EDGE_IDS)]
    df = spark.createDataFrame(rows, "s bigint, r bigint, o bigint, a int")
    encoded = df.select(
        spark_tracking_headers(F.col("s"), F.col("r"), F.col("o"), F.col("a")).alias("headers")
    )
    decoded = [
        Tracking.from_headers([(h["key"], bytes(h["value"])) for h in row["headers"]])
        for row in encoded.collect()
    ]
    assert decoded == [Tracking(s, r, o, a) for s, r, o, a in rows]


def test_paths_decode_like_path_of_and_round_trip(spark: SparkSession) -> None:
    s, r = ids.new_id(), ids.new_id()
    base = tracking_headers(s, r, s, 1)
    cases = [
        base,  # a source record: the root
        [*base, (H_PATH, b"0.2")],
        [*base, (H_PATH, b"0.1"), (H_PATH, b"0.1.4")],  # the last one wins
        [*base, (H_PATH, b"")],
        [(H_PATH, b"0.3")],  # untracked: no path either
    ]
    df = spark.createDataFrame(
        list(enumerate(cases)), StructType([StructField("i", LongType()), StructField("headers", HEADERS)])
    )
    got = {row["i"]: row["path"] for row in with_tracking_columns(df).collect()}
    assert got == {i: path_of(h) for i, h in enumerate(cases[:-1])} | {len(cases) - 1: None}

    encoded = spark.createDataFrame([(s, r, s, 2, "0.1.2")], "s bigint, r bigint, o bigint, a int, p string")
    headers = encoded.select(
        spark_tracking_headers(F.col("s"), F.col("r"), F.col("o"), F.col("a"), F.col("p")).alias("h")
    ).collect()[0]["h"]
    assert path_of([(h["key"], bytes(h["value"])) for h in headers]) == "0.1.2"


def test_with_tracking_needs_headers(spark: SparkSession) -> None:
    with pytest.raises(ConfigurationError, match="includeHeaders"):
        with_tracking(spark.createDataFrame([(b"v",)], "value binary"))


# --------------------------------------------------------------------------- XOR events


def _batch(seed: int, n: int = 600, srids: int = 150) -> tuple[list[tuple], list[tuple]]:
    """Inputs (several per srid, some replays, some untracked, some failed) and children."""
    rng = random.Random(seed)
    pool = [ids.new_id() for _ in range(srids)]
    inputs = []
    for i in range(n):
        if i % 50 == 0:
            inputs.append((f"u{i}", None, None, False, "orders", False))
            continue
        s = rng.choice(pool)
        replay = rng.random() < 0.2
        inputs.append(
            (f"k{i}", s, ids.new_id(), rng.random() < 0.03, "orders.replay" if replay else "orders", replay)
        )
    children = [(s, ids.new_id()) for (_, s, *_rest) in inputs if s is not None and rng.random() < 0.3]
    return inputs, children


def _reference(inputs: list[tuple], children: list[tuple], P: int):
    """Per ledger partition: {srid: xor} of the srids that did not fail, and the failed srids."""
    xor: dict[int, int] = defaultdict(int)
    failed: set[int] = set()
    for _, s, r, f, _, _ in inputs:
        if s is None:
            continue
        xor[s] ^= r
        if f:
            failed.add(s)
    for s, c in children:
        xor[s] ^= c
    pairs: dict[int, dict[int, int]] = defaultdict(dict)
    fails: dict[int, set[int]] = defaultdict(set)
    for s, x in xor.items():
        if s in failed:
            continue
        if x != 0:
            pairs[s % P][s] = x
    for s in failed:
        fails[s % P].add(s)
    return pairs, fails


INPUT_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("srid", LongType()),
        StructField("record_id", LongType()),
        StructField("bad", BooleanType()),
        StructField("topic", StringType()),
        StructField("is_replay", BooleanType()),
    ]
)


def _by_partition(batches: list[XorBatch], P: int) -> tuple[dict[int, dict[int, int]], dict[int, set[int]]]:
    """The batches as the acker reads them, per ledger partition: {srid: xor} and the failed
    srids (partitions without any left out); every pair in its srid's partition."""
    pairs: dict[int, dict[int, int]] = defaultdict(dict)
    fails: dict[int, set[int]] = defaultdict(set)
    for xb in batches:
        xb = XorBatch.decode(xb.encode())  # what the acker reads
        assert all(s % P == xb.ledger_partition for s in xb.srids.tolist())
        pairs[xb.ledger_partition].update(zip(xb.srids.tolist(), xb.xors.tolist(), strict=True))
        fails[xb.ledger_partition].update(xb.failed.tolist())
    return dict(pairs), {k: v for k, v in fails.items() if v}


@pytest.mark.parametrize("ledger_partitions", [1, 5])
def test_xor_events_equal_the_python_fold(spark: SparkSession, ledger_partitions: int) -> None:
    inputs, children = _batch(seed=ledger_partitions)
    # Two inputs of one srid cancelling out, to check that a zero XOR is not sent.
    z, r = ids.new_id(), ids.new_id()
    inputs += [("z1", z, r, False, "orders", False), ("z2", z, r, False, "orders", False)]
    failed_extra = {inputs[7][1]}
    df = spark.createDataFrame(inputs, INPUT_SCHEMA)
    kids = spark.createDataFrame(children, StructType([StructField("srid", LongType()), StructField(CHILD_ID, LongType())]))
    failed_df = spark.createDataFrame([(s,) for s in failed_extra], "srid bigint")

    batches, counts = collect_xor_batches(xor_events(df, ledger_partitions, F.col("bad"), [kids]), "test")
    got_pairs, got_fails = _by_partition(batches, ledger_partitions)
    want_pairs, want_fails = _reference(inputs, children, ledger_partitions)
    assert got_pairs == dict(want_pairs)
    assert got_fails == dict(want_fails)
    assert z not in {s for p in got_pairs.values() for s in p}  # a zero XOR is not sent
    assert counts["inputs"] == len(inputs) - counts["untracked"]
    assert counts["untracked"] == sum(1 for i in inputs if i[1] is None)
    assert counts["replay_inputs"] == sum(1 for i in inputs if i[1] is not None and i[5])
    assert counts["children"] == len(children)

    # Failing by DataFrame: the srids listed fail, everything else is acked.
    events = xor_events(df, ledger_partitions, failed_df, [kids])
    batches, _ = collect_xor_batches(events, "test")
    fails = {s for xb in batches for s in xb.failed.tolist()}
    assert fails == failed_extra


def test_collect_xor_batches_cuts_large_partitions(spark: SparkSession) -> None:
    rows = [(f"k{i}", ids.new_id(), ids.new_id(), i % 10 == 0, "t", False) for i in range(2500)]
    events = xor_events(spark.createDataFrame(rows, INPUT_SCHEMA), 2, F.col("bad"))
    batches, counts = collect_xor_batches(events, "test", max_pairs=300)
    assert max(len(xb.srids) for xb in batches) <= 300
    assert max(len(xb.failed) for xb in batches) <= 300
    assert sum(len(xb.srids) for xb in batches) == counts["pairs"] == 2250
    assert sum(len(xb.failed) for xb in batches) == counts["fail_marks"] == 250


# --------------------------------------------------------------------------- pins


def test_a_pin_is_evaluated_once_and_read_from_its_blocks(spark: SparkSession) -> None:
    """The pinned frame's plan runs once, in the first job that reads it; every later job reads
    its blocks - a nondeterministic column keeps its values - and the plan is a LogicalRDD."""
    frame = spark.range(0, 2_000, 1, 4).withColumn("r", F.rand()).withColumn("part", F.spark_partition_id())
    pinned = pin(frame)
    rdd = pinned._jdf.queryExecution().logical().rdd()
    assert not rdd.isCheckpointed()  # lazy: no job ran yet
    first = sorted(pinned.collect())
    assert rdd.isCheckpointed()
    assert sorted(pinned.collect()) == first
    assert sorted(pinned.where("id % 2 = 0").collect()) == [row for row in first if row["id"] % 2 == 0]
    assert pinned.rdd.getNumPartitions() == 4


def test_a_pin_whose_blocks_are_lost_fails_its_reader(spark: SparkSession) -> None:
    """A lost block is an error for the job that needs it, never a second evaluation of the
    plan (the decision a pin holds would otherwise be asked again)."""
    pinned = pin(spark.range(0, 100, 1, 2).withColumn("r", F.rand()))
    pinned.collect()
    pinned._jdf.queryExecution().logical().rdd().unpersist(True)  # the blocks the pin reads
    with pytest.raises(Exception, match=r"[Cc]heckpoint block .* not found"):
        pinned.collect()


# --------------------------------------------------------------------------- observed events

CHILD_SCHEMA = StructType([StructField("srid", LongType()), StructField(CHILD_ID, LongType())])


def _noop(frame) -> None:
    frame.write.format("noop").mode("overwrite").save()


@pytest.mark.parametrize("form", ["column", "dataframe"])
def test_observed_events_equal_the_python_fold(spark: SparkSession, form: str) -> None:
    """The events read from the observations of the jobs that wrote the outputs (no events job)
    are the events the Python fold gives: every input's id, every child's, every fail mark."""
    P = 3
    inputs, children = _batch(seed=7)
    ob = EventObserver(0)
    batch = ob.inputs(spark.createDataFrame(inputs, INPUT_SCHEMA))
    failed = F.col("bad") if form == "column" else batch.where("bad").select("srid")
    decision = decide(batch, BatchResult(failed=failed, write=lambda ok, _b: None), ob)
    _noop(decision.ok)  # the handler's write: it fills the pins
    _noop(ob.pin_children(spark.createDataFrame(children, CHILD_SCHEMA), CHILD_ID))  # the children's

    observed = ob.events()
    assert observed is not None, ob.missed
    batches, counts = xor_batches(P, observed.srids, observed.xors, observed.failed, observed.counts, "test")
    assert _by_partition(batches, P) == _reference(inputs, children, P)
    assert counts["untracked"] == sum(1 for i in inputs if i[1] is None)
    assert counts["inputs"] == len(inputs) - counts["untracked"]
    assert counts["replay_inputs"] == sum(1 for i in inputs if i[1] is not None and i[5])
    assert counts["children"] == len(children)


def test_observed_events_are_not_trusted_unless_complete(spark: SparkSession) -> None:
    """A fail mark or a child id missing from an observation would complete a tree early: where
    the observer cannot show its observations complete it answers None, and the ack step runs
    the events job instead."""
    inputs, _ = _batch(seed=8, n=40, srids=10)
    bad = BatchResult(failed=F.col("bad"), write=lambda ok, _b: None)

    # A pin no job read: nothing was written from it, and nothing observed.
    ob = EventObserver(1)
    decide(ob.inputs(spark.createDataFrame(inputs, INPUT_SCHEMA)), bad, ob)
    assert ob.events() is None and "not filled" in (ob.missed or "")

    # Empty partitions are not observed (no row passes the observation) and are counted in
    # the pin instead: the events are complete.
    ob = EventObserver(2)
    sparse = spark.createDataFrame(spark.sparkContext.parallelize(inputs[:9], 8), INPUT_SCHEMA)
    decision = decide(ob.inputs(sparse), bad, ob)
    _noop(decision.ok)
    observed = ob.events()
    assert observed is not None, ob.missed
    batches, _ = xor_batches(3, observed.srids, observed.xors, observed.failed, observed.counts)
    assert _by_partition(batches, 3) == _reference(inputs[:9], [], 3)

    # Observations lost while the pinned blocks stay - what a task that stored its block and
    # then failed leaves (its retry reads the block; the failed attempt's observation is
    # dropped): here the plan's observations are reset after the write.
    ob = EventObserver(3)
    decision = decide(ob.inputs(spark.createDataFrame(inputs, INPUT_SCHEMA)), bad, ob)
    _noop(decision.ok)
    ob._pins[0].observed._jdf.queryExecution().executedPlan().resetMetrics()
    assert ob.events() is None and "rows in partitions not observed" in (ob.missed or "")

    # Rows that do not come from the batch: the inputs' ids were observed under no pin.
    ob = EventObserver(4)
    ob.inputs(spark.createDataFrame(inputs, INPUT_SCHEMA))
    other = spark.createDataFrame(inputs, INPUT_SCHEMA)
    decision = decide(other, bad, ob)
    _noop(decision.ok)
    assert ob.events() is None and "no pin read the batch" in (ob.missed or "")


# --------------------------------------------------------------------------- errors for Spark


class _FakePy4JError(Exception):
    pass


def test_errors_reach_spark_as_one_line() -> None:
    """Spark 4.0's stream thread matches a Python error's text with a regex that recurses per
    character: a multi-kB Java trace overflows its stack. Errors leave ``Acking`` short."""
    java_trace = "\n".join(f"\tat org.apache.spark.Foo.bar{i}(Foo.scala:{i})" for i in range(400))
    interrupted = _FakePy4JError(
        f"An error occurred while calling o42.parquet.\n: java.io.InterruptedIOException: "
        f"java.lang.InterruptedException\n{java_trace}"
    )
    error = _for_spark(interrupted, 7)
    assert isinstance(error, BatchInterrupted)
    # Worded as Spark's StreamExecution.PROXY_ERROR expects a stop-time interruption.
    assert str(error).startswith("py4j.protocol.Py4JJavaError: An error occurred while calling")
    assert "java.lang.InterruptedException" in str(error)
    assert len(str(error)) < 200

    failed = _for_spark(_FakePy4JError(f"An error occurred while calling o1.save.\n: boom\n{java_trace}"), 8)
    assert type(failed) is BatchFailed
    assert "\n" not in str(failed) and len(str(failed)) < 700
    assert "Py4JJavaError: An error occurred while calling" not in str(failed)


def test_an_exception_per_record_becomes_a_fail_mark(spark: SparkSession) -> None:
    """``catching_udf``: the records whose function raised fail; the others are acked."""

    def parse(value: str) -> int:
        return int(value)  # raises ValueError on "oops"

    rows = [(str(i) if i % 9 else "oops", ids.new_id(), ids.new_id()) for i in range(60)]
    df = spark.createDataFrame(rows, "value string, srid bigint, record_id bigint")
    parsed = catching_udf(parse, "int")(F.col("value"))
    batches, _ = collect_xor_batches(xor_events(df, 3, parsed["error"].isNotNull()))
    failed = {s for xb in batches for s in xb.failed.tolist()}
    acked = {s for xb in batches for s in xb.srids.tolist()}
    assert failed == {s for v, s, _ in rows if v == "oops"}
    assert acked == {s for v, s, _ in rows if v != "oops"}
    errors = df.select(parsed["error"].alias("e")).where("e IS NOT NULL").collect()
    assert {r["e"] for r in errors} == {"ValueError: invalid literal for int() with base 10: 'oops'"}


def test_one_session_with_the_kafka_connector(spark: SparkSession) -> None:
    """Every builder call returns the session of the run, and it was started with the jars."""
    assert build_spark_session(app_name="another") is spark
    jars = spark.sparkContext.getConf().get("spark.jars") or ""
    assert "spark-sql-kafka-0-10_2.13" in jars
    assert spark.sparkContext.master.startswith("local")


def test_python_workers_run_this_interpreter(spark: SparkSession) -> None:
    """A UDF that imports the project's dependencies (a lookup, say) needs this virtualenv."""

    def prefix(_value: object) -> str:
        import sys

        return sys.prefix

    assert spark.range(1).select(F.udf(prefix, "string")("id")).first()[0] == sys.prefix


def test_kafka_options_carry_the_connection_settings() -> None:
    plain = kafka_options("h1:9092,h2:9092")
    assert plain == {"kafka.bootstrap.servers": "h1:9092,h2:9092"}
    secure = KafkaSettings(
        "h:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="svc",
        sasl_password=Secret('pa"ss'),
        ssl_ca_location="/etc/ca.pem",
    )
    opts = kafka_options(secure)
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required '
        'username="svc" password="pa\\"ss";'
    )
    assert (opts["kafka.ssl.truststore.type"], opts["kafka.ssl.truststore.location"]) == ("PEM", "/etc/ca.pem")
