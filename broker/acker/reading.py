"""Reading order: an acker behind on ``ns.persist[i]`` reads ``ns.acks[i]`` no further ahead
in time than its persist records (docs/design.md §5).

An event read before its srid's persist record makes an unregistered entry, which the changelog
must hold - an upsert, then a tombstone once the persist record completes it - while an entry
with nothing but its persist record costs the changelog nothing. An acker that falls behind on
``ns.persist`` (its records are larger; the acks of many records travel in one ``XorBatch``)
but keeps up with ``ns.acks`` read nearly every event first, and the changelog work that added
kept it behind: in the bench's throughput run, 1.0-1.4 changelog records per completed record.
So, per owned ledger partition, at every poll:

| ``BEHIND`` unread persist records | event newer than the last persist record read | the event        |
|-----------------------------------|-----------------------------------------------|------------------|
| no (fewer)                        | -                                             | folded           |
| yes, or persist not fetched yet   | no                                            | folded           |
| yes, or persist not fetched yet   | yes                                           | read again later |

"Read again later": the poll's ack batch is cut at that event, ``ns.acks[i]`` is sought back to
it and paused until persist is read as far (in create time) or nearly to its end (a seek that fails
keeps the whole batch). Only what is fetched changes. What is folded, committed and decided
does not: a paused input is an input read less far, and the lag gate holds expiry for it as for
any backlog - it takes no samples of a paused input, whose cached watermark is not fetched
(broker.acker.lag). Times are the records' create times: a persist record's from its source's
clock, an event's from its task's. A task clock ahead of the sources' holds events until persist
is read nearly to its end, never for good; one behind only holds less. An open transaction on
``ns.persist[i]`` counts as unread records until it ends.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from broker.acker.lag import ExpiryGate
from broker.topics import Namespace

BEHIND = 5_000
"""Unread persist records of a partition from which its events wait: an acker that keeps up
sees a few hundred now and then (a fetch response read in two polls), and holding its events
for them would cost each a fetch round trip."""


class ReadingOrder:
    """Pauses ``ns.acks[i]`` while it is read ahead of ``ns.persist[i]`` (the table above)."""

    def __init__(self, ns: Namespace, gate: ExpiryGate, behind: int = BEHIND) -> None:
        self.ns = ns
        self.gate = gate
        self.behind = behind
        self.persist_ms: dict[int, int] = {}  # lp -> create time of the last persist record read
        self.acks_ms: dict[int, int] = {}  # lp -> create time of the last event read, or the first held
        self.paused: set[int] = set()
        # The partitions whose last event read is newer than their last persist record read:
        # the only ones, with the paused, that ``apply`` may have to pause or resume.
        self.later: set[int] = set()
        self.pauses = 0  # times an acks partition was paused (logged with the counters)
        self.held = 0  # ack messages read again later

    def admit(
        self, consumer: Consumer, persist: Mapping[int, list[Message]], acks: dict[int, list[Message]],
        positions: Mapping[tuple[str, int], int],
    ) -> None:
        """Note the persist records read, and cut each ack batch at its first event newer
        than them while ``ns.persist[lp]`` is ``behind``: the rest is read again later (sought
        back to here, paused by ``apply``). A seek that fails keeps the whole batch."""
        for lp, batch in persist.items():
            self._note(self.persist_ms, lp, batch[-1])
        acks_read = list(acks)
        for lp, batch in list(acks.items()):
            limit = max(self.persist_ms.get(lp, 0), 0)  # create times of 0 / -1: not available
            cut = next((i for i, msg in enumerate(batch) if msg.timestamp()[1] > limit), None)
            if cut is None or not self._behind(consumer, lp, positions) or not self._seek(consumer, lp, batch[cut]):
                self._note(self.acks_ms, lp, batch[-1])
                continue
            self.acks_ms[lp] = batch[cut].timestamp()[1]
            self.held += len(batch) - cut
            if cut:
                acks[lp] = batch[:cut]
            else:
                del acks[lp]
        for lp in {*persist, *acks_read}:
            if self.acks_ms.get(lp, -1) > self.persist_ms.get(lp, -1):
                self.later.add(lp)
            else:
                self.later.discard(lp)

    def _seek(self, consumer: Consumer, lp: int, msg: Message) -> bool:
        """Seek ``ns.acks[lp]`` back to ``msg``; False if the consumer refused."""
        try:
            consumer.seek(TopicPartition(self.ns.acks, lp, msg.offset()))
        except KafkaException:
            return False
        return True

    @staticmethod
    def _note(seen: dict[int, int], lp: int, msg: Message) -> None:
        ms = msg.timestamp()[1]
        if ms > 0:  # 0 / -1: not available
            seen[lp] = ms

    def apply(self, consumer: Consumer, lps: Container[int], positions: Mapping[tuple[str, int], int]) -> None:
        """Pause or resume ``ns.acks[lp]`` of the installed partitions ``lps`` by the table
        (``positions``: the acker's input positions, the offsets assigned until read on). Only
        a partition read ahead (``later``) or paused can change: called at every poll, this
        looks at no other."""
        for lp in sorted(lp for lp in self.later | self.paused if lp in lps):
            ahead = self.acks_ms.get(lp, -1) > self.persist_ms.get(lp, -1) and self._behind(consumer, lp, positions)
            if ahead == (lp in self.paused):
                continue
            tp = TopicPartition(self.ns.acks, lp)
            try:
                (consumer.pause if ahead else consumer.resume)([tp])
            except KafkaException:
                continue  # not assigned any more: the revocation forgets it
            if ahead:
                self.paused.add(lp)
                self.pauses += 1
                self.gate.paused(tp)
            else:
                self.paused.discard(lp)
                self.gate.resumed(tp)

    def _behind(self, consumer: Consumer, lp: int, positions: Mapping[tuple[str, int], int]) -> bool:
        """Whether ``ns.persist[lp]`` may be ``behind`` records or more behind: by the last
        fetch, or no fetch came back since the assignment. The consumer's position steps
        over transaction markers (a partition read to its end, the acker's own commit marker
        last, has position = high watermark) but is unknown until a message or a marker came
        after the assignment: then the offset assigned (in ``positions``) stands in for it."""
        tp = TopicPartition(self.ns.persist, lp)
        try:
            position = consumer.position([tp])[0].offset
            _, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return False
        if high < 0:
            return True  # nothing fetched yet
        if position < 0:
            position = positions.get((self.ns.persist, lp), high)
        return int(high) - position >= self.behind

    def forget(self, lps: Iterable[int]) -> None:
        """Partitions revoked, lost or rewound: their inputs are paused and resumed by the
        restore, or unassigned."""
        for lp in lps:
            self.persist_ms.pop(lp, None)
            self.acks_ms.pop(lp, None)
            self.later.discard(lp)
            self.paused.discard(lp)
