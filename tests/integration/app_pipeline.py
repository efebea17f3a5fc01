"""An app for tests/integration/test_app.py, as a user's module: ``replaybroker run
tests.integration.app_pipeline:app --role ROLE`` runs one of its roles per process. Its
namespace comes from ``APP_TEST_NAMESPACE``; the leaf appends what it writes to the file
``APP_TEST_WRITTEN`` (the outside world)."""

from __future__ import annotations

import os

from broker import App, BytesSerde, JsonSerde, TaskContext, TaskRecord

app = App(os.environ.get("APP_TEST_NAMESPACE", "apptest"), serde=JsonSerde(), ledger_partitions=3)
orders = app.topic("orders", partitions=3)
raw = app.topic("raw", partitions=2, serde=BytesSerde())  # text: a serde of its own
enriched = app.topic("enriched", partitions=2)
app.acker(commit_interval_ms=50)


@app.task("enrich", orders, poll_timeout_ms=50)
def enrich(record: TaskRecord, ctx: TaskContext) -> None:
    order = record.decoded()
    if order["id"] % 50 == 7:
        ctx.fail("always fails")  # dead-lettered after max_attempts
        return
    ctx.emit(enriched, record.key, {**order, "enriched": True})


@app.task("parse", raw)
def parse(record: TaskRecord, ctx: TaskContext) -> None:
    text = record.decoded()  # bytes, through raw's own serde
    ctx.emit(enriched, record.key, {"id": int(text), "enriched": True})  # JSON: enriched's


@app.task("leaf", enriched)
def leaf(record: TaskRecord, ctx: TaskContext) -> None:
    order = record.decoded()
    assert order["enriched"]
    with open(os.environ.get("APP_TEST_WRITTEN", os.devnull), "a") as out:
        out.write(f"{order['id']}\n")
