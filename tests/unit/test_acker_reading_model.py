"""The reading order (broker.acker.reading) against a model of the consumer it steers: two
logs per ledger partition, fetches that bring whatever is appended and not paused, ``seek``
and ``pause`` as librdkafka has them (a seek drops what was fetched after the offset; a paused
partition is not fetched). Whatever the interleaving of appends, polls and batch sizes:

- every event is folded exactly once, in offset order (a cut batch is read again, never
  skipped nor doubled);
- while ``ns.persist`` has unread records, no event newer than the persist records read is
  folded;
- once the source and the tasks stop, every event is folded (a pause never lasts)."""

from __future__ import annotations

from confluent_kafka import OFFSET_INVALID, TIMESTAMP_CREATE_TIME, TopicPartition
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.acker.reading import ReadingOrder
from broker.topics import Namespace

NS = Namespace("model")
P = 2


class Msg:
    def __init__(self, topic: str, lp: int, offset: int, ms: int) -> None:
        self.args = (topic, lp, offset, ms)

    def topic(self) -> str:
        return self.args[0]

    def partition(self) -> int:
        return self.args[1]

    def offset(self) -> int:
        return self.args[2]

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_CREATE_TIME, self.args[3])


class Gate:
    def paused(self, tp: TopicPartition) -> None:
        pass

    def resumed(self, tp: TopicPartition) -> None:
        pass


class Kafka:
    """The logs, and a consumer of both topics' partitions: ``fetch`` copies what is appended
    past each unpaused partition's fetch position into a queue, ``consume`` hands it out."""

    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], list[int]] = {(t, lp): [] for t in (NS.persist, NS.acks) for lp in range(P)}
        self.fetch_at = dict.fromkeys(self.logs, 0)
        self.cached_high = dict.fromkeys(self.logs, OFFSET_INVALID)
        self.delivered: dict[tuple[str, int], int] = {}  # position(): after the last message handed out
        # Where fetching starts again when a partition is paused before a message was handed
        # out since the assignment or the last seek: the offset assigned or sought (librdkafka
        # drops what it fetched ahead and fetches it again after the resume).
        self.restart = dict.fromkeys(self.logs, 0)
        self.queue: list[Msg] = []
        self.paused: set[tuple[str, int]] = set()

    def fetch(self, key: tuple[str, int], most: int) -> None:
        if key in self.paused:
            return
        log, at = self.logs[key], self.fetch_at[key]
        end = min(len(log), at + most)
        self.queue += [Msg(key[0], key[1], o, log[o]) for o in range(at, end)]
        self.fetch_at[key] = end
        self.cached_high[key] = len(log)

    def consume(self, n: int) -> list[Msg]:
        out, self.queue = self.queue[:n], self.queue[n:]
        for m in out:
            self.delivered[(m.topic(), m.partition())] = m.offset() + 1
        return out

    # the consumer's API, as the reading order calls it
    def seek(self, tp: TopicPartition) -> None:
        key = (tp.topic, tp.partition)
        self.queue = [m for m in self.queue if (m.topic(), m.partition()) != key]
        self.fetch_at[key] = self.restart[key] = tp.offset
        self.delivered.pop(key, None)  # unknown after a seek until a message is delivered

    def pause(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            key = (tp.topic, tp.partition)
            self.paused.add(key)
            self.queue = [m for m in self.queue if (m.topic(), m.partition()) != key]
            self.fetch_at[key] = self.delivered.get(key, self.restart[key])

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.delivered.get((tp.topic, tp.partition), OFFSET_INVALID)) for tp in tps]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        return (0, self.cached_high[(tp.topic, tp.partition)])


class ReadingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.kafka = Kafka()
        self.order = ReadingOrder(NS, Gate(), behind=1)  # type: ignore[arg-type]
        self.now = 1_000
        self.folded: dict[int, list[int]] = {lp: [] for lp in range(P)}
        self.persist_read_ms: dict[int, int] = {}
        self.positions = {(NS.persist, lp): 0 for lp in range(P)}  # the acker's: assigned at 0

    @rule(lp=st.integers(0, P - 1), n=st.integers(1, 5), ms=st.integers(0, 30))
    def persist(self, lp: int, n: int, ms: int) -> None:
        self.now += ms
        self.kafka.logs[(NS.persist, lp)] += [self.now] * n

    @rule(lp=st.integers(0, P - 1), lag=st.integers(-20, 60))
    def ack(self, lp: int, lag: int) -> None:
        """An event, created ``lag`` ms after now (a task's clock may be ahead or behind)."""
        self.kafka.logs[(NS.acks, lp)].append(self.now + lag)

    @rule(key=st.sampled_from([(t, lp) for t in ("p", "a") for lp in range(P)]), most=st.integers(1, 8))
    def fetch(self, key: tuple[str, int], most: int) -> None:
        self.kafka.fetch((NS.persist if key[0] == "p" else NS.acks, key[1]), most)

    @rule(n=st.integers(1, 10))
    def poll(self, n: int) -> None:
        """One step of the acker: ``Acker._fold_messages``, then ``ReadingOrder.apply``."""
        persist: dict[int, list[Msg]] = {}
        acks: dict[int, list[Msg]] = {}
        for m in self.kafka.consume(n):
            (persist if m.topic() == NS.persist else acks).setdefault(m.partition(), []).append(m)
        unread_before = {lp: self._unread_after(lp, persist) for lp in range(P)}
        self.order.admit(self.kafka, persist, acks, self.positions)  # type: ignore[arg-type]
        for lp, batch in persist.items():
            self.persist_read_ms[lp] = batch[-1].timestamp()[1]
            self.positions[(NS.persist, lp)] = batch[-1].offset() + 1
        for lp, batch in acks.items():
            for m in batch:
                if unread_before[lp]:
                    assert m.timestamp()[1] <= self.persist_read_ms.get(lp, -1), "an event folded ahead of persist"
                self.folded[lp].append(m.offset())
        self.order.apply(self.kafka, range(P), self.positions)  # type: ignore[arg-type]

    def _unread_after(self, lp: int, persist: dict[int, list[Msg]]) -> bool:
        """Whether persist[lp] has records fetched (as far as the consumer knows) and unread
        once this poll's are read."""
        key = (NS.persist, lp)
        high = self.kafka.cached_high[key]
        if lp in persist:
            return high > persist[lp][-1].offset() + 1
        return high < 0 or high > self.kafka.delivered.get(key, self.positions[key])

    @invariant()
    def each_event_once_in_order(self) -> None:
        for lp, offsets in self.folded.items():
            assert offsets == list(range(len(offsets))), f"acks[{lp}] folded {offsets}"

    def teardown(self) -> None:
        """The source and the tasks stopped: everything is read in the end."""
        for _ in range(1_000):
            for key in self.kafka.logs:
                self.kafka.fetch(key, 1_000)
            self.poll(1_000)
            if all(len(self.folded[lp]) == len(self.kafka.logs[(NS.acks, lp)]) for lp in range(P)) and not self.kafka.queue:
                break
        for lp in range(P):
            assert len(self.folded[lp]) == len(self.kafka.logs[(NS.acks, lp)]), f"acks[{lp}] not all folded"
        self.each_event_once_in_order()


TestReadingOrder = ReadingMachine.TestCase
TestReadingOrder.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
