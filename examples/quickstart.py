"""Quickstart: source -> enrich -> leaf, with the acker in this process.

    python examples/quickstart.py [--bootstrap HOST:PORT] [--records 1000] [--keep] [-v]

Without ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``) it uses the embedded Kafka, started if
none runs (``replaybroker kafka down`` stops it). Every 100th order fails on its first attempt
(replayed) and every 250th always fails (dead-lettered after 3 attempts). The last line on
stdout is a JSON summary from ground truth - the persist topic's tombstones and what the leaf
wrote - and the exit code is 0 only when no record is lost.
"""

from __future__ import annotations  # noqa: I001 - the README shows the block below the marker

import sys

from broker.completions import OutcomeTail
from broker.dev.examples import namespace, parse_args, report, wait_for_outcomes

# --8<-- [start:quickstart]
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


def run(settings: KafkaSettings, ns: Namespace, records: int, tail: OutcomeTail) -> int:
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
    return report(tail, sent, set(written))
# --8<-- [end:quickstart]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    with namespace(args, "quickstart", {"orders": 4, "enriched": 4}) as (settings, ns, tail):
        return run(settings, ns, args.records, tail)


if __name__ == "__main__":
    sys.exit(main())
