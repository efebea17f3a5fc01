"""Failure policy: a dependency that is down for a while, and malformed orders.

    python examples/failure_policy.py [--no-policy] [--records 4000] [--rate 100] [--down 12:32]
                                      [--flaky-every 500] [--bootstrap HOST:PORT] [--keep] [-v]

An enrich step - the pipeline's last hop - looks each order's customer up in a service that is
down from 12 s to 32 s after the first order while orders arrive at 100/s (timeout 10 s, 6
attempts). 1 % of the orders are malformed (no amount: a ``ValueError`` every time) and 0.2 %
fail their first three attempts (a flaky lookup), to show the back-off between attempts.

With the policy (the default): the source's back-off (``DEFAULT_RETRY``), the service's
``ConnectionError`` an outage (the task pauses and tries the same order again, no attempt
spent), a malformed order rejected on its first attempt. ``--no-policy``: every failure
replayed at once, every error a failure, as a pipeline without the policy does. The last line
on stdout is a JSON summary from ground truth - the persist topic's tombstones, what the hop
wrote and the calls the service saw - and the exit code is 0 only when no record is lost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import orjson

from broker import App, JsonSerde, TaskContext, TaskRecord
from broker.retry import DEFAULT_RETRY

MALFORMED_EVERY = 100  # order ids 0, 100, 200, ...: no amount
FLAKY_EVERY = 500  # order ids 7, 507, ... (``--flaky-every``): their lookup fails on attempts 1 to 3
FLAKY_FAILURES = 3


class CustomerService:
    """The dependency: down from ``down[0]`` to ``down[1]`` s after ``start()``; counts the calls
    it refused."""

    def __init__(self, down: tuple[float, float]) -> None:
        self.down = down
        self.began = time.monotonic()
        self.refused = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        self.began = time.monotonic()

    def lookup(self, customer: bytes | None) -> dict[str, str]:
        with self._lock:
            if self.down[0] <= time.monotonic() - self.began < self.down[1]:
                self.refused += 1
                raise ConnectionError("customer service unreachable")
        return {"customer": (customer or b"").decode(), "region": "eu"}


class Observed:
    """What the hop saw and wrote: the outside world's ground truth."""

    def __init__(self) -> None:
        self.written: set[int] = set()
        self.attempts: dict[int, list[tuple[int, float]]] = {}  # order id -> (attempt, when)
        self._lock = threading.Lock()

    def saw(self, order_id: int, record: TaskRecord) -> int:
        """Note this attempt of the order; its number."""
        attempt = record.tracking.attempt if record.tracking else 1
        with self._lock:
            self.attempts.setdefault(order_id, []).append((attempt, time.monotonic()))
        return attempt


def build(service: CustomerService, observed: Observed, *, policy: bool, flaky_every: int = FLAKY_EVERY) -> App:
    app = App(f"failure-policy-{uuid.uuid4().hex[:8]}", serde=JsonSerde())
    orders = app.topic("orders", partitions=4)
    app.acker()
    # --8<-- [start:policy]
    options: dict[str, Any] = {
        "outage": (ConnectionError,),  # the service is down: pause, retry in place, no attempt spent
        "outage_max_ms": 120_000,  # ... for at most 2 minutes, then fail the input as any failure
        "fatal": (ValueError,),  # a malformed order fails every time: dead-lettered at once
    } if policy else {}

    @app.task("enrich", orders, **options)
    def enrich(record: TaskRecord, ctx: TaskContext) -> None:
        order = record.decoded()
        attempt = observed.saw(order["id"], record)  # for the summary
        if "amount" not in order:
            raise ValueError("malformed order: no amount")  # fatal: dead-lettered at once
        if order["id"] % flaky_every == 7 and attempt <= FLAKY_FAILURES:  # a flaky lookup
            ctx.fail("lookup returned garbage")  # replayed after its back-off
            return
        service.lookup(record.key)  # ConnectionError while it is down: an outage
        observed.written.add(order["id"])  # the last hop writes to the outside world
    # --8<-- [end:policy]
    return app


