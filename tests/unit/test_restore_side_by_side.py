"""A restore of many ledger partitions reads them side by side (broker.acker.restoring).

At P = 1 000 a restore that read one partition after the other, asking each one's watermarks
in a round trip of its own, took minutes on a loaded cluster: an acker assigned every partition
served its first record 80 s after it started, and a rewind of 116 partitions took a minute.
Here the restorer is a fake that counts its fetches and watermark queries.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, TopicPartition

from broker import ids
from broker.acker.changelog import MAX_READING, ChangelogReader
from broker.acker.owned import OwnedPartitions
from broker.acker.restoring import Restores
from broker.acker.state import PartitionState
from broker.ledger.clock import Ticker
from broker.schemas import encode_ledger_entry
from broker.topics import Namespace
from tests.unit.log_cluster import Message

NS = Namespace("sidebyside")
T0 = 1_700_000_000_000
P = 600


class Restorer:
    """Logs per (topic, partition); each fetch hands out what every assigned partition has,
    then its end of partition once."""

    def __init__(self, logs: dict[tuple[str, int], list[tuple[bytes, bytes | None]]]) -> None:
        self.logs = logs
        self.positions: dict[tuple[str, int], int] = {}
        self.fetches = 0
        self.watermark_queries = 0
        self.most_assigned = 0

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions[(tp.topic, tp.partition)] = max(tp.offset, 0)
        self.most_assigned = max(self.most_assigned, len(self.positions))

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.positions.pop((tp.topic, tp.partition), None)

    def consume(self, n: int, timeout: float) -> list[Any]:
        self.fetches += 1
        out: list[Any] = []
        for (topic, p), at in list(self.positions.items()):
            log = self.logs.get((topic, p), [])
            out += [Message(topic, p, o, k, v) for o, (k, v) in enumerate(log) if o >= at]
            out.append(Message(topic, p, len(log), None, None, err=KafkaError(KafkaError._PARTITION_EOF)))
            self.positions[(topic, p)] = len(log)
        return out

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        self.watermark_queries += 1
        return 0, len(self.logs.get((tp.topic, tp.partition), []))

    def marks(self, topic: str, lps: list[int]) -> dict[int, tuple[int, int]]:
        return {lp: (0, len(self.logs.get((topic, lp), []))) for lp in lps}


def _restore(restorer: Restorer, lps: list[int]) -> dict[int, PartitionState]:
    changelog = ChangelogReader(NS, Ticker(100, T0), OwnedPartitions().new_state, restorer, None, marks=restorer.marks)  # type: ignore[arg-type]
    registered: dict[int, list[Any]] = defaultdict(list)
    restores = Restores(
        changelog,
        lambda tps, _timeout: [TopicPartition(tp.topic, tp.partition, 0) for tp in tps],
        lambda _st, lp, msgs: registered[lp].extend(msgs),
    )
    tps = [TopicPartition(t, lp) for lp in lps for t in (NS.persist, NS.acks)]
    pending = restores.add(lps, tps)
    done = None
    for _ in range(100):
        done = restores.step(1.0)
        if done is not None:
            break
    assert done is pending
    return done.states


def test_a_thousand_empty_partitions_take_one_watermark_batch_and_no_fetch() -> None:
    restorer = Restorer({})
    states = _restore(restorer, list(range(1000)))
    assert sorted(states) == list(range(1000))
    assert restorer.watermark_queries == 0 and restorer.fetches == 0


def test_partitions_with_changelogs_are_read_side_by_side() -> None:
    """Each of P partitions holds two entries and a tombstone: every entry arrives, in a
    handful of fetches, never more than ``MAX_READING`` partitions at once."""
    logs: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
    for lp in range(P):
        a, b = 10 * lp + 1, 10 * lp + 2
        logs[(NS.ledger, lp)] = [
            (ids.encode_id(a), encode_ledger_entry(a, 1, 0, T0 + 60_000)),
            (ids.encode_id(b), encode_ledger_entry(b, 1, 0, T0 + 60_000)),
            (ids.encode_id(a), None),
        ]
    restorer = Restorer(logs)
    states = _restore(restorer, list(range(P)))
    assert sorted(states) == list(range(P))
    for lp, st in states.items():
        assert (10 * lp + 2) in st.table and (10 * lp + 1) not in st.table
    assert restorer.watermark_queries == 0
    assert restorer.most_assigned <= MAX_READING
    assert restorer.fetches <= 2 * (P // MAX_READING + 1), restorer.fetches  # one partition each: P fetches
    assert np.all(np.array([len(st.table) for st in states.values()]) == 1)


def test_the_restore_slice_follows_the_last_commit_within_its_bounds() -> None:
    """At P = 1 000 on three brokers a commit takes 2-3 s: a 50 ms restore slice per loop gave
    a standby takeover a fiftieth of the loop (68 s to restore). The slice follows the commit."""
    from broker.acker.assignment import RESTORE_SLICE_MAX_S, RESTORE_SLICE_S, restore_slice

    assert restore_slice(0.0) == RESTORE_SLICE_S  # nothing committed yet
    assert restore_slice(0.01) == RESTORE_SLICE_S
    assert restore_slice(0.4) == 0.4
    assert restore_slice(2.9) == RESTORE_SLICE_MAX_S == 1.0
