"""Partition numbers in log lines: compact ranges and a count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ranges import counted, expand, ranges


@pytest.mark.parametrize(("numbers", "shown"), [
    ([], "[]"),
    ([3], "[3]"),
    ([0, 1], "[0-1]"),
    ([600, *range(500)], "[0-499, 600]"),
    ([5, 1, 2, 3, 9, 7, 8, 3], "[1-3, 5, 7-9]"),
])
def test_runs_of_consecutive_numbers_are_one_range(numbers: list[int], shown: str) -> None:
    assert ranges(numbers) == shown


def test_counted_says_how_many() -> None:
    assert counted([*range(1000)]) == "1000 [0-999]"
    assert counted(iter([4, 2, 2])) == "2 [2, 4]"
    assert counted([]) == "0 []"


@given(st.sets(st.integers(min_value=0, max_value=2_000)))
def test_expand_reads_back_what_ranges_wrote(numbers: set[int]) -> None:
    assert expand(ranges(numbers)) == sorted(numbers)
