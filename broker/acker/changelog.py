"""Restoring ledger partitions from their changelog ``ns.ledger[i]``, and standby tailing.

A partition's table is the last value per key of its changelog: ``LedgerEntry`` upserts,
tombstones for entries that left, and the ``__counters__`` record. Reading it from offset
``o`` onto a state that already reflects everything before ``o`` gives the same table as a
full read, because the last record of each key wins. Standby states are kept for partitions
this instance does not own, with the next changelog offset to read, so getting one of them
is a catch-up read instead of a restore (docs/design.md §5).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from broker.acker.state import PartitionState, empty_state
from broker.ledger.clock import Ticker
from broker.schemas import COUNTERS_KEY, LedgerEntry, decode_counters
from broker.topics import Namespace


class Changelog:
    """Reads ``ns.ledger`` partitions: full restores, catch-ups, and standby tails."""

    def __init__(
        self,
        ns: Namespace,
        ticker: Ticker,
        totals: dict[str, int],
        restorer: Consumer,
        standby_consumer: Consumer | None,
    ) -> None:
        self.ns = ns
        self.ticker = ticker
        self.totals = totals
        self._restorer = restorer
        self._standby_consumer = standby_consumer
        # Partitions not owned: lp -> (state, next changelog offset). Warm states of revoked
        # partitions, and with a standby consumer every other partition, tailed as it changes.
        self.standby: dict[int, tuple[PartitionState, int]] = {}

    def new_state(self) -> PartitionState:
        return empty_state(self.totals)

    def end(self, lp: int) -> int:
        _, high = self._restorer.get_watermark_offsets(TopicPartition(self.ns.ledger, lp), timeout=30)
        return int(high)

    def take(self, lp: int) -> tuple[PartitionState, int]:
        """Partition ``lp`` restored: from its standby state when there is one (a catch-up
        read), else from the beginning. Returns the state and the records read."""
        standby = self.standby.pop(lp, None)
        if standby is None:
            return self.load(lp, None, OFFSET_BEGINNING)
        return self.load(lp, standby[0], standby[1])

    def keep_warm(self, lp: int, st: PartitionState) -> None:
        """Keep the state of a revoked partition, which equals its changelog up to its end."""
        self.standby[lp] = (st, self.end(lp))

    def load(self, lp: int, st: PartitionState | None, start: int) -> tuple[PartitionState, int]:
        """Read ``ns.ledger[lp]`` from ``start`` to its end onto ``st`` (a fresh state when
        None). The last record of each key wins, so re-reading records a state already
        reflects is harmless. Returns the state and the number of records read."""
        latest: dict[bytes, bytes | None] = {}
        read = 0
        low, high = self._restorer.get_watermark_offsets(TopicPartition(self.ns.ledger, lp), timeout=30)
        if high > max(low, start):
            self._restorer.assign([TopicPartition(self.ns.ledger, lp, start)])
            try:
                done = False
                while not done:
                    # consume() waits out its whole timeout unless 10 000 messages arrive:
                    # a long one would cost every restored partition a second, however small.
                    for msg in self._restorer.consume(10_000, 0.05):
                        err = msg.error()
                        if err is None:
                            latest[msg.key() or b""] = msg.value()
                            read += 1
                        elif err.code() == KafkaError._PARTITION_EOF:
                            done = True
                        else:
                            raise KafkaException(err)
            finally:
                self._restorer.unassign()
        st = st if st is not None else self.new_state()
        self.apply(st, latest)
        return st, read

    def apply(self, st: PartitionState, latest: dict[bytes, bytes | None]) -> None:
        """Apply changelog records (the last per key) to a table: upserts and tombstones."""
        raw_counters = latest.pop(COUNTERS_KEY, None)
        if raw_counters:
            st.counters, _ = decode_counters(raw_counters)
        gone = [k for k, v in latest.items() if v is None and len(k) == 8]
        if gone:
            st.table.remove(np.frombuffer(b"".join(gone), dtype=">i8").astype(np.int64))
        live = [(k, v) for k, v in latest.items() if v is not None and len(k) == 8]
        if live:
            entries = [LedgerEntry.decode(v) for _, v in live]
            st.table.restore(
                np.frombuffer(b"".join(k for k, _ in live), dtype=">i8").astype(np.int64),
                np.array([e.value for e in entries], dtype=np.int64),
                np.array([e.flags for e in entries], dtype=np.uint8),
                np.array([e.persist_offset for e in entries], dtype=np.int64),
                self.ticker.ticks_of(np.array([e.deadline_ms for e in entries], dtype=np.int64)),
            )

    # ------------------------------------------------------------------ standby

    def assign_standby(self, partitions: int, owned: Iterable[int]) -> None:
        """With a standby consumer, tail the changelog of every partition not ``owned``."""
        if self._standby_consumer is None:
            return
        owned = set(owned)
        for lp in range(partitions):
            if lp not in owned and lp not in self.standby:
                self.standby[lp] = (self.new_state(), OFFSET_BEGINNING)
        self._standby_consumer.assign(
            [TopicPartition(self.ns.ledger, lp, offset) for lp, (_, offset) in self.standby.items()]
        )

    def poll_standby(self) -> None:
        if self._standby_consumer is None or not self.standby:
            return
        latest: dict[int, dict[bytes, bytes | None]] = defaultdict(dict)
        for msg in self._standby_consumer.consume(10_000, 0):
            if msg.error() is None and msg.partition() in self.standby:
                latest[msg.partition()][msg.key() or b""] = msg.value()
                st, _ = self.standby[msg.partition()]
                self.standby[msg.partition()] = (st, msg.offset() + 1)
        for lp, records in latest.items():
            self.apply(self.standby[lp][0], records)

    def close(self) -> None:
        self._restorer.close()
        if self._standby_consumer is not None:
            self._standby_consumer.close()
