"""The one-screen rendering of a trace, and the id forms ``trace`` takes."""

from __future__ import annotations

from typing import Any

import pytest

from broker.trace import flag_names, id_hex, parse_id, render


def _attempt(srid: int, attempt: int | None, **fields: Any) -> dict[str, Any]:
    return {
        "srid": srid, "srid_hex": id_hex(srid), "attempt": attempt, "ledger_partition": srid % 2, "known": True,
        "persisted": None, "decision": None, "ledger": {"state": "none"}, "replay": None, **fields,
    }


RESULT: dict[str, Any] = {
    "namespace": "shop",
    "query": 10,
    "query_hex": id_hex(10),
    "found": True,
    "origin": 10,
    "origin_hex": id_hex(10),
    "ledger_partitions": 2,
    "data_topics": ["orders"],
    "attempts": [
        _attempt(10, 1, decision={"outcome": "replay", "partition": 0, "offset": 4, "at_ms": 1, "at": "T-replay"},
                 ledger={"state": "gone", "partition": 0, "offset": 9}),
        _attempt(
            -7, 2,
            persisted={"partition": 1, "offset": 5, "created_ms": 1, "created": "T-created", "timeout_ms": 30000,
                       "deadline_ms": 2, "deadline": "T-deadline", "max_attempts": 5, "topic": "orders",
                       "key_hash_partition": 3, "partitioner": "kafka"},
            ledger={"state": "pending", "partition": 1, "offset": 6, "value_hex": "0x00000000000000ff", "flags": 3,
                    "flag_names": ["registered", "failed"], "persist_offset": 5, "deadline_ms": 2,
                    "deadline": "T-ledger-deadline"},
            replay={"topic": "orders.replay", "partition": 3, "offset": 0, "at_ms": 1, "at": "T-replayed"},
        ),
    ],
    "dlq": [{"partition": 0, "offset": 2, "kind": "record", "reason": "failed", "attempts": 2, "srids": [10, -7],
             "at_ms": 1, "at": "T-dlq"}],
    "read": {},
}


def test_render_shows_every_attempt_on_one_screen() -> None:
    text = render(RESULT)
    lines = text.splitlines()
    assert len(lines) <= 24
    assert lines[0].startswith("origin 10 (0x000000000000000a)  namespace shop  2 attempt(s)")
    assert "attempt 1  srid 10 (0x000000000000000a)  ledger partition 0  <- queried" in lines
    assert "  persisted:  not persisted / compacted away" in lines
    assert "  ledger:     gone (tombstone shop.ledger 0@9)" in lines
    assert "  decision:   replay at T-replay  (shop.persist 0@4)" in lines
    assert f"attempt 2  srid -7 ({id_hex(-7)})  ledger partition 1" in lines
    assert any("shop.persist 1@5" in line and "deadline T-deadline" in line for line in lines)
    assert any("topic orders key-hash partition 3 (kafka)" in line for line in lines)
    assert ("  ledger:     pending  value 0x00000000000000ff  flags registered,failed  deadline T-ledger-deadline"
            "  (shop.ledger 1@6)") in lines
    assert "  decision:   none yet" in lines
    assert "  replay:     orders.replay 3@0 at T-replayed" in lines
    assert lines[-1] == "dlq shop.dlq 0@2 at T-dlq  record  reason: failed  attempts 2"


def test_render_of_an_attempt_whose_number_is_unknown() -> None:
    tombstone_only = {**RESULT, "attempts": [_attempt(10, None, decision=RESULT["attempts"][0]["decision"])], "dlq": []}
    lines = render(tombstone_only).splitlines()
    assert "attempt ?  srid 10 (0x000000000000000a)  ledger partition 0  <- queried" in lines
    assert lines[-1] == "dlq: no entry"


def test_render_of_an_unknown_id_is_one_line() -> None:
    unknown = {**RESULT, "found": False, "query": 99, "query_hex": id_hex(99), "attempts": [], "dlq": []}
    assert render(unknown) == f"no record 99 ({id_hex(99)}) in namespace shop"


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42), ("-7", -7), ("0x2a", 42), ("0xfffffffffffffff9", -7), (" 0X000000000000002A ", 42)],
)
def test_parse_id(text: str, value: int) -> None:
    assert parse_id(text) == value


def test_flag_names() -> None:
    assert flag_names(0x01 | 0x10) == ["registered", "deferred"]
    assert flag_names(0x04 | 0x08) == []  # LOGGED and DIRTY never travel through the changelog
