"""``replaybroker kafka down --run-dir DIR`` stops what ``kafka up`` started in DIR, whichever
kind its state file records - a cluster (``--brokers N``: ``cluster.json``) or one node
(``state.json``) - whatever ``--brokers`` says. Stand-in processes play the nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from broker.cli import main
from broker.dev.kafka_cluster import ClusterState, recorded_kafka
from broker.dev.kafka_local import BrokerState, _pid_alive


@pytest.fixture
def nodes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def record_cluster(run_dir: Path, pids: list[int]) -> ClusterState:
    state = ClusterState(pids, [1, 2, 3], [4, 5, 6], "127.0.0.1:1", str(run_dir), "4.0.0", "c", 0.0)
    (run_dir / "cluster.json").write_text(json.dumps(asdict(state)))
    return state


def record_node(run_dir: Path, pid: int) -> BrokerState:
    state = BrokerState(pid, "127.0.0.1:1", 1, 2, str(run_dir), "4.0.0", "c", 0.0)
    (run_dir / "state.json").write_text(json.dumps(asdict(state)))
    return state


def test_the_state_of_either_kind_is_found(tmp_path: Path) -> None:
    assert recorded_kafka(tmp_path) is None
    node = record_node(tmp_path, 1)
    assert recorded_kafka(tmp_path) == node
    cluster = record_cluster(tmp_path, [1, 2, 3])
    assert recorded_kafka(tmp_path) == cluster
    (tmp_path / "cluster.json").write_text("not json")
    assert recorded_kafka(tmp_path) == node


@pytest.mark.parametrize("brokers", [[], ["--brokers", "3"]], ids=["default", "brokers-3"])
def test_down_with_a_run_dir_stops_the_cluster_started_there(
    tmp_path: Path, nodes: list[subprocess.Popen[bytes]], brokers: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    record_cluster(tmp_path, [p.pid for p in nodes])
    assert main(["kafka", "down", "--run-dir", str(tmp_path), *brokers]) == 0
    assert capsys.readouterr().out == "stopped\n"
    assert not any(_pid_alive(p.pid) for p in nodes)
    assert not (tmp_path / "cluster.json").exists()
    assert main(["kafka", "down", "--run-dir", str(tmp_path), *brokers]) == 0
    assert capsys.readouterr().out == "not running\n"


@pytest.mark.parametrize("brokers", [[], ["--brokers", "3"]], ids=["default", "brokers-3"])
def test_down_with_a_run_dir_stops_the_node_started_there(
    tmp_path: Path, nodes: list[subprocess.Popen[bytes]], brokers: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    record_node(tmp_path, nodes[0].pid)
    assert main(["kafka", "down", "--run-dir", str(tmp_path), *brokers]) == 0
    assert capsys.readouterr().out == "stopped\n"
    assert not _pid_alive(nodes[0].pid) and _pid_alive(nodes[1].pid)
    assert not (tmp_path / "state.json").exists()
