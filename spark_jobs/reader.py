"""Read a data topic and its replay topic with the spark-sql-kafka source, tracking decoded.

A replay goes to ``<topic>.replay`` at the partition index the original went to (docs/design.md §6),
so one subscription to both topics sees every attempt of every key, in per-key order within
each topic. The tracking headers become columns in the JVM (``spark_jobs.tracking``).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from broker.errors import ConfigurationError, TopologyError
from broker.kafka_io import partition_counts
from broker.settings import KafkaSettings
from broker.topics import replay_topic
from spark_jobs.tracking import IS_REPLAY, with_tracking_columns

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


# How long the source's consumers let the broker hold a fetch that finds no data
# (``read_with_replay``).
FETCH_MAX_WAIT_MS = 10


def as_settings(bootstrap: str | KafkaSettings) -> KafkaSettings:
    return bootstrap if isinstance(bootstrap, KafkaSettings) else KafkaSettings(bootstrap)


def kafka_options(bootstrap: str | KafkaSettings) -> dict[str, str]:
    """The ``kafka.*`` options of Spark's Kafka source and sink (Java client names) for the
    connection in ``KafkaSettings``: servers, security protocol, SASL PLAIN/SCRAM and a PEM CA.

    ``KafkaSettings.extra`` holds librdkafka names and is not translated: pass Java client
    options to ``read_with_replay(options=...)`` yourself.
    """
    settings = as_settings(bootstrap)
    opts = {"kafka.bootstrap.servers": settings.bootstrap_servers}
    if settings.security_protocol != "PLAINTEXT":
        opts["kafka.security.protocol"] = settings.security_protocol
    if settings.sasl_mechanism:
        opts["kafka.sasl.mechanism"] = settings.sasl_mechanism
        module = _JAAS_MODULES.get(settings.sasl_mechanism.upper())
        if module is None:
            raise ConfigurationError(
                f"SASL mechanism {settings.sasl_mechanism} needs kafka.sasl.jaas.config in options"
            )
        if settings.sasl_username and settings.sasl_password:
            user = settings.sasl_username.replace('"', '\\"')
            password = settings.sasl_password.get().replace('"', '\\"')
            opts["kafka.sasl.jaas.config"] = (
                f'{module} required username="{user}" password="{password}";'
            )
    if settings.ssl_ca_location:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = settings.ssl_ca_location
    return opts


def check_topics(bootstrap: str | KafkaSettings, topic: str) -> int:
    """``topic`` and ``topic.replay`` exist with equal partition counts; returns the count."""
    replay = replay_topic(topic)
    counts = partition_counts(as_settings(bootstrap), [topic, replay])
    missing = [t for t, n in counts.items() if n is None]
    if missing:
        raise TopologyError(
            f"topics missing: {', '.join(missing)} (replaybroker topics create ... --data-topic {topic}:N)"
        )
    if counts[topic] != counts[replay]:
        raise TopologyError(f"{replay} has {counts[replay]} partitions, {topic} has {counts[topic]}")
    return int(counts[topic] or 0)


def read_with_replay(
    spark: SparkSession,
    bootstrap: str | KafkaSettings,
    topic: str,
    *,
    stream: bool = True,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    options: Mapping[str, str] | None = None,
    check: bool = True,
) -> DataFrame:
    """``topic`` + ``topic.replay`` as one DataFrame (streaming unless ``stream=False``).

    Columns: the Kafka source's ``key, value, topic, partition, offset, timestamp,
    timestampType, headers``, then ``srid, record_id, origin, attempt`` (bigint / int, null
    for untracked records) and ``is_replay``.

    Reads ``read_committed``: the acker publishes replays inside its transactions, and a
    replay of an aborted transaction must not be processed. ``options`` are passed to the
    source last (e.g. ``{"kafka.group.id": ...}``, ``{"endingOffsets": ...}``).

    Fetches wait at most ``FETCH_MAX_WAIT_MS`` for data (the Java consumer's default is 500
    ms): a task that reads up to the end of a partition - every micro-batch of a query that
    keeps up - otherwise waits about twice that, once the data is there. The wait applies only
    to a fetch that finds no data: with ``fetch.min.bytes`` 1 a fetch with data returns at once.
    """
    if check:
        check_topics(bootstrap, topic)
    reader = spark.readStream if stream else spark.read
    opts: dict[str, str] = {
        **kafka_options(bootstrap),
        "subscribe": f"{topic},{replay_topic(topic)}",
        "includeHeaders": "true",
        "startingOffsets": starting_offsets,
        "kafka.isolation.level": "read_committed",
        "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
    }
    if max_offsets_per_trigger is not None:
        opts["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    opts.update(options or {})
    df = reader.format("kafka").options(**opts).load()
    return with_tracking_columns(df, "headers").withColumn(
        IS_REPLAY, F.col("topic") == replay_topic(topic)
    )
