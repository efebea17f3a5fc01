"""Service and admin commands never pick a cluster by themselves: ``--bootstrap``,
``KAFKA_BOOTSTRAP_SERVERS`` or ``--local`` (the embedded Kafka of ``replaybroker kafka up``),
else one line on stderr and a non-zero exit - even while an embedded Kafka runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import broker.acker
import broker.cli
import broker.dev.kafka_local
import broker.dlq
import broker.status
import broker.topics
from broker.cli import Calls, main
from broker.dev import kafka_cluster, kafka_local, kafka_sasl
from broker.dev.kafka_cluster import ClusterState
from broker.dev.kafka_local import BrokerState

EMBEDDED = BrokerState(1, "127.0.0.1:19092", 19092, 19093, "/tmp/run", "4.0.0", "c", 0.0)
SECURED = BrokerState(2, "127.0.0.1:29092", 29092, 29093, "/tmp/run-sasl", "4.0.0", "c", 0.0)

COMMANDS = [
    ["status", "--namespace", "ns"],
    ["acker", "--namespace", "ns"],
    ["topics", "check", "--namespace", "ns"],
    ["dlq", "list", "--namespace", "ns"],
]


class Used(list[str]):
    """The bootstrap servers each command went on to use; ``calls``: what the commands run,
    recording them (nothing talks to Kafka)."""

    def __init__(self) -> None:
        super().__init__()
        used = self

        def record(settings: Any, *_a: Any, **_k: Any) -> Any:
            used.append(settings.bootstrap_servers)
            return {"sources": {}}

        class Acker:
            def __init__(self, settings: Any, *_a: Any, **_k: Any) -> None:
                record(settings)

            def run(self, **_k: Any) -> None:
                pass

        self.calls = Calls(status=record, acker=Acker, topics_check=record, check_replication=lambda *_a: ([], []),
                           dlq_entries=lambda s, *_a: record(s) and [])


@pytest.fixture
def clusters_used(monkeypatch: pytest.MonkeyPatch) -> Used:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    return Used()


def answers(*_a: Any, **_k: Any) -> None:
    """The reachability check of a cluster that answers (``main``'s ``reach``)."""


def embedded(monkeypatch: pytest.MonkeyPatch, state: BrokerState | None, *, sasl: BrokerState | None = None,
             cluster: ClusterState | None = None) -> None:
    """What runs from the default run dirs of `kafka up`, `kafka up --sasl` and `--brokers N`."""
    states = {kafka_local.default_run_dir(): state, kafka_sasl.default_sasl_run_dir(): sasl}
    monkeypatch.setattr(kafka_local, "running_state", lambda run_dir: states.get(run_dir))
    monkeypatch.setattr(kafka_cluster, "running_cluster", lambda _run_dir: cluster)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_no_cluster_given_is_refused_even_with_an_embedded_kafka_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clusters_used: Used, command: list[str]
) -> None:
    embedded(monkeypatch, EMBEDDED)
    assert main(command, reach=answers, calls=clusters_used.calls) != 0
    assert clusters_used == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for way in ("--bootstrap", "KAFKA_BOOTSTRAP_SERVERS", "--local"):
        assert way in err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_cluster_given_either_way_is_used(
    monkeypatch: pytest.MonkeyPatch, clusters_used: Used, command: list[str]
) -> None:
    embedded(monkeypatch, EMBEDDED)
    assert main([*command, "--bootstrap", "kafka1:9092"], reach=answers, calls=clusters_used.calls) == 0
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka2:9092")
    assert main(command, reach=answers, calls=clusters_used.calls) == 0
    assert main([*command, "--local"], reach=answers, calls=clusters_used.calls) == 0
    assert clusters_used == ["kafka1:9092", "kafka2:9092", EMBEDDED.bootstrap]


def test_local_without_an_embedded_kafka_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clusters_used: Used
) -> None:
    embedded(monkeypatch, None)
    assert main(["status", "--namespace", "ns", "--local"], reach=answers, calls=clusters_used.calls) != 0
    assert clusters_used == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "kafka up" in err


@pytest.mark.parametrize("verbose", [False, True])
def test_a_kafka_error_during_a_command_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], verbose: bool
) -> None:
    def fail(*_a: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get metadata: Local: Timed out"))

    # Deep inside ``status``: it leaves as a KafkaClientError, and the line stays Kafka's reason.
    monkeypatch.setattr(broker.status, "check", fail)
    assert main([*(["-v"] if verbose else []), "status", "--namespace", "ns", "--bootstrap", "k:9092"], reach=answers) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "replaybroker: status failed: Failed to get metadata: Local: Timed out"
    assert ("Traceback" in err) is verbose


def test_acker_adaptive_settings_from_the_command_line() -> None:
    from broker.cli import acker_config, build_parser

    given = acker_config(build_parser().parse_args(
        ["acker", "--namespace", "ns", "--adaptive-floor-ms", "500", "--adaptive-ceiling-ms", "60000",
         "--adaptive-safety-factor", "2.5"]))
    assert (given.adaptive_floor_ms, given.adaptive_ceiling_ms, given.adaptive_safety_factor) == (500, 60_000, 2.5)
    default = acker_config(build_parser().parse_args(["acker", "--namespace", "ns"]))
    assert (default.adaptive_floor_ms, default.adaptive_ceiling_ms, default.adaptive_safety_factor) == (1_000, 300_000, 3.0)


def test_acker_watch_settings_from_the_command_line() -> None:
    from broker.cli import acker_config, build_parser

    given = acker_config(build_parser().parse_args(
        ["acker", "--namespace", "ns", "--watch-ms", "5000", "--max-watches", "10"]))
    assert (given.watch_ms, given.max_watches) == (5_000, 10)
    default = acker_config(build_parser().parse_args(["acker", "--namespace", "ns"]))
    assert (default.watch_ms, default.max_watches) == (None, 100_000)


def test_local_finds_the_secured_broker_with_its_admin_settings(
    monkeypatch: pytest.MonkeyPatch, clusters_used: Used
) -> None:
    embedded(monkeypatch, None, sasl=SECURED)
    assert broker.cli.connection.connection(broker.cli.build_parser().parse_args(["status", "--namespace", "ns", "--local"])) == (
        SECURED.bootstrap, Path(SECURED.run_dir) / "admin.env"
    )


def test_local_finds_the_local_cluster(monkeypatch: pytest.MonkeyPatch, clusters_used: Used) -> None:
    cluster = ClusterState([1, 2, 3], [39092, 39093, 39094], [39095, 39096, 39097], "127.0.0.1:39092", "/tmp/c",
                           "4.0.0", "c", 0.0)
    embedded(monkeypatch, None, cluster=cluster)
    assert main(["status", "--namespace", "ns", "--local"], reach=answers, calls=clusters_used.calls) == 0
    assert clusters_used == [cluster.bootstrap]


def test_local_with_two_brokers_running_names_both_and_uses_neither(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clusters_used: Used
) -> None:
    embedded(monkeypatch, EMBEDDED, sasl=SECURED)
    assert main(["status", "--namespace", "ns", "--local"], reach=answers, calls=clusters_used.calls) == 2
    err = capsys.readouterr().err
    assert EMBEDDED.bootstrap in err and SECURED.bootstrap in err and "--bootstrap" in err
    assert clusters_used == []
