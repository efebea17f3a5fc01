"""The console's SQLite index of ns.dlq: filters, keyset pages newest first, positions kept
with the entries, the plan of a redrive and its binding (broker.console.index, .runs)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from broker.console.index import Filter, Index, Selection
from broker.console.runs import Redrives, Run, parse_rate, started, where_of
from broker.dlq import Marker
from broker.errors import ConfigurationError
from broker.settings import KafkaSettings
from tests.unit.console_data import BASE_MS, quarantined, record


@pytest.fixture(params=[2000, 0], ids=["by-filter-index", "by-time"])
def index(request: pytest.FixtureRequest) -> Index:
    """Both plans of a page: from the filter's index, and along the time index."""
    idx = Index(":memory:", walk=request.param)
    entries = [record(i, partition=i % 2, topic="ns.orders" if i % 3 else "ns.payments",
                      reason="handler: timeout" if i % 4 == 0 else "handler: cannot parse",
                      headers=(("tenant", b"acme" if i % 5 == 0 else b"other"),)) for i in range(40)]
    idx.add(entries, positions=[("ns.dlq", 0, 40), ("ns.dlq", 1, 40)])
    idx.add([quarantined(100), quarantined(101)])
    return idx


def all_pages(index: Index, f: Filter, size: int = 7) -> list[int]:
    offsets, cursor = [], None
    while True:
        page = index.page(f, cursor=cursor, size=size)
        offsets += [r.off for r in page.rows]
        cursor = page.next_cursor
        if cursor is None:
            return offsets


def test_pages_are_newest_first_and_cover_every_record_once(index: Index) -> None:
    assert all_pages(index, Filter()) == list(range(39, -1, -1))
    page = index.page(Filter(), size=5)
    assert page.total == 40 and page.quarantined == 2 and len(page.rows) == 5


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        (Filter(topic="ns.payments"), [i for i in range(40) if i % 3 == 0]),
        (Filter(key=b"k7"), [7]),
        (Filter(reason_prefix="handler: time"), [i for i in range(40) if i % 4 == 0]),
        (Filter(reason_prefix="handler:"), list(range(40))),
        (Filter(reason_prefix="nothing"), []),
        (Filter(since_ms=BASE_MS + 10_000, until_ms=BASE_MS + 20_000), list(range(10, 20))),
        (Filter(header_name="tenant", header_value=b"acme"), [i for i in range(40) if i % 5 == 0]),
        (Filter(header_name="tenant"), list(range(40))),
        (Filter(header_name="missing"), []),
        (Filter(topic="ns.orders", header_name="tenant", header_value=b"acme"),
         [i for i in range(40) if i % 5 == 0 and i % 3]),
    ],
)
def test_filters(index: Index, f: Filter, expected: list[int]) -> None:
    assert sorted(all_pages(index, f)) == expected
    assert index.page(f).total == len(expected)


def test_quarantined_inputs_are_listed_apart(index: Index) -> None:
    page = index.page(Filter(), kind="quarantine")
    assert [r.off for r in page.rows] == [101, 100]
    assert all(r.kind == "quarantine" for r in page.rows)
    keys, _, _, _ = index.plan(Filter())
    assert len(keys) == 40  # never in a plan


def test_positions_are_kept_with_the_entries_and_a_file_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "i.sqlite"
    idx = Index(path)
    idx.add([record(0), record(1)], positions=[("ns.dlq", 0, 2)])
    idx.close()
    again = Index(path)
    assert again.positions("ns.dlq") == {0: 2}
    assert again.count() == 2
    again.add([record(1)], positions=[("ns.dlq", 0, 2)])  # read again after a crash: no duplicate
    assert again.count() == 2


def test_values_are_capped_but_their_size_kept() -> None:
    idx = Index(":memory:")
    idx.add([record(0, value=b"x" * 100_000)])
    row = idx.get(0, 0)
    assert row is not None and row.value_size == 100_000 and row.value is not None and row.value_cut
    assert len(row.value) < 100_000


