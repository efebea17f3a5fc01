"""The latency estimator of adaptive timeouts (broker.ledger.adaptive): convergence, the window
forgetting after a shift, fixed memory, the clamp, and the registration runs that give an
entry's latency from its persist offset."""

from __future__ import annotations

import numpy as np
import pytest

from broker.ledger.adaptive import (
    BUCKETS,
    MAX_TOPICS,
    AdaptivePolicy,
    AdaptiveTimeouts,
    AutoRegistrations,
    LatencyWindow,
    bucket_of,
    upper_edge_ms,
)

T0 = 1_700_000_000_000


@pytest.mark.parametrize("q", [0.5, 0.99, 0.999])
@pytest.mark.parametrize("scale_ms", [3.0, 250.0, 40_000.0])
def test_quantile_is_at_or_above_the_sample_quantile_by_at_most_one_bucket(q: float, scale_ms: float) -> None:
    rng = np.random.default_rng(7)
    lat = rng.lognormal(np.log(scale_ms), 0.6, 20_000)
    w = LatencyWindow(window_ms=10_000, slots=10)
    for chunk in np.array_split(lat, 20):  # batches, as the acker adds them
        w.add(chunk, T0)
    est = w.quantile(q, T0)
    exact = float(np.quantile(lat, q, method="inverted_cdf"))
    assert est is not None
    assert exact <= est <= exact * 2 ** (1 / 8) * 1.0001


def test_a_rise_shows_at_once_and_a_fall_after_one_window() -> None:
    w = LatencyWindow(window_ms=8_000, slots=8)
    now = T0
    for _ in range(8):  # 8 s of 100 ms latencies
        w.add(np.full(1_000, 100.0), now)
        now += 1_000
    assert w.quantile(0.999, now) == pytest.approx(upper_edge_ms(int(bucket_of(np.array([100.0]))[0])))
    w.add(np.full(100, 500.0), now)  # the task slows down: 1 % slow completions are enough
    assert w.quantile(0.999, now) >= 500
    for _ in range(9):  # fast again: the slow ones leave with their slot
        now += 1_000
        w.add(np.full(1_000, 100.0), now)
    assert w.quantile(0.999, now) < 120


def test_an_idle_window_empties_and_a_clock_that_goes_back_forgets_nothing() -> None:
    w = LatencyWindow(window_ms=4_000, slots=4)
    w.add(np.full(10, 50.0), T0)
    assert w.samples(T0 - 60_000) == 10  # a wall clock stepped back: nothing rotates
    assert w.samples(T0 + 3_999) == 10
    assert w.samples(T0 + 4_000 + 1_000) == 0
    assert w.quantile(0.999, T0 + 10**9) is None


def test_memory_is_fixed_and_any_latency_has_a_bucket() -> None:
    w = LatencyWindow(window_ms=20_000, slots=10)
    size = w.counts.nbytes
    w.add(np.array([-5, 0, 0.3, 1, 2**40, np.iinfo(np.int64).max], dtype=np.float64), T0)
    for i in range(50):
        w.add(np.random.default_rng(i).uniform(0, 10**6, 10_000), T0 + i * 100)
    assert w.counts.nbytes == size == 10 * BUCKETS * 8
    b = bucket_of(np.array([-5, 0, 1, 2**40]))
    assert b.min() == 0 and b.max() == BUCKETS - 1


def test_timeout_is_clamped_and_initial_until_enough_samples() -> None:
    policy = AdaptivePolicy(floor_ms=1_000, ceiling_ms=60_000, safety_factor=3, min_samples=100, initial_ms=20_000)
    a = AdaptiveTimeouts(policy)
    t = a.topic_id(b"orders")
    assert a.timeout_ms(t, T0) == 20_000  # nothing known
    a.observe(np.full(99, t), np.full(99, 2_000.0), T0)
    assert a.timeout_ms(t, T0) == 20_000  # 99 < min_samples
    a.observe(np.full(1, t), np.full(1, 2_000.0), T0)
    q = upper_edge_ms(int(bucket_of(np.array([2_000.0]))[0]))
    assert a.timeout_ms(t, T0) == int(np.ceil(3 * q))  # 3 x ~2 s
    a.observe(np.full(1_000, t), np.full(1_000, 5.0), T0 + 100_000)  # the old ones left the window
    assert a.timeout_ms(t, T0 + 100_000) == 1_000  # floor
    a.observe(np.full(1_000, t), np.full(1_000, 90_000.0), T0 + 100_000)
    assert a.timeout_ms(t, T0 + 100_000) == 60_000  # ceiling
    assert AdaptivePolicy(initial_ms=None, ceiling_ms=5_000).initial == 5_000


