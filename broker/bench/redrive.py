"""A governed redrive: ``replaybroker dlq redrive --rate R`` of many dead letters while live
traffic flows, against the same live traffic without it.

One app (source -> ``store``, every role on threads of this process) on a fresh namespace:

1. ``dead`` records that the task rejects (a bug) are dead-lettered;
2. the bug is fixed; live orders flow at ``live_rate`` a second for ``window_s``: the baseline
   of their latency (send -> the task wrote it, on one clock);
3. the same live traffic while ``replaybroker dlq redrive --rate R`` runs as its own process
   and sends the dead letters again through their replay topic: the live latency meanwhile,
   and the redrive's achieved rate - from the task's own writes of the redriven records (first
   to last), and as the redrive reports it.

Every redriven record must be written once (ground truth: the task's writes), or the run fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import numpy as np

from broker.app import App
from broker.serde import JsonSerde
from broker.task import TaskContext, TaskRecord

WARM_UP_S = 3.0  # live traffic before the baseline window: the first sends open connections


class _Store:
    """What the task wrote: live latencies by phase, redriven ids with when."""

    def __init__(self) -> None:
        self.fixed = threading.Event()
        # wall clock: a live record sent before baseline_began is a warm-up, after redrive_began
        # "during", after redrive_ended neither
        self.baseline_began = self.redrive_began = self.redrive_ended = float("inf")
        self.latency: dict[str, list[float]] = {"baseline": [], "redrive": []}
        self.redriven: dict[int, float] = {}
        self._lock = threading.Lock()

    def write(self, order: dict[str, Any]) -> None:
        now = time.time()
        with self._lock:
            if "sent" in order:
                sent = order["sent"]
                if self.baseline_began <= sent < self.redrive_began:
                    self.latency["baseline"].append(now - sent)
                elif self.redrive_began <= sent < self.redrive_ended:
                    self.latency["redrive"].append(now - sent)
            else:
                self.redriven.setdefault(order["id"], now)


def _app(store: _Store) -> App:
    app = App(f"bench-redrive-{uuid.uuid4().hex[:8]}", serde=JsonSerde())
    orders = app.topic("orders", partitions=4)
    app.acker()

    @app.task("store", orders)
    def handle(record: TaskRecord, ctx: TaskContext) -> None:
        order = record.decoded()
        if "sent" not in order and not store.fixed.is_set():
            ctx.reject("a bug, fixed later")
            return
        store.write(order)

    return app


class _Live(threading.Thread):
    """Live orders at ``rate`` a second from one source, until ``stop``."""

    def __init__(self, app: App, rate: float) -> None:
        super().__init__(name="bench-redrive-live", daemon=True)
        self.app, self.rate, self.stop = app, rate, threading.Event()
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            topic = self.app.topics[f"{self.app.ns.name}.orders"]
            began, i = time.monotonic(), 0
            with self.app.source() as source:
                while not self.stop.is_set():
                    ahead = began + i / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                    source.send(topic, f"live-{i % 101}", {"id": i, "sent": time.time()})
                    i += 1
        except Exception as exc:  # noqa: BLE001 - reported by the measurement
            self.error = exc


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench redrive: {what} not done in {timeout_s:.0f} s")
        time.sleep(0.2)


def _p99_ms(values: list[float]) -> float:
    return round(float(np.percentile(values, 99)) * 1000, 1) if values else -1.0


def measure_redrive(bootstrap: str, *, dead: int = 10_000, rate: float = 500.0, live_rate: float = 200.0,
                    window_s: float = 15.0) -> dict[str, Any]:
    """The figures of one run (see the module's docstring); ``dead`` records at ``--rate rate``."""
    import os

    from broker.completions import OutcomeTail
    from broker.dev.examples import drop_namespace

    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    store = _Store()
    app = _app(store)
    app.setup()
    tail = OutcomeTail(app.settings, app.ns)
    try:
        with app.run_in_background():
            with app.source() as source:
                topic = app.topics[f"{app.ns.name}.orders"]
                source.send_many(topic, [(f"old-{i % 101}", {"id": i}) for i in range(dead)])

            def all_dead() -> bool:
                tail.poll(0.2)
                return len(tail.log.dlq_origins()) >= dead

            _wait(all_dead, 120 + dead / 100, "dead-lettering")
            store.fixed.set()
            live = _Live(app, live_rate)
            time.sleep(WARM_UP_S)
            store.baseline_began = time.time()
            time.sleep(window_s)
            store.redrive_began = time.time()
            began = time.monotonic()
            command = [sys.executable, "-m", "broker", "dlq", "redrive", "--bootstrap", bootstrap,
                       "--namespace", app.ns.name, "--rate", str(rate), "--json"]
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                # files, not pipes: its JSON lists every record redriven, more than a pipe holds
                returncode = subprocess.run(command, stdout=out, stderr=err, text=True, check=False).returncode
                store.redrive_ended = time.time()
                out.seek(0)
                err.seek(0)
                if returncode != 0:
                    raise RuntimeError(f"dlq redrive exited {returncode}: {err.read()[-2000:]}")
                reported = json.load(out)
            time.sleep(2.0)  # the redrive's tail still in the pipeline, under live traffic
            live.stop.set()
            live.join()
            if live.error is not None:
                raise live.error
            _wait(lambda: len(store.redriven) >= dead, 120, "the redriven records' writes")
        written = sorted(store.redriven.values())
        span = written[-1] - written[0] if len(written) > 1 else float("nan")
        return {
            "redrive.dead_letters": dead,
            "redrive.rate_asked": rate,
            "redrive.rate_written": round((len(written) - 1) / span, 1),
            "redrive.rate_reported": round(reported["redriven"] / max(reported["seconds"], 1e-9), 1),
            "redrive.seconds": round(time.monotonic() - began, 1),
            "redrive.live_rate": live_rate,
            "redrive.live_p99_ms_baseline": _p99_ms(store.latency["baseline"]),
            "redrive.live_p99_ms_during": _p99_ms(store.latency["redrive"]),
            "redrive.live_p50_ms_baseline": round(float(np.median(store.latency["baseline"])) * 1000, 1),
            "redrive.live_p50_ms_during": round(float(np.median(store.latency["redrive"])) * 1000, 1),
        }
    finally:
        tail.close()
        drop_namespace(app.settings, app.ns, app.ledger_partitions, app.topics)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--dead", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--live-rate", type=float, default=200.0)
    parser.add_argument("--window-s", type=float, default=15.0)
    args = parser.parse_args(argv)
    figures = measure_redrive(args.bootstrap, dead=args.dead, rate=args.rate, live_rate=args.live_rate,
                              window_s=args.window_s)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
