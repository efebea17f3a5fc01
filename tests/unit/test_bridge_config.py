"""The bridge's command line and pure parts: the cluster is always an explicit choice, -v shows
the effective configuration, fencing is recognised through ``Source``'s wrapping, and the
defaults name what the docs say (nothing here talks to Kafka)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

import broker.cli
from broker.bridge import BridgeConfig, _fenced, default_target
from broker.errors import ConfigurationError, DeliveryError, KafkaUnreachable
from broker.settings import KafkaSettings

BRIDGE = ["bridge", "--namespace", "ns", "--from", "clicks"]


def test_without_a_cluster_it_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env
    assert broker.cli.main(BRIDGE) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"replaybroker: {broker.cli.NO_CLUSTER}"]


def test_v_prints_the_effective_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def unreachable(settings: KafkaSettings, *, verbose: bool = False, wait_s: float = 0.0) -> None:
        raise KafkaUnreachable("stopped after the configuration was printed")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "hunter2-secret")
    assert broker.cli.main(["-v", *BRIDGE, "--bootstrap", "h:9092"], reach=unreachable) == 2
    err = capsys.readouterr().err
    assert "replaybroker bridge: effective Kafka configuration" in err
    assert "hunter2-secret" not in err


def test_the_parser_takes_every_option() -> None:
    args = broker.cli.build_parser().parse_args(
        [*BRIDGE, "--to", "t", "--group", "g", "--instance-id", "b1", "--batch-records", "10", "--batch-ms", "5",
         "--session-timeout-ms", "6000", "--timeout-ms", "1000", "--max-attempts", "2", "--partitioner", "spark",
         "--unsafe-commit"]
    )
    assert (args.from_topic, args.to, args.group, args.instance_id) == ("clicks", "t", "g", "b1")
    assert (args.batch_records, args.batch_ms, args.partitioner, args.unsafe_commit) == (10, 5, "spark", True)
    defaults = broker.cli.build_parser().parse_args(BRIDGE)
    assert (defaults.to, defaults.batch_records, defaults.batch_ms, defaults.unsafe_commit) == (None, 1000, 100, False)


def test_defaults_and_limits() -> None:
    assert default_target("clicks") == "clicks.guaranteed"
    with pytest.raises(ConfigurationError):
        BridgeConfig("clicks", batch_records=0)


@pytest.mark.parametrize(
    ("code", "fenced"),
    [(KafkaError.PRODUCER_FENCED, True), (KafkaError._FENCED, True), (KafkaError.FENCED_INSTANCE_ID, True),
     (KafkaError.ILLEGAL_GENERATION, False), (KafkaError._TIMED_OUT, False)],
)
def test_fencing_is_seen_through_the_sources_delivery_error(code: int, fenced: bool) -> None:
    """A failed commit reaches the bridge as Source's DeliveryError, the Kafka error its cause."""
    try:
        try:
            raise KafkaException(KafkaError(code))
        except KafkaException as exc:
            raise DeliveryError("transaction aborted") from exc
    except DeliveryError as wrapped:
        assert _fenced(wrapped) is fenced
    assert _fenced(KafkaException(KafkaError(code))) is fenced
