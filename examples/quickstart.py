"""Quickstart: source -> enrich -> leaf, with the acker in this process.

    python examples/quickstart.py [--bootstrap HOST:PORT] [--records 1000] [--keep]

Without ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``) it uses the embedded Kafka, started if
none runs (``replaybroker kafka down`` stops it). Every 100th order fails on its first attempt
(replayed) and every 250th always fails (dead-lettered after 3 attempts). The last line on
stdout is a JSON summary from ground truth - the persist topic's tombstones and what the leaf
wrote - and the exit code is 0 only when no record is lost.
"""

from __future__ import annotations  # noqa: I001 - the README shows the block below the marker

import argparse
import logging
import sys
import time
import uuid
from typing import NamedTuple

import orjson

from broker.completions import OutcomeTail
from broker.dev.kafka_local import bootstrap_or_embedded
from broker.topics import create, delete, layout

# --8<-- [start:pipeline]
from broker import (
    Acker,
    AckerConfig,
    JsonSerde,
    KafkaSettings,
    Namespace,
    Source,
    SourceConfig,
    Task,
    TaskConfig,
    TaskContext,
    TaskRecord,
)


def run(settings: KafkaSettings, ns: Namespace, records: int, tail: OutcomeTail) -> Outcome:
    orders, enriched = f"{ns.name}.orders", f"{ns.name}.enriched"
    sent: dict[int, int] = {}  # order id -> origin (the srid of its first attempt)
    written: dict[int, dict] = {}  # the outside world: what the leaf wrote, by order id

    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        order = record.decoded()  # the value through TaskConfig.serde (JSON here)
        if order["id"] % 250 == 0:
            ctx.fail("no such customer")  # replayed at once; dead-lettered after max_attempts
            return
        if order["id"] % 100 == 0 and record.tracking and record.tracking.attempt == 1:
            raise TimeoutError("the lookup timed out")  # an exception fails the input too
        ctx.emit(enriched, record.key, {**order, "region": "eu"})  # a tracked child: leaf acks it

    def leaf(record: TaskRecord, ctx: TaskContext) -> None:
        order = record.decoded()
        written[order["id"]] = order  # the last hop writes to the outside world; returning acks

    json = TaskConfig(serde=JsonSerde())
    with (
        Acker(settings, ns, AckerConfig(instance_id=f"{ns.name}-acker")).run_in_background(),
        Task(settings, ns, [orders, f"{orders}.replay"], f"{ns.name}.enrich", enrich, json).run_in_background(),
        Task(settings, ns, [enriched], f"{ns.name}.leaf", leaf, json).run_in_background(),
        Source(settings, ns, SourceConfig(serde=JsonSerde(), max_attempts=3)) as source,
    ):
        for i in range(records):
            sent[i] = source.send(orders, f"customer-{i % 97}", {"id": i, "amount": i % 500}).origin
        source.flush()
        wait_for_outcomes(tail, records)  # a completion or a dead letter for every order
    return Outcome(sent, written)
# --8<-- [end:pipeline]


class Outcome(NamedTuple):
    sent: dict[int, int]
    written: dict[int, dict]


def wait_for_outcomes(tail: OutcomeTail, records: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tail.poll(0.2)
        if len(set(tail.log.completed_origins()) | tail.log.dlq_origins()) >= records:
            return


def summary(tail: OutcomeTail, outcome: Outcome) -> dict[str, int]:
    """From ground truth: an order is completed when its tree completed (its tombstone says
    so) and the leaf wrote it; lost when it is neither completed nor dead-lettered."""
    tail.poll(1.0)
    id_of = {origin: id_ for id_, origin in outcome.sent.items()}
    completed = {o for o in tail.log.completed_origins() if id_of.get(o) in outcome.written}
    dlq = tail.log.dlq_origins() & set(id_of)
    return {"records": len(outcome.sent), "completed": len(completed), "replayed": tail.log.replays(),
            "dlq": len(dlq), "lost": len(set(id_of) - completed - dlq)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka (default: $KAFKA_BOOTSTRAP_SERVERS, "
                        "else the embedded Kafka, started if none runs)")
    parser.add_argument("--records", type=int, default=1000, help="orders to send (default: 1000)")
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics afterwards")
    parser.add_argument("-v", "--verbose", action="store_true", help="log warnings (handler failures ...)")
    args = parser.parse_args(argv)
    if args.records <= 0:
        parser.error("--records must be positive")
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR, stream=sys.stderr)
    settings = KafkaSettings.from_env(bootstrap_or_embedded(args.bootstrap, start_embedded=True))
    ns = Namespace(f"quickstart-{uuid.uuid4().hex[:8]}")
    data_topics = {f"{ns.name}.orders": 4, f"{ns.name}.enriched": 4}
    create(settings, ns, 4, data_topics)
    tail = OutcomeTail(settings, ns)
    try:
        result = summary(tail, run(settings, ns, args.records, tail))
    finally:
        tail.close()
        if not args.keep:
            delete(settings, layout(ns, 4, data_topics))
    print(orjson.dumps(result).decode())
    return 0 if result["lost"] == 0 and result["completed"] + result["dlq"] == args.records else 1


if __name__ == "__main__":
    sys.exit(main())
