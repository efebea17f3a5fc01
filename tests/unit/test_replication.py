"""How many replicas a namespace's topics get, by cluster size (broker.topics.replication_for)."""

from __future__ import annotations

import pytest

from broker.errors import TopologyError
from broker.topics import replication_for


def test_three_brokers_or_more_get_three_replicas_and_two_in_sync() -> None:
    for brokers in (3, 5):
        rep = replication_for(brokers)
        assert (rep.factor, rep.min_insync, rep.warning) == (3, 2, None)


@pytest.mark.parametrize("brokers", [1, 2])
def test_a_smaller_cluster_gets_one_replica_and_a_warning_naming_the_risk(brokers: int) -> None:
    rep = replication_for(brokers)
    assert (rep.factor, rep.min_insync) == (1, 1)
    assert rep.warning is not None and "lost" in rep.warning and "3 brokers" in rep.warning


def test_explicit_values_win_and_are_checked() -> None:
    assert replication_for(3, 2, 1).factor == 2
    assert replication_for(3, 2, 1).warning is not None  # one in-sync replica: a named risk
    with pytest.raises(TopologyError, match="at least 3 brokers"):
        replication_for(1, 3)
    with pytest.raises(TopologyError, match=r"min\.insync\.replicas"):
        replication_for(3, 3, 4)
    assert replication_for(3, 3).min_insync == 2
    assert replication_for(3, 1).min_insync == 1
