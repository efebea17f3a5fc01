"""The pure parts of bench.scale: Zipf keys, how evenly work is split, who owns what by an
acker's log, commit times from its metrics, a task's longest pause."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.bench.keys import spread, zipf_indices, zipf_weights
from broker.bench.scale import _COMMIT, owned
from broker.bench.scale_join import _gap_ms
from broker.bench.workers import _keys, record_key


def test_zipf_weights_sum_to_one_and_fall_with_rank() -> None:
    w = zipf_weights(1000, 1.1)
    assert w.sum() == pytest.approx(1.0)
    assert all(w[:-1] >= w[1:])
    assert w[0] / w[1] == pytest.approx(2**1.1)


def test_zipf_exponent_zero_is_uniform() -> None:
    assert zipf_weights(4, 0.0).tolist() == [0.25] * 4


def test_zipf_indices_are_reproducible_and_skewed() -> None:
    a, b = zipf_indices(20_000, 1000, 1.1), zipf_indices(20_000, 1000, 1.1)
    assert (a == b).all()
    assert a.min() >= 0 and a.max() < 1000
    # Rank 1 holds about 1 / H(1000, 1.1) ~ 16 % of the draws; a uniform key 0.1 %.
    assert 0.12 < (a == 0).mean() < 0.2


@pytest.mark.parametrize(
    ("counts", "max_vs_mean", "max_vs_min"),
    [
        ([5, 5, 5, 5], 1.0, 1.0),
        ([1, 3], 1.5, 3.0),
        ([0, 4], 2.0, None),  # an idle one: no finite max/min
        ([0, 0], None, None),
        ([], None, None),
    ],
)
def test_spread(counts: list[int], max_vs_mean: float | None, max_vs_min: float | None) -> None:
    assert spread(counts) == {"max_vs_mean": max_vs_mean, "max_vs_min": max_vs_min}


def test_source_keys() -> None:
    assert _keys({}) is record_key
    taken_in_turn = _keys({"keys": 3})
    assert [taken_in_turn(i) for i in range(4)] == [b"key-0", b"key-1", b"key-2", b"key-0"]
    zipf = _keys({"keys": 100, "zipf_s": 1.1})
    drawn = [zipf(i) for i in range(5000)]
    assert drawn.count(b"key-0") > drawn.count(b"key-50") * 10


def test_owned_follows_the_latest_change(tmp_path: Path) -> None:
    log = tmp_path / "acker.log"
    assert owned(log) == set()
    log.write_text(
        "2026-11-27 12:00:00,001 INFO broker.acker: acker x serving ns (P=8)\n"
        "2026-11-27 12:00:01,002 INFO broker.acker: assigned ledger partitions 8 [0-7] (owning 8 [0-7]): "
        "0 from standby/warm state, 0 changelog records read, 0 entries, 0.100s\n"
        "2026-11-27 12:00:05,003 INFO broker.acker: revoked ledger partitions 4 [4-7] (owning 4 [0-3])\n"
    )
    assert owned(log) == {0, 1, 2, 3}
    with log.open("a") as f:
        f.write("2026-11-27 12:00:09,004 WARNING broker.acker: lost ledger partitions 2 [0, 2] (owning 2 [1, 3])\n")
    assert owned(log) == {1, 3}


def test_commit_histogram_totals() -> None:
    text = (
        "# TYPE replaybroker_acker_commit_duration_seconds histogram\n"
        'replaybroker_acker_commit_duration_seconds_bucket{le="0.01"} 3.0\n'
        "replaybroker_acker_commit_duration_seconds_count 12.0\n"
        "replaybroker_acker_commit_duration_seconds_sum 0.25\n"
    )
    assert {m.group(1): float(m.group(2)) for m in _COMMIT.finditer(text)} == {"count": 12.0, "sum": 0.25}


def test_gap_counts_the_edges() -> None:
    assert _gap_ms([1.1, 1.2, 1.9], 1.0, 2.0) == pytest.approx(700)
    assert _gap_ms([], 1.0, 1.5) == pytest.approx(500)  # nothing handled: the whole span
    assert _gap_ms([0.5, 1.05, 3.0], 1.0, 1.1) == pytest.approx(50)  # outside the span: ignored


def test_scale_runs_only_when_named_and_reports_the_issue_figures() -> None:
    from broker.bench.figures import DEFAULT_SECTIONS, SECTIONS, SPECS

    assert "scale" in SECTIONS and "scale" not in DEFAULT_SECTIONS
    targets = {
        "scale.acker_cpu_4_vs_1": ("<=", 1.25),
        "scale.cpu_p1000_vs_p16": ("<=", 1.5),
        "scale.status_p1000_s": ("<=", 2.0),
        "scale.task_join_max_gap_ms": ("<=", 1000.0),
        "scale.takeover_standby_s": ("<=", 5.0),
    }
    assert {key: SPECS[key].target for key in targets} == targets
    assert SPECS["scale.task_join_max_gap_ms_eager"].target is None