def send(app: App, records: int, rate: float, *, policy: bool) -> dict[int, int]:
    """Order id -> origin, ``rate`` orders a second."""
    sent: dict[int, int] = {}
    began = time.monotonic()
    with app.source(max_attempts=6, timeout_ms=10_000, retry=DEFAULT_RETRY if policy else None) as source:
        for i in range(records):
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            order = {"id": i} if i % MALFORMED_EVERY == 0 else {"id": i, "amount": i % 500}
            sent[i] = source.send(app.topics[f"{app.ns.name}.orders"], f"customer-{i % 97}", order).origin
    return sent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", metavar="HOST:PORT")
    parser.add_argument("--no-policy", action="store_true", help="replay at once, every error a failure")
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=100.0, help="orders a second (default: 100)")
    parser.add_argument("--down", default="12:32", help="the service is down FROM:TO s after the first order")
    parser.add_argument("--flaky-every", type=int, default=FLAKY_EVERY, help="order ids 7 mod N fail 3 times")
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics afterwards")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def flaky_gaps(observed: Observed, flaky_every: int) -> list[list[float]]:
    """The gaps (s) between attempt n and n+1 of each flaky order, n = 1, 2, 3 (as far as seen)."""
    out = []
    for order_id, seen in sorted(observed.attempts.items()):
        if order_id % flaky_every != 7:
            continue
        first: dict[int, float] = {}
        for attempt, when in seen:
            first.setdefault(attempt, when)
        out.append([round(first[n + 1] - first[n], 3) for n in range(1, FLAKY_FAILURES + 1)
                    if n in first and n + 1 in first])
    return out


def gaps(observed: Observed, flaky_every: int = FLAKY_EVERY) -> list[float]:
    """The median gap (s) between attempt n and n+1 of the flaky orders, n = 1, 2, 3."""
    by_step: list[list[float]] = [[] for _ in range(FLAKY_FAILURES)]
    for order_id, seen in observed.attempts.items():
        if order_id % flaky_every != 7:
            continue
        first: dict[int, float] = {}
        for attempt, when in seen:
            first.setdefault(attempt, when)
        for n in range(1, FLAKY_FAILURES + 1):
            if n in first and n + 1 in first:
                by_step[n - 1].append(first[n + 1] - first[n])
    return [round(statistics.median(step), 3) if step else -1.0 for step in by_step]


def main(argv: list[str] | None = None) -> int:
    import logging

    from broker.completions import OutcomeTail
    from broker.dev.examples import drop_namespace, wait_for_outcomes
    from broker.dev.kafka_local import demo_cluster

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR, stream=sys.stderr)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = demo_cluster(args.bootstrap)[0]
    down_from, down_to = (float(x) for x in args.down.split(":"))
    service, observed = CustomerService((down_from, down_to)), Observed()
    policy = not args.no_policy
    app = build(service, observed, policy=policy, flaky_every=args.flaky_every)
    app.setup()
    tail = OutcomeTail(app.settings, app.ns)
    try:
        with app.run_in_background():
            service.start()
            sent = send(app, args.records, args.rate, policy=policy)
            wait_for_outcomes(tail, sent.values(), timeout_s=600)
            drained = time.monotonic() - service.began - down_to
        tail.poll(1.0)
        name_of = {origin: i for i, origin in sent.items()}
        completed = {name_of[o] for o in tail.log.completed_origins() if o in name_of} & observed.written
        dlq = {name_of[o] for o in tail.log.dlq_origins() if o in name_of}
        malformed = {i for i in sent if i % MALFORMED_EVERY == 0}
        summary = {
            "policy": policy, "records": len(sent), "completed": len(completed),
            "dlq_valid": len(dlq - malformed), "dlq_malformed": len(dlq & malformed),
            "lost": len(sent) - len(completed | dlq), "calls_while_down": service.refused,
            "replays": tail.log.replays(name_of),
            "malformed_attempts_max": max((a for i in malformed for a, _ in observed.attempts.get(i, [])), default=0),
            "drain_s_after_outage": round(drained, 1), "flaky_gaps_s": gaps(observed, args.flaky_every),
            "flaky_gaps_each_s": flaky_gaps(observed, args.flaky_every),
        }
        print(orjson.dumps(summary).decode())
        return 0 if summary["lost"] == 0 else 1
    finally:
        tail.close()
        if not args.keep:
            drop_namespace(app.settings, app.ns, app.ledger_partitions, app.topics)


if __name__ == "__main__":
    sys.exit(main())
