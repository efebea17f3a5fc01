"""The pipeline of docker/compose.yaml: a source of numbered orders and one task.

- ``python demo_pipeline.py --namespace NS --records N --rate R`` sends N orders
  (``{"n": i}``, keyed by customer) to ``orders``, R a second, and exits once all are persisted;
- ``replaybroker task --handler demo_pipeline:enrich --topics orders ...`` writes each order,
  enriched, to the sink topic ``orders-enriched`` and acks it.

The connection comes from ``KAFKA_BOOTSTRAP_SERVERS`` and the other ``KAFKA_*`` settings.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from broker.settings import KafkaSettings
from broker.source import Source

DATA_TOPIC = "orders"
SINK_TOPIC = "orders-enriched"


def enrich(record: Any, ctx: Any) -> None:
    if record.value is None:
        ctx.fail("empty order")
        return
    ctx.output(SINK_TOPIC, record.key, record.value[:-1] + b', "region": "eu"}')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="records a second")
    args = parser.parse_args(argv)
    with Source(KafkaSettings.from_env(), args.namespace) as source:
        started = time.monotonic()
        for n in range(args.records):
            source.send(DATA_TOPIC, f"customer-{n % 100}", b'{"n": %d}' % n)
            ahead = started + (n + 1) / args.rate - time.monotonic()
            if ahead > 0:
                source.flush()
                time.sleep(ahead)
        source.flush()
    print(f"sent {args.records} records to {DATA_TOPIC} in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
