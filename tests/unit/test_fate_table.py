"""The fate table in code (``broker.acker.fate.TABLE``) is the table of docs/design.md §6, row by row:
its states, condition, input, gating, next state and tombstone - so the two cannot drift."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from broker.acker import fate
from broker.acker.fate import ANY, TABLE, Condition, Input, Outcome, Reason, Row, State
from broker.headers import OUTCOME_COMPLETED, OUTCOME_DLQ, OUTCOME_REPLAY

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def _doc_rows() -> list[list[str]]:
    section = DESIGN.read_text().split("\n## 6.", 1)[1].split("\n## 7.", 1)[0]
    lines = section.split("| state | input | next | written in the commit's transaction |\n", 1)[1].splitlines()
    rows = []
    for line in lines[1:]:  # past the |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _states(cell: str) -> tuple[tuple[State, ...], Condition | None]:
    head, _, when = cell.partition(", ")
    head = re.sub(r"\s*\[[^]]*\]", "", head).lower()
    states = ANY if head == "any" else tuple(State(name) for name in head.split(" or "))
    return states, Condition(when) if when else None


def _input(cell: str) -> tuple[Input, bool]:
    found = [i for i in Input if cell.startswith(i.value)]
    assert len(found) == 1, f"input {cell!r}: {found}"
    return found[0], cell.endswith(", gated")


def _next(cell: str) -> State | None:
    name = re.split(r"[\[,(;]", cell, maxsplit=1)[0].strip()
    return None if name == "the same state" else State(name)


def _outcome(cell: str) -> Outcome | None:
    m = re.match(r"tombstone `(\w+)`", cell)
    return Outcome(m.group(1)) if m else None


def _parsed(cells: list[str]) -> Row:
    states, when = _states(cells[0])
    inp, gated = _input(cells[1])
    return Row(states, inp, _next(cells[2]), _outcome(cells[3]), when, gated)


def test_the_doc_has_the_table() -> None:
    rows = _doc_rows()
    assert len(rows) >= 10 and all(len(r) == 4 for r in rows), rows


def test_the_table_in_code_is_the_table_in_the_doc() -> None:
    doc = [_parsed(cells) for cells in _doc_rows()]
    assert len(doc) == len(TABLE)
    for cells, row, code in zip(_doc_rows(), doc, TABLE, strict=True):
        assert row == code, f"docs/design.md §6 row {' | '.join(cells)!r} is not {code}"


@pytest.mark.parametrize("enum", [State, Input, Condition, Outcome])
def test_every_name_is_in_the_table(enum: Any) -> None:
    used = {v for row in TABLE for v in (*row.states, row.next, row.input, row.outcome, row.when)}
    assert set(enum) <= used


def test_every_row_has_a_name() -> None:
    named = {id(v) for v in vars(fate).values() if isinstance(v, Row)}
    assert all(id(row) in named for row in TABLE) and len({id(r) for r in TABLE}) == len(TABLE)


def test_the_words_are_the_logs() -> None:
    assert [o.header for o in Outcome] == [OUTCOME_COMPLETED, OUTCOME_REPLAY, OUTCOME_DLQ]
    assert (f"{Reason.TIMEOUT}", str(Reason.FAILED)) == ("timeout", "failed")