def test_markers_exclude_what_was_redriven_from_a_plan(index: Index) -> None:
    redriven = record(7, partition=1)
    index.add([], markers=[(redriven.marker_key, Marker(redriven.origin, 42, "ns.dlq 1@7", BASE_MS))])
    keys, per_topic, sample, _ = index.plan(Filter())
    assert len(keys) == 39 and redriven.marker_key not in keys
    assert sum(per_topic.values()) == 39 and per_topic["ns.payments"] == len([i for i in range(40) if i % 3 == 0])
    row = index.get(1, 7)
    assert row is not None and row.redriven == {"new_srid": 42, "at_ms": BASE_MS}
    assert all(r.redriven is None for r in sample)
    index.add([], markers=[(redriven.marker_key, None)])  # a tombstone: forgotten
    assert len(index.plan(Filter())[0]) == 40


def test_a_confirm_is_bound_to_its_plan(index: Index) -> None:
    redrives = Redrives(KafkaSettings("127.0.0.1:1"), "ns", index)
    plan = redrives.plan(Filter(topic="ns.payments"), "operator:x")
    assert plan.count == len([i for i in range(40) if i % 3 == 0])
    assert redrives.bound_plan(plan.id, plan.digest) is plan
    with pytest.raises(ConfigurationError, match="does not match"):
        redrives.bound_plan(plan.id, "0" * 32)
    other = redrives.plan(Filter(), "operator:x")
    with pytest.raises(ConfigurationError, match="does not match"):
        redrives.bound_plan(plan.id, other.digest)
    with pytest.raises(ConfigurationError, match="unknown or expired"):
        redrives.bound_plan("nope", plan.digest)


def test_the_redrive_filter_matches_the_console_filter() -> None:
    f = Filter(topic="ns.orders", key=b"k1", reason_prefix="handler:", since_ms=1, until_ms=2)
    w = where_of(f)
    assert (w.topics, w.keys, w.reason_prefix, w.since_ms, w.until_ms) == (["ns.orders"], [b"k1"], "handler:", 1, 2)
    assert where_of(Filter()).as_json() == {}


