"""The embedded broker is a real Kafka: round trips with headers, real log compaction, and a
CLI that starts it detached, reports it, and stops it without leaving processes behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from broker.dev import kafka_cluster, kafka_local
from broker.dev.testing import unique_name

pytestmark = pytest.mark.integration


def _read_all(bootstrap: str, topic: str, partitions: int = 1) -> list:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("g"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages, eof = [], set()
    deadline = time.monotonic() + 30
    while len(eof) < partitions and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == -191:  # _PARTITION_EOF
                eof.add(msg.partition())
                continue
            raise AssertionError(msg.error())
        messages.append(msg)
    consumer.close()
    assert len(eof) == partitions, "did not reach the end of the topic"
    return messages


def test_round_trip_with_headers(bootstrap: str, new_topic) -> None:
    topic = new_topic(partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent = {}
    for i in range(300):
        key, value = f"k{i}".encode(), f"v{i}".encode()
        headers = [("rb-attempt", str(i % 5).encode()), ("trace", b"\x00\xff")]
        producer.produce(topic, key=key, value=value, headers=headers)
        sent[key] = (value, headers)
    assert producer.flush(30) == 0
    got = _read_all(bootstrap, topic, partitions=3)
    assert len(got) == 300
    for msg in got:
        value, headers = sent[msg.key()]
        assert msg.value() == value
        assert msg.headers() == headers


def test_compaction_removes_old_values_and_tombstoned_keys(bootstrap: str, new_topic) -> None:
    topic = new_topic(
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
            "min.compaction.lag.ms": "0",
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap})
    for version in range(3):
        producer.produce(topic, key=b"kept", value=f"v{version}".encode())
    producer.produce(topic, key=b"gone", value=b"x")
    producer.produce(topic, key=b"gone", value=None)  # tombstone
    producer.flush(30)

    deadline = time.monotonic() + 90
    while True:
        # Only closed segments are cleaned: keep rolling the active one with a filler record.
        time.sleep(0.3)
        producer.produce(topic, key=b"filler", value=b"f")
        producer.flush(30)
        keys = [(m.key(), m.value()) for m in _read_all(bootstrap, topic)]
        if (b"kept", b"v0") not in keys and not any(k == b"gone" for k, _ in keys):
            break
        assert time.monotonic() < deadline, f"compaction not observed: {keys[:12]}"
    assert (b"kept", b"v2") in keys


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def _java_kafka_processes(run_dir: Path) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "kafka.Kafka" in line and str(run_dir) in line]


def test_cli_up_twice_then_down_leaves_no_broker(tmp_path: Path) -> None:
    run_dir = tmp_path / "kafka"
    env = dict(os.environ)
    first = _cli("kafka", "up", "--run-dir", str(run_dir), env=env)
    assert first.returncode == 0, first.stderr
    bootstrap = first.stdout.strip().splitlines()[-1]
    assert bootstrap.startswith("127.0.0.1:")
    try:
        second = _cli("kafka", "up", "--run-dir", str(run_dir), env=env)
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip().splitlines()[-1] == bootstrap
        assert "already running" in second.stderr
        assert len(_java_kafka_processes(run_dir)) == 1
        status = _cli("kafka", "status", "--run-dir", str(run_dir), env=env)
        assert status.returncode == 0 and bootstrap in status.stdout
    finally:
        down = _cli("kafka", "down", "--run-dir", str(run_dir), env=env)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert _java_kafka_processes(run_dir) == []
    assert kafka_local.running_state(run_dir) is None
    assert _cli("kafka", "status", "--run-dir", str(run_dir), env=env).returncode == 1


def test_cli_down_by_run_dir_stops_a_cluster(tmp_path: Path) -> None:
    """`kafka down --run-dir DIR` stops the cluster `kafka up --brokers 3 --run-dir DIR` started,
    without being told --brokers again."""
    run_dir = tmp_path / "cluster"
    env = dict(os.environ)
    up = _cli("kafka", "up", "--brokers", "3", "--run-dir", str(run_dir), env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert len(_java_kafka_processes(run_dir)) == 3
    finally:
        down = _cli("kafka", "down", "--run-dir", str(run_dir), env=env)
        left = kafka_cluster.read_cluster_state(run_dir)
        if left is not None:  # down missed it: leave no cluster behind
            kafka_cluster.LocalCluster(len(left.pids), run_dir).stop()
    assert down.returncode == 0 and down.stdout == "stopped\n", (down.stdout, down.stderr)
    assert _java_kafka_processes(run_dir) == []
    assert not (run_dir / "cluster.json").exists()
