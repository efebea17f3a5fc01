"""The pipeline of docker/compose.yaml, an ``App``: numbered orders and one task.

- ``replaybroker run demo_pipeline:app --role task:enrich`` writes each order, enriched, to
  the sink topic ``<namespace>.orders-enriched`` and acks it; ``--role acker`` is the acker;
- ``--role console`` is the operator's console on ``CONSOLE_PORT`` (8080);
- ``python demo_pipeline.py --records N --rate R`` is the source: N orders (``{"n": i}``,
  keyed by customer) to ``<namespace>.orders``, R a second, until all are persisted.

What differs between the containers of one role comes from the environment: ``NAMESPACE``
(default ``demo``), ``INSTANCE_ID`` and ``STANDBY`` (an acker's), ``METRICS_PORT``; the
connection from ``KAFKA_BOOTSTRAP_SERVERS`` and the other ``KAFKA_*`` settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from broker import App, TaskContext, TaskRecord

app = App(os.environ.get("NAMESPACE", "demo"))
orders = app.topic("orders", partitions=4)
enriched = app.topic("orders-enriched", partitions=4)  # the sink: nothing reads it
metrics_port = int(os.environ["METRICS_PORT"]) if os.environ.get("METRICS_PORT") else None
app.acker(instance_id=os.environ.get("INSTANCE_ID", ""), standby=os.environ.get("STANDBY") == "1",
          metrics_port=metrics_port)
# The operator's console (tokens from $REPLAYBROKER_CONSOLE_TOKENS; without them loopback only).
app.console(port=int(os.environ.get("CONSOLE_PORT", "8080")), bind=os.environ.get("CONSOLE_BIND", "127.0.0.1"))


@app.task("enrich", orders, metrics_port=metrics_port)
def enrich(record: TaskRecord, ctx: TaskContext) -> None:
    if record.value is None:
        ctx.fail("empty order")
        return
    ctx.output(enriched, record.key, record.value[:-1] + b', "region": "eu"}')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="records a second")
    args = parser.parse_args(argv)
    with app.source() as source:
        started = time.monotonic()
        for n in range(args.records):
            source.send(orders, f"customer-{n % 100}", b'{"n": %d}' % n)
            ahead = started + (n + 1) / args.rate - time.monotonic()
            if ahead > 0:
                source.flush()
                time.sleep(ahead)
        source.flush()
    print(f"sent {args.records} records to {orders} in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