@pytest.mark.parametrize("text", ["0", "-1", "abc", "1e9", "nan"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_rate(text)


def test_rates() -> None:
    assert parse_rate("") is None and parse_rate(None) is None and parse_rate("2.5") == 2.5


def test_redrive_runs_are_indexed_newest_first() -> None:
    idx = Index(":memory:")
    idx.add([], runs=[(b"run:0000000000002:b", {"redriven": 2}), (b"run:0000000000001:a", {"redriven": 1})])
    assert [r["redriven"] for r in idx.runs()[0]] == [2, 1]


def test_a_filter_and_a_selection_survive_their_record() -> None:
    f = Filter(topic="ns.orders", key=b"\xff\x00not utf-8", reason_prefix="handler:", since_ms=1, until_ms=2,
               header_name="tenant", header_value=b"\xfe")
    assert Filter.from_record(orjson.loads(orjson.dumps(f.to_record()))) == f
    s = Selection(f, {0: 12, 3: 7}, BASE_MS)
    assert Selection.from_record(orjson.loads(orjson.dumps(s.to_record()))) == s
    assert Filter.from_record(Filter().to_record()) == Filter()


def test_a_selection_takes_the_plans_records_again_and_none_dead_lettered_after_it(index: Index) -> None:
    keys, _, _, selection = index.plan(Filter(topic="ns.payments"))
    later = [record(200 + i, partition=i % 2, topic="ns.payments") for i in range(4)]  # after the plan
    index.add(later, positions=[("ns.dlq", 0, 204), ("ns.dlq", 1, 204)])
    assert len(index.plan(Filter(topic="ns.payments"))[0]) == len(keys) + 4
    redriven = keys[:3]
    index.add([], markers=[(k, Marker(1, 99, "ns.dlq", selection.at_ms + 5)) for k in redriven])
    taken = index.selected(selection)
    assert [k for k, _, _ in taken] == list(keys)  # the same records, in the same order
    assert [k for k, _, done in taken if done] == redriven
    assert not {r.marker_key for r in later} & {k for k, _, _ in taken}


def record_start(index: Index, redrives: Redrives, f: Filter, run_id: str, at_ms: int) -> Run:
    """A run's start as the console audits it (broker.console.runs.started)."""
    plan = redrives.plan(f, "operator:x")
    run = Run(run_id, plan, 2.0, "operator:x", at_ms / 1000, state="running")
    event = {"at_ms": at_ms, "who": "operator:x", "action": "redrive start", "what": started(plan, run), "result": "ok"}
    index.add([], audits=[(0, at_ms, orjson.loads(orjson.dumps(event)))])
    return run


def test_a_console_started_again_restores_its_runs(index: Index) -> None:
    before = Redrives(KafkaSettings("127.0.0.1:1"), "ns", index)
    cancelled = record_start(index, before, Filter(topic="ns.payments"), "run-c", BASE_MS + 1)
    interrupted = record_start(index, before, Filter(topic="ns.orders", reason_prefix="handler: timeout"),
                               "run-i", BASE_MS + 2)
    complete = record_start(index, before, Filter(key=record(1).key), "run-d", BASE_MS + 3)
    index.add([], audits=[(0, BASE_MS + 9, {"at_ms": BASE_MS + 9, "who": "operator:y", "action": "redrive resume",
                                             "what": {"run": "run-i"}, "result": "ok"}),
                          (0, BASE_MS + 10, {"at_ms": BASE_MS + 10, "who": "operator:z", "action": "redrive start",
                                              "what": {"plan": "p"}, "result": "refused: busy"})])
    now = int(time.time() * 1000) + 5
    marks = [*cancelled.plan.keys[:2], *interrupted.plan.keys[:1], *complete.plan.keys]
    index.add([], markers=[(k, Marker(1, 99, "ns.dlq", now)) for k in marks],
              runs=[(b"run:%013d:a" % now, {"state": "cancelled", "redriven": 2, "console_run": "run-c"}),
                    (b"run:%013d:b" % now, {"state": "completed", "redriven": 1, "console_run": "run-d"}),
                    (b"run:%013d:c" % now, {"state": "completed", "redriven": 5})])
    index.add([record(300, topic="ns.payments")], positions=[("ns.dlq", 0, 301)])  # after the plans

    again = Redrives(KafkaSettings("127.0.0.1:1"), "ns", index)
    assert again.restore() == 3 and again.restore() == 0
    runs = {r.id: r for r in again.page(0, 10)[0]}
    assert [r.id for r in again.page(0, 10)[0]] == ["run-d", "run-i", "run-c"]  # newest first
    c, i, d = runs["run-c"], runs["run-i"], runs["run-d"]
    assert (c.state, c.done, c.total, c.plan.keys) == ("cancelled", 2, cancelled.total, cancelled.plan.keys)
    assert (i.state, i.done, i.total, i.by, i.rate_per_s) == ("interrupted", 1, interrupted.total, "operator:y", 2.0)
    assert (d.state, d.done, d.total) == ("completed", 1, 1)
    assert [p["redriven"] for p in c.records] == [2]
    assert not c.active and not i.active


def test_the_audit_log_and_the_runs_are_paged_newest_first() -> None:
    idx = Index(":memory:")
    idx.add([], audits=[(i % 2, i, {"at_ms": BASE_MS + i // 3, "action": f"a{i}"}) for i in range(250)])
    seen, cursor, total = [], None, 0
    while True:
        events, total, cursor = idx.audit(cursor, size=40)
        seen += [e["action"] for e in events]
        if cursor is None:
            break
    assert total == 250 and sorted(seen) == sorted(f"a{i}" for i in range(250)) and len(seen) == 250
    assert seen[0] == "a249" and seen[-1] == "a0"
    idx.add([], runs=[(b"run:%013d:x" % i, {"n": i}) for i in range(45)])
    got, cursor = [], None
    while True:
        page, cursor = idx.runs(cursor, size=20)
        got += [r["n"] for r in page]
        if cursor is None:
            break
    assert got == list(range(44, -1, -1))
