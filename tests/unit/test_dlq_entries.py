"""DLQ entries decoded from what the acker writes, and the pure redrive selection."""

from __future__ import annotations

from typing import Any

import pytest

from broker import ids
from broker.acker.replay import Outgoing, dlq_record, quarantine_record
from broker.dlq import (
    QUARANTINE,
    RECORD,
    UNKNOWN,
    DlqEntry,
    Marker,
    RedriveFilter,
    entry_json,
    format_entry,
    plan_redrive,
)
from broker.schemas import Failure, PersistedRecord
from broker.topics import Namespace
from broker.trace import parse_id

NS = Namespace("unit")
ORIGIN = -0x1F3A_5C7E_9B2D_4E61


class Msg:
    def __init__(self, out: Outgoing, offset: int, timestamp_ms: int = 1_700_000_000_000) -> None:
        self.out, self._offset, self._ts = out, offset, timestamp_ms

    def partition(self) -> int:
        return self.out.partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)

    def key(self) -> bytes | None:
        return self.out.key

    def value(self) -> bytes | None:
        return self.out.value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self.out.headers)


def dead(origin: int = ORIGIN, reason: str = "failed", attempts: int = 3, headers: Any = ()) -> Outgoing:
    srids = [origin, origin ^ 0x100, origin ^ 0x200]  # one srid per attempt
    record = PersistedRecord(
        srid=srids[attempts - 1], origin=origin, attempt=attempts, root_xor=5, record_id=5,
        topic="orders", key_hash_partition=4, partitioner="spark", key=b"k\xff", value=b"v" * 300,
        created_ms=1, headers=tuple(headers), max_attempts=attempts,
    )
    history = [Failure(srids[i], i + 1, reason, 1_000 + i) for i in range(attempts)]
    return dlq_record(NS, record, history, reason)


def test_a_dead_lettered_record_decodes_with_everything_redrive_needs() -> None:
    entry = DlqEntry.from_message(Msg(dead(headers=[("trace", b"abc"), ("rb-reason", b"user's own")]), 7))
    assert entry.kind == RECORD
    assert (entry.origin, entry.attempts, entry.topic, entry.key_hash_partition, entry.partitioner) == (
        ORIGIN, 3, "orders", 4, "spark",
    )
    assert entry.reason == "failed" and entry.where == "0@7"
    assert [(f.attempt, f.reason) for f in entry.history] == [(1, "failed"), (2, "failed"), (3, "failed")]
    # the user's headers survive, even one that shares a name with the acker's
    assert entry.headers == (("trace", b"abc"), ("rb-reason", b"user's own"))
    assert entry.marker_key == ids.encode_id(entry.history[-1].srid)
    shown = entry_json(entry)
    assert shown["origin"] == ORIGIN and shown["key"] == "0x6bff" and shown["value_bytes"] == 300
    assert shown["value"].endswith("…") and len(shown["value"]) == 200
    assert shown["history"][0]["at"] == "1970-01-01T00:00:01.000Z" and shown["redriven"] is None
    assert f"origin {ORIGIN}  attempts 3  topic orders  key-hash partition 4 (spark)" in format_entry(entry)


def test_quarantined_input_shows_its_source_and_is_never_selected() -> None:
    out = quarantine_record(NS, "unit.acks", 2, 41, None, b"\x00garbage", "undecodable XorBatch")
    entry = DlqEntry.from_message(Msg(out, 3))
    assert entry.kind == QUARANTINE
    assert entry.reason == "quarantine: undecodable XorBatch"
    assert entry_json(entry)["source"] == {"topic": "unit.acks", "partition": 2, "offset": 41}
    assert "quarantined from unit.acks/2/41" in format_entry(entry)
    plan = plan_redrive([entry], {})
    assert plan.selected == [] and plan.quarantined == 1


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("rb-reason", b"x")],
        [("rb-reason", b"x"), ("rb-origin", b"short"), ("rb-topic", b"t"), ("rb-key-hash-partition", b"1"),
         ("rb-history", b"[]")],
        [("rb-reason", b"x"), ("rb-origin", ids.encode_id(5)), ("rb-topic", b"t"),
         ("rb-key-hash-partition", b"one"), ("rb-history", b"[]")],
        [("rb-reason", b"x"), ("rb-origin", ids.encode_id(5)), ("rb-topic", b"t"),
         ("rb-key-hash-partition", b"1"), ("rb-history", b"{not json")],
    ],
)
def test_malformed_entries_are_unknown_and_never_redriven(headers: list[tuple[str, bytes]]) -> None:
    entry = DlqEntry.from_message(Msg(Outgoing(NS.dlq, 0, b"k", b"v", tuple(headers)), 0))
    assert entry.kind == UNKNOWN
    assert plan_redrive([entry], {}).selected == []


