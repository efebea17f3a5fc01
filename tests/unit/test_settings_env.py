"""Where the connection settings come from: a command's flag wins over the environment, the
environment over a ``.env`` file, that over the defaults; the password never shows."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from broker.cli import print_config
from broker.settings import KafkaSettings

VARIABLES = (
    "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SSL_CA_LOCATION", "KAFKA_CLIENT_ID",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def dotenv(tmp_path: Path) -> Path:
    path = tmp_path / ".env"
    path.write_text(
        "KAFKA_BOOTSTRAP_SERVERS=dotenv:9092\n"
        "KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT\n"
        "KAFKA_SASL_MECHANISM=SCRAM-SHA-512\n"
        "KAFKA_SASL_USERNAME=from-dotenv\n"
        "KAFKA_SASL_PASSWORD=dotenv-secret\n"
    )
    return path


def test_dotenv_fills_what_the_environment_leaves_open(dotenv: Path) -> None:
    s = KafkaSettings.from_env(env_file=dotenv)
    assert s.bootstrap_servers == "dotenv:9092"
    conf = s.client_config()
    assert conf["security.protocol"] == "SASL_PLAINTEXT"
    assert conf["sasl.username"] == "from-dotenv"
    assert conf["sasl.password"] == "dotenv-secret"


def test_environment_wins_over_dotenv(dotenv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "from-env")
    s = KafkaSettings.from_env(env_file=dotenv)
    assert s.bootstrap_servers == "env:9092"
    assert s.sasl_username == "from-env"
    assert s.sasl_mechanism == "SCRAM-SHA-512"  # only in .env


def test_flag_wins_over_environment(dotenv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    assert KafkaSettings.from_env("flag:9092", env_file=dotenv).bootstrap_servers == "flag:9092"


def test_defaults_without_env_or_dotenv(tmp_path: Path) -> None:
    s = KafkaSettings.from_env("h:1", env_file=tmp_path / "missing.env")
    assert (s.security_protocol, s.sasl_username, s.sasl_password, s.client_id) == (
        "PLAINTEXT", None, None, "replaybroker",
    )


def test_password_never_in_repr_or_printed_config(dotenv: Path) -> None:
    s = KafkaSettings.from_env(env_file=dotenv)
    assert "dotenv-secret" not in repr(s)
    out = io.StringIO()
    print_config(s, "acker", file=out)
    text = out.getvalue()
    assert "dotenv-secret" not in text
    assert "sasl.password=**********" in text
    assert "sasl.username=from-dotenv" in text
    assert "bootstrap.servers=dotenv:9092" in text


def test_user_override_wins_over_defaults_not_over_required(tmp_path: Path) -> None:
    s = KafkaSettings.from_env("h:1", env_file=tmp_path / "none", extra={"linger.ms": 50})
    conf = s.producer_config(user={"compression.type": "zstd"})
    assert conf["linger.ms"] == 50
    assert conf["compression.type"] == "zstd"
    assert conf["enable.idempotence"] is True


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "check"],
        ["acker", "--instance-id", "a1"],
        ["status"],
        ["dlq", "list"],
        ["trace", "42"],
    ],
)
def test_every_command_prints_its_effective_config_with_v(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import broker.cli
    from broker.errors import KafkaUnreachable

    def unreachable(settings: KafkaSettings, *, verbose: bool = False, wait_s: float = 0.0) -> None:
        raise KafkaUnreachable("stopped after the configuration was printed")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "hunter2-secret")
    code = broker.cli.main(["-v", *argv, "--bootstrap", "h:9092", "--namespace", "ns"], reach=unreachable)
    err = capsys.readouterr().err
    assert code == 2
    assert "effective Kafka configuration" in err
    assert "sasl.username=svc" in err
    assert "sasl.password=**********" in err
    assert "hunter2-secret" not in err
