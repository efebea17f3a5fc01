"""``rb-path``: the output identity of a record below its source record."""

from __future__ import annotations

from typing import Any, cast

from broker import ids
from broker.headers import (
    H_PATH,
    ROOT_PATH,
    Tracking,
    child_path,
    path_of,
    tracking_headers,
    user_headers,
)
from broker.serde import BYTES, Serde
from broker.task import Task, TaskContext, TaskRecord


class _Producing:
    """Stands in for the Task: keeps what ``TaskContext.emit`` produces."""

    def __init__(self) -> None:
        self.produced: list[dict[str, Any]] = []

    def emit_record(self, topic: str, record: dict[str, Any]) -> None:
        self.produced.append({"topic": topic, **record})

    def serde(self, _topic: str) -> Serde:
        return BYTES


def _record(headers: list[tuple[str, bytes | None]]) -> TaskRecord:
    return TaskRecord("in", 0, 0, b"k", b"v", tuple(headers), Tracking.from_headers(headers))


def test_path_of_reads_the_last_header_and_defaults_to_the_root() -> None:
    assert path_of(None) == path_of([]) == ROOT_PATH == "0"
    assert path_of([("x", b"1"), (H_PATH, b"0.2")]) == "0.2"
    assert path_of([(H_PATH, b"0.1"), (H_PATH, b"0.2.0")]) == "0.2.0"
    assert path_of([(H_PATH, b"")]) == path_of([(H_PATH, None)]) == ROOT_PATH
    assert child_path("0.2", 1) == "0.2.1"


def test_user_headers_cannot_set_a_path() -> None:
    assert user_headers([("a", b"1"), (H_PATH, b"9.9")]) == (("a", b"1"),)


def test_children_carry_their_emit_index_below_the_parents_path() -> None:
    srid, rid = ids.new_id(), ids.new_id()
    task = _Producing()
    for parent_path, parent in (
        (ROOT_PATH, tracking_headers(srid, rid, srid, 1)),  # a source record: no rb-path
        ("0.2", [*tracking_headers(srid, rid, srid, 3), (H_PATH, b"0.2")]),
    ):
        task.produced.clear()
        ctx = TaskContext(cast(Task, task), _record(parent))
        for i in range(3):
            ctx.emit("out", b"k", f"child-{i}", headers=[(H_PATH, b"forged"), ("user", b"u")])
        paths = [path_of(p["headers"]) for p in task.produced]
        assert paths == [f"{parent_path}.{i}" for i in range(3)]
        assert all(("user", b"u") in p["headers"] for p in task.produced)
        assert all(sum(k == H_PATH for k, _ in p["headers"]) == 1 for p in task.produced)


def test_untracked_inputs_emit_untracked_children_without_a_path() -> None:
    task = _Producing()
    ctx = TaskContext(cast(Task, task), _record([]))
    ctx.emit("out", None, b"v")
    assert all(k != H_PATH for k, _ in task.produced[0]["headers"])