def test_plan_selects_by_reason_prefix_and_origin_and_skips_what_was_redriven() -> None:
    a = DlqEntry.from_message(Msg(dead(origin=11, reason="timeout"), 0))
    b = DlqEntry.from_message(Msg(dead(origin=22, reason="failed"), 1))
    c = DlqEntry.from_message(Msg(dead(origin=33, reason="failed"), 2))
    duplicate_of_c = DlqEntry.from_message(Msg(dead(origin=33, reason="failed"), 3))
    markers = {a.marker_key: Marker(11, 99, "0@0", 5)}

    plan = plan_redrive([a, b, c, duplicate_of_c], markers)
    assert [e.origin for e in plan.selected] == [22, 33]
    assert (plan.already_redriven, plan.not_matching, plan.quarantined) == (2, 0, 0)

    plan = plan_redrive([a, b, c], {}, reason_prefix="time")
    assert [e.origin for e in plan.selected] == [11] and plan.not_matching == 2
    plan = plan_redrive([a, b, c], {}, origins=[33, 44])
    assert [e.origin for e in plan.selected] == [33] and plan.not_matching == 2


def test_a_filter_takes_every_condition_given_and_says_what_was_asked() -> None:
    """Issue 43 item 4: --topic, --key, --since/--until beside --reason-prefix and --origin."""
    at = 1_700_000_000_000
    a = DlqEntry.from_message(Msg(dead(origin=11), 0, timestamp_ms=at))
    b = DlqEntry.from_message(Msg(dead(origin=22), 1, timestamp_ms=at + 60_000))
    entries = [a, b]

    def chosen(where: RedriveFilter) -> list[int | None]:
        return [e.origin for e in plan_redrive(entries, {}, where=where).selected]

    assert chosen(RedriveFilter()) == [11, 22]
    assert chosen(RedriveFilter(since_ms=at + 1)) == [22]
    assert chosen(RedriveFilter(until_ms=at + 60_000)) == [11]  # until is exclusive
    assert chosen(RedriveFilter(since_ms=at, until_ms=at + 60_001)) == [11, 22]
    assert chosen(RedriveFilter(topics=["orders"])) == [11, 22]
    assert chosen(RedriveFilter(topics=["payments"])) == []
    assert chosen(RedriveFilter(keys=[b"k\xff"])) == [11, 22] and chosen(RedriveFilter(keys=[b"k"])) == []
    assert chosen(RedriveFilter(reason_prefix="fail", origins=[22], topics=["orders"], since_ms=at)) == [22]
    assert RedriveFilter(topics=["orders"], since_ms=at).as_json() == {
        "topics": ["orders"], "since": "2023-11-14T22:13:20.000Z",
    }


def test_markers_round_trip_and_origin_ids_parse_as_listed() -> None:
    marker = Marker(ORIGIN, 123, "0@7", 1_700_000_000_000)
    assert Marker.decode(marker.encode()) == marker
    assert Marker.decode(b"{}") is None and Marker.decode(b"\xff") is None
    assert parse_id(str(ORIGIN)) == ORIGIN
    assert parse_id("0x" + ids.encode_id(ORIGIN).hex()) == ORIGIN
    assert parse_id("0x1f") == 31


def test_a_record_with_an_adaptive_timeout_is_redriven_with_auto_again() -> None:
    """A record sent with timeout_ms="auto" and dead-lettered keeps "auto" through a redrive
    (unless the redrive is given a timeout); a fixed one gets the redrive's timeout."""
    from broker.dlq import _redrive_one
    from broker.headers import AUTO_TIMEOUT_MS

    auto = PersistedRecord(
        srid=ORIGIN, origin=ORIGIN, attempt=1, root_xor=5, record_id=5, topic="orders", key_hash_partition=4,
        key=b"k", value=b"v", created_ms=1, timeout_ms=AUTO_TIMEOUT_MS, max_attempts=1,
    )
    history = [Failure(ORIGIN, 1, "timeout", 1_000)]
    entry = DlqEntry.from_message(Msg(dlq_record(NS, auto, history, "timeout"), 0))
    fixed = DlqEntry.from_message(Msg(dead(), 1))
    assert entry.kind == RECORD and entry.auto_timeout and entry.headers == ()
    assert not fixed.auto_timeout and entry_json(entry)["timeout"] == "auto"

    class FakeSource:
        def __init__(self) -> None:
            self.timeouts: list[Any] = []

        def resend(self, *_: Any, **kw: Any) -> Any:
            self.timeouts.append(kw["timeout_ms"])
            return type("Sent", (), {"srid": 9, "key_hash_partition": 4})()

        def produce(self, *_: Any, **__: Any) -> None:
            pass

    source = FakeSource()
    _redrive_one(source, NS, "m", entry)  # type: ignore[arg-type]
    _redrive_one(source, NS, "m", fixed)  # type: ignore[arg-type]
    _redrive_one(source, NS, "m", entry, keep_auto=False)  # type: ignore[arg-type]
    assert source.timeouts == ["auto", None, None]
