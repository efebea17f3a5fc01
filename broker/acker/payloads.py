"""Payloads for replays: a cache of the newest persist values, and a bulk reader of persist
records by offset for the rest, which tells a record that cannot be read now from one that
is gone."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, repeat

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker import ids
from broker.topics import Namespace


class PayloadCache:
    """Bounded srid -> persist value cache of the newest registrations (the oldest
    insertion evicted first).

    A replay usually happens within the timeout of its registration, so most payloads are
    still here; the rest are read from ``ns.persist`` at the stored offset. Values are
    kept as the raw ``PersistedRecord`` bytes: most records complete and are never replayed,
    so they are decoded only when a replay needs them. A plain dict (insertion-ordered),
    filled and emptied a batch at a time by C-level loops: half an ``OrderedDict``'s cost
    per record, which the acker pays twice for every record (registered, then completed).
    """

    def __init__(self, max_entries: int = 20_000) -> None:
        self.max_entries = max_entries
        self._items: dict[int, bytes] = {}

    def put(self, srid: int, payload: bytes) -> None:
        self.put_many((srid,), (payload,))

    def put_many(self, srids: Sequence[int], payloads: Sequence[bytes]) -> None:
        """``put`` of each pair, in order."""
        if self.max_entries <= 0:
            return
        items = self._items
        items.update(zip(srids, payloads, strict=True))
        over = len(items) - self.max_entries
        if over > 0:
            deque(map(items.pop, list(islice(items, over))), maxlen=0)

    def __contains__(self, srid: int) -> bool:
        return srid in self._items

    def pop(self, srid: int) -> bytes | None:
        return self._items.pop(srid, None)

    def discard_many(self, srids: Sequence[int]) -> None:
        if self._items:
            deque(map(self._items.pop, srids, repeat(None)), maxlen=0)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Unreadable:
    """Why the persist record at one offset was not read. ``gone``: provably not in
    ``ns.persist`` any more (below the log start offset, compacted away, or its offset holds
    something else), reading again cannot help; otherwise it may be readable later."""

    reason: str
    gone: bool


class PersistFetcher:
    """Reads persist records by offset in bulk (read_committed, no group).

    One pass per ledger partition: one assign at the smallest wanted offset, then a
    sequential read that collects the wanted offsets and stops at the largest. Wanted offsets
    further apart than ``max_gap`` start a new pass (a new assign) instead of reading
    everything between them. The consumer needs ``enable.partition.eof``: the end of what a
    read_committed consumer may read is often a transaction marker, which it never sees.
    """

    def __init__(self, ns: Namespace, consumer: Consumer, *, batch: int = 10_000, max_gap: int = 4_096) -> None:
        self.ns = ns
        self._consumer = consumer
        self.batch = batch
        self.max_gap = max_gap

    def fetch_many(self, partition: int, wanted: Mapping[int, int], deadline: float) -> dict[int, bytes | Unreadable]:
        """The undecoded persist values at ``wanted`` (offset -> srid) of ``partition``, or why
        each was not read; reading stops at ``deadline`` (``time.monotonic``). Every wanted
        offset is in the result."""
        out: dict[int, bytes | Unreadable] = {}
        if not wanted:
            return out
        topic = self.ns.persist
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=max(0.1, deadline - time.monotonic())
            )
        except KafkaException as exc:
            return {o: Unreadable(f"{topic}[{partition}] not readable: {exc}", gone=False) for o in wanted}
        runs: list[list[int]] = []
        for offset in sorted(wanted):
            if offset < low:
                out[offset] = Unreadable(f"{topic}[{partition}]@{offset} is below the log start offset {low}", True)
            elif offset >= high:
                out[offset] = Unreadable(f"{topic}[{partition}]@{offset} is past the end of the log ({high})", False)
            elif runs and offset - runs[-1][-1] <= self.max_gap:
                runs[-1].append(offset)
            else:
                runs.append([offset])
        try:
            for run in runs:
                self._consumer.assign([TopicPartition(topic, partition, run[0])])
                try:
                    self._read(partition, run, wanted, out, deadline)
                finally:
                    # drops what was fetched ahead, so the next pass sees nothing stale
                    self._consumer.unassign()
        except KafkaException as exc:
            for offset in wanted:
                out.setdefault(offset, Unreadable(f"{topic}[{partition}] not readable: {exc}", gone=False))
        for offset in wanted:
            out.setdefault(offset, Unreadable(f"{topic}[{partition}]@{offset} not read in time", gone=False))
        return out

    def _read(
        self, partition: int, run: list[int], wanted: Mapping[int, int], out: dict[int, bytes | Unreadable],
        deadline: float,
    ) -> None:
        """Read from ``run[0]`` on until every offset of ``run`` (sorted) is decided."""
        topic, i, position = self.ns.persist, 0, run[0]
        while i < len(run):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Never more messages than offsets up to the last wanted one: the read stops
            # there. consume() waits its whole timeout unless the batch fills: keep it short.
            for msg in self._consumer.consume(min(self.batch, run[-1] - position + 1), min(remaining, 0.05)):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    # The end of what may be read now (the last stable offset): what was
                    # not reached may become readable.
                    for offset in run[i:]:
                        out[offset] = Unreadable(f"{topic}[{partition}]@{offset} not readable: end at {msg.offset()}", False)
                    return
                at = msg.offset()
                position = at + 1
                # The wanted offsets were read read_committed when their srids registered, so
                # each held a committed record: one that the read passed without seeing was
                # compacted away (transaction markers and aborted records are never wanted).
                while i < len(run) and run[i] < at:
                    out[run[i]] = Unreadable(f"{topic}[{partition}]@{run[i]} was compacted away (read on to {at})", True)
                    i += 1
                if i < len(run) and run[i] == at:
                    srid, value = wanted[at], msg.value()
                    if msg.key() != ids.encode_id(srid):
                        out[at] = Unreadable(f"{topic}[{partition}]@{at} does not hold srid {srid}", True)
                    elif value is None:
                        out[at] = Unreadable(f"{topic}[{partition}]@{at} is a tombstone, not the record of {srid}", True)
                    else:
                        out[at] = bytes(value)
                    i += 1
                if i == len(run):
                    return

    def close(self) -> None:
        self._consumer.close()
