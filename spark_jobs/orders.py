"""The example job: keyed order enrichment and aggregation under the broker's guarantee.

Orders arrive on ``orders`` (key = customer id, value = JSON) and on ``orders.replay``. Per
micro-batch the job

- parses each order and enriches it with the customer dimension (region, tier, discount);
- fails the orders it cannot handle *yet* - unparsable JSON, a field that is not of its type
  (an amount that is not a number), or a customer not in the dimension - so the broker
  replays them (and dead-letters them after their max attempts), record by record: a bad value
  never raises (``from_json`` is PERMISSIVE, no ANSI ``cast``), so it never fails the batch;
- writes one fact per order (origin, path) to a ``CommittingSink`` (``OriginParquetSink`` or
  ``OriginDeltaSink``: a replayed order never doubles);
- emits a ``large order`` alert for orders above a threshold to another fault-tolerant topic,
  anchored to the order's tree: the order completes only when its alert is processed too.

Revenue per region and tier is an aggregation over the deduplicated facts
(``revenue_by_region``), so it counts every order exactly once however often it was replayed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from spark_jobs.acking import BatchHandler, BatchResult, Emit
from spark_jobs.committed import CommittingSink
from spark_jobs.tracking import ATTEMPT, ORIGIN, PATH, RECORD_ID, SRID

ORDER_SCHEMA = StructType(
    [
        StructField("order_id", LongType()),
        StructField("customer", StringType()),
        StructField("amount", DoubleType()),
        StructField("items", IntegerType()),
    ]
)
CUSTOMER_SCHEMA = StructType(
    [
        StructField("customer", StringType()),
        StructField("region", StringType()),
        StructField("tier", StringType()),
        StructField("discount", DoubleType()),
    ]
)
REGIONS = ("emea", "amer", "apac")
TIERS = {"gold": 0.10, "silver": 0.05, "bronze": 0.0}


@dataclass(frozen=True)
class Order:
    order_id: int
    customer: str
    amount: float
    items: int

    def key(self) -> bytes:
        return self.customer.encode()

    def value(self) -> bytes:
        return json.dumps(
            {"order_id": self.order_id, "customer": self.customer, "amount": self.amount, "items": self.items}
        ).encode()


def customers(n: int = 50) -> list[tuple[str, str, str, float]]:
    """The customer dimension: (customer, region, tier, discount)."""
    tiers = list(TIERS)
    return [
        (f"c{i:03d}", REGIONS[i % len(REGIONS)], tiers[i % len(tiers)], TIERS[tiers[i % len(tiers)]])
        for i in range(n)
    ]


def make_orders(n: int, n_customers: int = 50, seed: int = 7) -> list[Order]:
    rng = random.Random(seed)
    return [
        Order(i, f"c{rng.randrange(n_customers):03d}", round(rng.uniform(5, 500), 2), rng.randint(1, 9))
        for i in range(n)
    ]


def customer_frame(spark: SparkSession, rows: Sequence[tuple[str, str, str, float]]) -> DataFrame:
    return spark.createDataFrame(list(rows), CUSTOMER_SCHEMA)


def enrich(batch: DataFrame, customer_dim: DataFrame) -> DataFrame:
    """Input rows -> order columns + dimension columns (null region: unknown customer)."""
    orders = batch.select(
        "*", F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order")
    ).select("*", "order.*")
    return orders.join(F.broadcast(customer_dim), "customer", "left")


def facts(enriched: DataFrame) -> DataFrame:
    """What the sink stores: one row per order, keyed by origin."""
    return enriched.select(
        ORIGIN,
        PATH,
        "order_id",
        "customer",
        "region",
        "tier",
        "amount",
        (F.col("amount") * (1 - F.col("discount"))).alias("net_amount"),
        "items",
        ATTEMPT,
        F.col("topic").alias("source_topic"),
    )


def revenue_by_region(sink_facts: DataFrame) -> DataFrame:
    return sink_facts.groupBy("region", "tier").agg(
        F.count("*").alias("orders"), F.round(F.sum("net_amount"), 2).alias("net_revenue")
    )


def unreadable() -> Column:
    """Orders whose JSON or fields the job cannot read. ``from_json`` turns a bad field into
    null (PERMISSIVE) instead of raising - a raise under ANSI mode, like a plain ``cast``,
    would fail the whole batch on every restart - so a bad value must be failed explicitly,
    or the order would be written with a null amount and acked. ``1e999`` parses as infinity."""
    amount = F.col("amount")
    return (
        F.col("order_id").isNull()
        | F.col("customer").isNull()
        | F.col("items").isNull()
        | amount.isNull()
        | F.isnan(amount)
        | (F.abs(amount) == F.lit(float("inf")))
    )


def first_attempt_failures(rate: float) -> Column:
    """Failure injection: ``rate`` of the origins fail on their first attempt. Chosen by a
    hash of the origin, so a micro-batch that runs again fails the same records."""
    threshold = int(rate * 1_000_000)
    return (F.col(ATTEMPT) == 1) & (F.pmod(F.xxhash64(F.col(ORIGIN)), F.lit(1_000_000)) < threshold)


# What ``order_job`` keeps of an enriched order: the sink's facts, the alerts, the decision.
PINNED = (SRID, RECORD_ID, ORIGIN, ATTEMPT, PATH, "topic", "order_id", "customer", "region", "tier", "amount",
          "discount", "items")


def order_job(
    sink: CommittingSink,
    customer_dim: DataFrame,
    *,
    alerts_topic: str | None = None,
    alert_amount: float = 450.0,
    inject: Column | None = None,
) -> BatchHandler:
    """The batch function to wrap with ``Acking``."""

    def handle(batch: DataFrame, batch_id: int) -> BatchResult:
        enriched = enrich(batch, customer_dim)
        cannot = unreadable() | F.col("region").isNull()
        if inject is not None:
            cannot = cannot | F.coalesce(inject, F.lit(False))
        # Only the columns the decision and the write read: Acking pins the rows (all their
        # columns, stored once per batch), and the raw value and headers are most of a row.
        return BatchResult(rows=enriched.select(*PINNED), failed=cannot, write=write, sink=sink)

    def write(good: DataFrame, batch_id: int) -> list[Emit]:
        # ``good``: the orders not failed, read from the pinned decision - the same rows the
        # acks complete, so a fact or an alert is never missing for an order acked as done.
        sink.write(facts(good), batch_id)
        if alerts_topic is None:
            return []
        alerts = good.where(F.col("amount") >= alert_amount).select(
            F.col("customer").alias("key"),
            F.to_json(F.struct("order_id", "customer", "amount", "region")).alias("value"),
            SRID,
            ORIGIN,
            ATTEMPT,
            PATH,
            RECORD_ID,
        )
        return [Emit(alerts_topic, alerts)]

    return handle
