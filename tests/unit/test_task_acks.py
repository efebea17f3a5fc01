"""``TaskAcks.send``: a batch's events, kept in settle order, go out as one ``XorBatch`` per
ledger partition (srid mod P) - every event and fail mark in its srid's partition, in order."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker import ids
from broker.schemas import XorBatch
from broker.task import TaskCounters
from broker.task.acks import Events, TaskAcks

SRIDS = st.integers(-(2**63), 2**63 - 1).filter(bool)


class _Outputs:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def produce(self, topic: str, srid: int | None = None, **kwargs: Any) -> None:
        self.sent.append((topic, kwargs))


def _send(events: Events, partitions: int) -> list[tuple[int, XorBatch]]:
    outputs = _Outputs()
    TaskAcks(outputs, "ns.acks", "task@1", TaskCounters(), lambda: partitions).send(events)  # type: ignore[arg-type]
    assert {t for t, _ in outputs.sent} <= {"ns.acks"}
    return [(kw["partition"], XorBatch.decode(kw["value"])) for _, kw in outputs.sent]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(SRIDS, SRIDS), max_size=40), st.lists(SRIDS, max_size=10), st.integers(1, 7))
def test_each_partition_gets_its_events_and_fail_marks_in_order(
    acked: list[tuple[int, int]], failed: list[int], partitions: int
) -> None:
    events = Events()
    for srid, xor in acked:
        events.srids.append(srid)
        events.xors.append(xor)
    events.failed += failed
    sent = _send(events, partitions)
    assert [lp for lp, _ in sent] == sorted({ids.ledger_partition(s, partitions) for s in [*events.srids, *failed]})
    for lp, batch in sent:
        assert batch.ledger_partition == lp and batch.producer == "task@1"
        mine = [(s, x) for s, x in acked if ids.ledger_partition(s, partitions) == lp]
        assert list(zip(batch.srids.tolist(), batch.xors.tolist(), strict=True)) == mine
        assert batch.failed.tolist() == [s for s in failed if ids.ledger_partition(s, partitions) == lp]


def test_no_events_send_nothing() -> None:
    assert _send(Events(), 4) == []