def test_deadlines_are_per_topic_and_counted() -> None:
    a = AdaptiveTimeouts(AdaptivePolicy(floor_ms=100, ceiling_ms=50_000, min_samples=10, initial_ms=7_000))
    fast, slow = a.topic_id(b"fast"), a.topic_id(b"slow")
    assert a.topic_id(b"fast") == fast
    a.observe(np.array([fast] * 10 + [slow] * 10), np.array([10.0] * 10 + [1_000.0] * 10), T0)
    d = a.deadlines(np.array([fast, slow, fast, a.topic_id(b"new")]), T0)
    assert d[0] == d[2] < d[1] and d[0] - T0 == 100  # floor: 3 x ~10 ms
    assert d[3] - T0 == 7_000
    e = a.estimates(T0)
    assert (e["fast"].given, e["slow"].given, e["new"].given, e["new"].quantile_ms) == (2, 1, 1, None)
    assert "fast:p99.9=" in a.summary(T0) and "given=2" in a.summary(T0)


def test_made_up_topics_beyond_the_limit_share_one_estimate() -> None:
    a = AdaptiveTimeouts()
    ids = {a.topic_id(f"t{i}".encode()) for i in range(MAX_TOPICS + 50)}
    assert len(ids) == MAX_TOPICS + 1 and len(a.names) == MAX_TOPICS + 1 and a.names[-1] == "*"


def test_registration_runs_give_each_entry_its_time_and_topic() -> None:
    runs = AutoRegistrations()
    runs.note(np.array([0, 1, 2]), np.array([-1, -1, -1], np.int32), T0)
    assert len(runs) == 0  # no auto record ever: nothing kept
    runs.note(np.array([3, 4, 5, 6]), np.array([0, 0, -1, 1], np.int32), T0 + 10)
    runs.note(np.array([7, 9]), np.array([-1, -1], np.int32), T0 + 20)
    runs.note(np.array([9, 10]), np.array([0, 0], np.int32), T0 + 30)  # 9 again (a rewind): ignored
    tids, ms = runs.lookup(np.array([2, 3, 4, 5, 6, 7, 9, 10, 99]))
    assert tids.tolist() == [-1, 0, 0, -1, 1, -1, -1, 0, 0]
    known = tids >= 0
    assert ms[known].tolist() == [T0 + 10, T0 + 10, T0 + 10, T0 + 30, T0 + 30]
    runs.drop_below(6)  # the oldest pending entry's offset
    assert runs.lookup(np.array([6, 10]))[0].tolist() == [1, 0]
    assert runs.lookup(np.array([3]))[0].tolist() == [-1]  # forgotten: no sample
    runs.drop_below(-1)
    assert len(runs) == 0


def test_registration_runs_grow_with_batches_not_entries() -> None:
    runs = AutoRegistrations()
    for b in range(1_000):  # 1 000 batches of 1 000 auto records of one topic
        runs.note(np.arange(b * 1_000, (b + 1) * 1_000), np.zeros(1_000, np.int32), T0 + b)
    assert len(runs) == 1_000 and runs.nbytes < 64 * 1_000
    tids, ms = runs.lookup(np.array([0, 999_999]))
    assert tids.tolist() == [0, 0] and ms.tolist() == [T0, T0 + 999]


def test_observe_offsets_adds_latency_since_registration() -> None:
    a = AdaptiveTimeouts(AdaptivePolicy(min_samples=1))
    t = a.topic_id(b"orders")
    runs = AutoRegistrations()
    runs.note(np.array([10, 11, 12]), np.array([t, -1, t], np.int32), T0)
    assert a.observe_offsets(runs, np.array([10, 11, 12]), T0 + 400) == 2
    assert a.estimates(T0 + 400)["orders"].samples == 2
    q = a.estimates(T0 + 400)["orders"].quantile_ms
    assert q is not None and 400 <= q < 400 * 1.1


def test_the_odd_timeout_is_a_drop_but_many_are_a_slow_down() -> None:
    a = AdaptiveTimeouts(AdaptivePolicy(floor_ms=100, min_samples=100, timeout_share=0.01))
    t = a.topic_id(b"orders")
    a.observe(np.full(1_000, t), np.full(1_000, 200.0), T0)
    fast = a.timeout_ms(t, T0)
    a.observe(np.full(5, t), np.full(5, fast + 50.0), T0, timed_out=True)  # 0.5 %: dropped records
    assert a.timeout_ms(t, T0) == fast
    a.observe(np.full(20, t), np.full(20, fast + 50.0), T0, timed_out=True)  # 2.5 %: slowness
    assert a.timeout_ms(t, T0) >= 3 * fast
    assert a.estimates(T0)["orders"].samples == 1_025
