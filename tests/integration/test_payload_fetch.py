"""Replay payloads read back from ``ns.persist`` on a real broker, after an acker restart
(the new process has an empty payload cache, so every replay reads its payload):

- a persist record below the log start offset (``delete_records``) is dead-lettered as lost,
  and every other record is still replayed;
- 20 000 timeouts at once are all replayed by short commits (bulk reads, bounded per
  commit), and the acker keeps its partitions: no commit comes near ``max.poll.interval.ms``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from broker import ids, topics
from broker.acker import Acker, AckerConfig
from broker.dev.testing import unique_name
from broker.headers import H_REASON, H_SOURCE, outcome_of
from broker.kafka_io import read_to_end
from broker.ledger.clock import Clock, SystemClock
from broker.settings import KafkaSettings
from broker.source import Source, SourceConfig

pytestmark = pytest.mark.integration

P = 2


class LaterClock(SystemClock):
    """The system clock, ``ahead_ms`` ahead: every deadline restored from the changelog has
    passed at once, nothing sleeps, and the replays' own deadlines are far away."""

    def __init__(self, ahead_ms: int) -> None:
        self.ahead_ms = ahead_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.ahead_ms


class Running:
    """An acker in a thread; counts its commits' durations and its partition losses."""

    def __init__(
        self, settings: KafkaSettings, ns: topics.Namespace, clock: Clock | None = None, watch_ms: int | None = None,
    ) -> None:
        config = AckerConfig(instance_id=unique_name("a"), stats_interval_ms=3_600_000, watch_ms=watch_ms)
        self.acker = acker = Acker(settings, ns, config, clock=clock)
        self.commit_seconds: list[float] = []
        self.revoked = 0
        commit, revoke, lost = acker.commit, acker.assignment.on_revoke, acker.assignment.on_lost

        def timed_commit() -> None:
            started = time.monotonic()
            commit()
            self.commit_seconds.append(time.monotonic() - started)

        def on_revoke(*args: object) -> None:
            self.revoked += 1
            revoke(*args)  # type: ignore[arg-type]

        def on_lost(*args: object) -> None:
            self.revoked += 1
            lost(*args)  # type: ignore[arg-type]

        acker.commit = timed_commit  # type: ignore[method-assign]
        acker.assignment.commit = timed_commit  # what a revocation commits
        acker.assignment.on_revoke = on_revoke  # type: ignore[method-assign]
        acker.assignment.on_lost = on_lost  # type: ignore[method-assign]
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.acker.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            self.errors.append(exc)

    def wait(self, done: Callable[[Acker], bool], what: str, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not done(self.acker):
            assert not self.errors, f"the acker died: {self.errors[0]!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.acker.counters()}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.acker.stop()
        self.thread.join(60)
        assert not self.errors, f"the acker died: {self.errors[0]!r}"


@pytest.fixture
def ns(bootstrap: str) -> Iterator[tuple[KafkaSettings, topics.Namespace, str]]:
    settings = KafkaSettings.from_env(bootstrap)
    namespace = topics.Namespace(unique_name("payload"))
    data = f"{namespace.name}.orders"
    topics.create(settings, namespace, P, {data: 2})
    yield settings, namespace, data


TIMEOUT_MS = 60_000


def register_then_stop(settings: KafkaSettings, ns: topics.Namespace, data: str, n: int) -> None:
    """Send ``n`` records that nobody acks, let an acker register them and stop (long before
    they time out)."""
    first = Running(settings, ns)
    first.wait(lambda a: len(a.states) == P, "the first acker's assignment", 60)
    # retry=None: replayed as soon as they are decided - a back-off would keep the payloads read
    # while they wait in the cache, and the fetches are what these tests count
    source = Source(settings, ns, SourceConfig(timeout_ms=TIMEOUT_MS, max_attempts=3, retry=None))
    for i in range(n):
        source.send(data, f"k{i % 101}", b"v%d" % i)
    source.flush()
    source.close()
    first.wait(lambda a: a.counters()["registered"] >= n, "registration", 60)
    first.stop()
    assert first.acker.counters()["timed_out"] == 0


def outcomes(settings: KafkaSettings, ns: topics.Namespace) -> dict[int, bytes | None]:
    return {
        ids.decode_id(m.key()): outcome_of(m.headers())
        for m in read_to_end(settings, ns.persist, P)
        if m.value() is None
    }


def test_a_payload_below_the_log_start_is_dead_lettered_and_the_rest_replayed(
    ns: tuple[KafkaSettings, topics.Namespace, str], bootstrap: str
) -> None:
    settings, namespace, data = ns
    n = 60
    register_then_stop(settings, namespace, data, n)
    # the oldest persist record of partition 0 goes: the log now starts after it
    persisted = read_to_end(settings, namespace.persist, P)
    lost = min((m for m in persisted if m.partition() == 0), key=lambda m: m.offset())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Kafka refuses delete_records on a compact-only topic: allow it for a moment
    for policy in ("compact,delete", None):
        if policy is None:
            tp = TopicPartition(namespace.persist, 0, lost.offset() + 1)
            for attempt in range(100):  # until the broker applied the policy
                try:
                    for future in admin.delete_records([tp]).values():
                        future.result(30)
                    break
                except KafkaException:
                    if attempt == 99:
                        raise
                    time.sleep(0.1)
            policy = "compact"
        resource = ConfigResource(ResourceType.TOPIC, namespace.persist, incremental_configs=[
            ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

    # All timed out; the lost one is held while an earlier attempt's window could be open
    # (fate.LOST: its history went with its payload), here 2 s, then dead-lettered.
    second = Running(settings, namespace, LaterClock(TIMEOUT_MS + 1_000), watch_ms=2_000)
    try:
        second.wait(lambda a: a.counters()["replayed"] + a.counters().get("payload_lost", 0) >= n, "the decisions", 60)
    finally:
        second.stop()
    srid = ids.decode_id(lost.key())
    done = outcomes(settings, namespace)
    assert done.pop(srid) == b"dlq"
    assert len(done) == n - 1 and set(done.values()) == {b"replay"}
    [dead] = read_to_end(settings, namespace.dlq, 1)
    headers = dict(dead.headers() or ())
    assert dead.key() == lost.key() and dead.value() is None
    assert (headers[H_REASON] or b"").startswith(b"payload lost: ")
    assert headers[H_SOURCE] == f"{namespace.persist}/0/{lost.offset()}".encode()
    assert len(read_to_end(settings, topics.replay_topic(data), 2)) == n - 1


def test_20000_timeouts_after_a_restart_are_replayed_by_short_commits(
    ns: tuple[KafkaSettings, topics.Namespace, str],
) -> None:
    settings, namespace, data = ns
    n = 20_000
    register_then_stop(settings, namespace, data, n)

    # restores 20 000 entries, all timed out; its payload cache is empty
    second = Running(settings, namespace, LaterClock(TIMEOUT_MS + 1_000))
    started = time.monotonic()
    try:
        second.wait(lambda a: a.counters()["replayed"] >= n, "every replay", 60)
    finally:
        second.stop()
    seconds = time.monotonic() - started
    c = second.acker.counters()
    print(f"\n20 000 replays in {seconds:.1f}s, longest commit {max(second.commit_seconds):.2f}s, "
          f"{len(second.commit_seconds)} commits, {c['payload_fetches']} payloads fetched")
    assert (c["timed_out"], c["replayed"]) == (n, n)
    assert c["payload_fetches"] > 0.9 * n  # the rest: read, then held back for order (cached)
    assert second.revoked == 1  # only the final stop: never evicted
    assert max(second.commit_seconds) < 20  # max.poll.interval.ms is 60 s
    assert len(read_to_end(settings, topics.replay_topic(data), 2)) == n
