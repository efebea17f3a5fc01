"""Quickstart: source -> enrich -> leaf, every role in this process.

    python examples/quickstart.py [--bootstrap HOST:PORT] [--records 1000] [--keep] [-v]

Without ``--bootstrap`` (or ``KAFKA_BOOTSTRAP_SERVERS``) it uses the embedded Kafka, started if
none runs (``replaybroker kafka down`` stops it). Every 100th order fails on its first attempt
(replayed) and every 250th always fails (dead-lettered after 3 attempts). The last line on
stdout is a JSON summary from ground truth - the persist topic's tombstones and what the leaf
wrote - and the exit code is 0 only when no record is lost. The same app runs one role per
process too: ``replaybroker run examples.quickstart:app --role task:enrich`` (and
``task:leaf``, ``acker``).
"""

from __future__ import annotations

import os
import sys

# --8<-- [start:quickstart]
from broker import App, JsonSerde, TaskContext, TaskRecord

app = App("quickstart", serde=JsonSerde())  # Kafka: $KAFKA_BOOTSTRAP_SERVERS (or bootstrap=...)
orders = app.topic("orders", partitions=4)  # "quickstart.orders", and its replay topic
enriched = app.topic("enriched", partitions=4)
app.acker()
written: dict[int, dict] = {}  # the outside world: what the leaf wrote, by order id


@app.task("enrich", orders)  # reads orders and orders.replay
def enrich(record: TaskRecord, ctx: TaskContext) -> None:
    order = record.decoded()  # the value through the app's serde (JSON here)
    if order["id"] % 250 == 0:
        ctx.fail("no such customer")  # replayed; dead-lettered after max_attempts
        return
    if order["id"] % 100 == 0 and record.tracking and record.tracking.attempt == 1:
        raise TimeoutError("the lookup timed out")  # an exception fails the input too
    ctx.emit(enriched, record.key, {**order, "region": "eu"})  # a tracked child: leaf acks it


@app.task("leaf", enriched)
def leaf(record: TaskRecord, ctx: TaskContext) -> None:
    order = record.decoded()
    written[order["id"]] = order  # the last hop writes to the outside world; returning acks


def send_orders(records: int) -> dict[int, int]:
    """Order id -> origin (the srid of its first attempt), for each order sent."""
    with app.source(max_attempts=3) as source:  # leaving the block flushes
        return {i: source.send(orders, f"customer-{i % 97}", {"id": i, "amount": i % 500}).origin
                for i in range(records)}
# --8<-- [end:quickstart]


def main(argv: list[str] | None = None) -> int:
    from broker.completions import OutcomeTail
    from broker.dev.examples import drop_namespace, parse_args, report, wait_for_outcomes
    from broker.dev.kafka_local import demo_cluster

    args = parse_args(__doc__, argv)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = demo_cluster(args.bootstrap)[0]
    app.setup()
    tail = OutcomeTail(app.settings, app.ns)
    try:
        with app.run_in_background():  # every role on threads of this process
            sent = send_orders(args.records)
            wait_for_outcomes(tail, sent.values())  # a completion or a dead letter for every order
        return report(tail, sent, set(written))
    finally:
        tail.close()
        if not args.keep:
            drop_namespace(app.settings, app.ns, app.ledger_partitions, app.topics)


if __name__ == "__main__":
    sys.exit(main())
