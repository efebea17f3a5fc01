"""A zombie acker must not commit: an instance that stalled past max.poll.interval.ms while
another member took its partitions over still holds its tables and may still decide
something (here: timeouts). Its transaction carries the input offsets of every partition it
thinks it owns, so the group coordinator refuses it (unknown member / old generation) and
nothing it wrote becomes visible."""

from __future__ import annotations

import threading
import time

import pytest

from broker import topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.headers import outcome_of
from broker.kafka_io import read_to_end
from broker.ledger.clock import ManualClock
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig

pytestmark = pytest.mark.integration

P = 2
N = 200
# A stalls past its max.poll.interval.ms; its session timeout (a setting of the group with
# the consumer protocol) is the broker's minimum, 6 s.
SHORT = {"max.poll.interval.ms": 6_000}


def test_an_acker_that_lost_its_partitions_cannot_commit(bootstrap: str) -> None:
    settings = KafkaSettings(bootstrap)
    ns = topics.Namespace(unique_name("zombie"))
    data = f"{ns.name}.orders"
    topics.create(settings, ns, P, {data: P})
    source = Source(settings, ns, SourceConfig(timeout_ms=600_000))
    for i in range(N):
        source.send(data, f"k{i}", b"v")
    source.close()

    # A runs on a stepped clock: its entries time out only when the test says so, while B
    # (wall clock) keeps them pending for ten minutes.
    clock = ManualClock(int(time.time() * 1000))
    a = Acker(settings, ns, AckerConfig(instance_id=unique_name("a"), consumer=SHORT, session_timeout_ms=6_000, stats_interval_ms=3_600_000), clock=clock)
    b = Acker(settings, ns, AckerConfig(instance_id=unique_name("b"), stats_interval_ms=3_600_000))
    b_done = threading.Event()
    b_thread = threading.Thread(target=b.run, kwargs={"until": lambda _b: b_done.is_set()}, daemon=True)
    seen: dict[str, object] = {}

    def stall_then_commit(acker: Acker) -> bool:
        if acker.counters()["registered"] < N:
            return False
        acker.commit()  # everything read so far is committed: no new input positions
        seen["commits_before"] = acker.commits
        # The stall: A stops polling. B joins; after A's max.poll.interval.ms A is out of
        # the group and B owns every partition.
        b_thread.start()
        deadline = time.monotonic() + 60
        while len(b.states) < P:
            assert time.monotonic() < deadline, "B never took the partitions over"
            time.sleep(0.1)
        assert len(acker.states) == P  # A has not noticed: it polls no more
        seen["b_entries"] = b.last_assignment["entries"]
        clock.advance(700_000)  # A's entries are past their deadline: it decides N replays
        acker.commit()  # the zombie's commit
        seen["commits_after"] = acker.commits
        return True

    try:
        a.run(until=stall_then_commit)
    finally:
        b_done.set()
        b_thread.join(60)

    replays = read_to_end(settings, topics.replay_topic(data), P)
    outcomes = [outcome_of(m.headers()) for m in read_to_end(settings, ns.persist, P) if m.value() is None]
    assert replays == [] and outcomes == [], (
        f"zombie writes are visible: {len(replays)} replays, {len(outcomes)} persist tombstones"
    )
    assert seen["commits_after"] == seen["commits_before"]
    assert seen["b_entries"] == N  # B took over A's committed state, every entry pending
