"""The command line as a user meets it, without a cluster: global options anywhere, every
argument checked before any network wait (a mistake is one usage line, at once), actions as
subcommands with their own flags, one unit (ms) for durations, and help that shows every
default the same way."""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

import broker.cli
from broker.cli import Calls, build_parser, main
from broker.errors import ConfigurationError
from broker.settings import KafkaSettings


class NoNetwork(list[str]):
    """The clusters of the commands that reached the point of waiting for one (none may): the
    reachability check handed to ``main`` (``reach=``)."""

    def __call__(self, settings: KafkaSettings, **_k: Any) -> None:
        self.append(settings.bootstrap_servers)
        raise AssertionError("a command waited for the cluster")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> NoNetwork:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    return NoNetwork()


CLUSTER = ["--bootstrap", "127.0.0.1:1", "--namespace", "shop"]


@pytest.mark.parametrize("argv", [
    ["-v", "status", *CLUSTER],
    ["status", "-v", *CLUSTER],
    ["status", *CLUSTER, "--verbose"],
    ["topics", "check", "-v", *CLUSTER],
    ["dlq", "list", *CLUSTER, "-v"],
    ["kafka", "status", "-v"],
])
def test_global_options_go_before_or_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is True


def test_without_v_nothing_is_verbose() -> None:
    assert build_parser().parse_args(["dlq", "list", *CLUSTER]).verbose is False


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], reach: Any = None) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv, reach=reach)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(("argv", "why"), [
    (["topics", "create", *CLUSTER], "required: --partitions"),
    (["topics", "create", *CLUSTER, "--partitions", "0"], "--partitions: must be positive, got 0"),
    (["topics", "check", *CLUSTER, "--data-topic", "orders"], "expected NAME:PARTITIONS"),
    (["topics", "check", *CLUSTER, "--data-topic", "orders:0"], "expected NAME:PARTITIONS"),
    (["dlq", "list", *CLUSTER, "--dry-run"], "unrecognized arguments: --dry-run"),
    (["dlq", "redrive", *CLUSTER, "--limit", "3"], "unrecognized arguments: --limit"),
    (["dlq", "redrive", *CLUSTER, "--origin", "nope"], "expected an id"),
    (["dlq", "redrive", *CLUSTER, "--timeout", "30"], "unrecognized arguments: --timeout"),
    (["trace", *CLUSTER, "xyz"], "expected an id"),
    (["task", *CLUSTER, "--handler", "m:f", "--topics", "t", "--group", "g", "--batch-size", "0"],
     "--batch-size: must be positive, got 0"),
    (["task", *CLUSTER, "--handler", "m:f", "--topics", "t", "--group", "g", "--commit-interval-ms", "-1"],
     "--commit-interval-ms: must be zero or more, got -1"),
    (["task", *CLUSTER, "--handler", "m:f", "--topics", "t", "--group", "g", "--metrics-port", "70000"],
     "--metrics-port: must be from 0 to 65535"),
    (["acker", *CLUSTER, "--session-timeout-ms", "ten"], "not a whole number: 'ten'"),
    (["acker", *CLUSTER, "--adaptive-safety-factor", "0"], "must be positive"),
    (["acker", *CLUSTER, "--adaptive-safety-factor", "nan"], "must be positive"),
    (["bridge", *CLUSTER, "--from", "t", "--max-attempts", "0"], "--max-attempts: must be positive"),
    (["demo", "--records", "-5"], "--records: must be positive, got -5"),
    (["demo", "--fail-rate", "1.5"], "--fail-rate: must be from 0 to 1"),
    (["demo", "--timeout", "30"], "unrecognized arguments: --timeout"),
    (["status", "--bootstrap", "h:1", "--namespace", "shop.acker"], "no '.'"),
    (["status", "--bootstrap", "h:1", "--local", "--namespace", "shop"], "not allowed with argument"),
    (["kafka", "status", "--jfr", "f"], "unrecognized arguments: --jfr"),
    (["spark", "down", "--cores", "2"], "unrecognized arguments: --cores"),
])
def test_a_wrong_argument_is_a_usage_error_before_any_cluster_is_asked(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str], no_network: NoNetwork
) -> None:
    assert why in usage_error(argv, capsys, no_network)
    assert no_network == []


@pytest.mark.parametrize(("argv", "why"), [
    (["topics", "acls", *CLUSTER, "--role", "acker", "--principal", "User:a", "--group", "g"],
     "--role acker takes no --group"),
    (["topics", "acls", *CLUSTER, "--role", "source", "--principal", "User:s", "--input", "t"],
     "--role source takes no --input"),
    (["topics", "acls", *CLUSTER, "--role", "task", "--principal", "User:t", "--input", "orders", "--group", "g",
      "--output", "shop.superseded", "--apply"], "a task does not write shop.superseded"),
    (["topics", "acls", *CLUSTER, "--role", "task", "--principal", "User:t", "--input", "orders",
      "--group", "shop.acker", "--apply"], "belongs to the acker of namespace shop"),
    (["topics", "acls", *CLUSTER, "--role", "task", "--principal", "User:t", "--input", "orders",
      "--group", "g", "--output", "other.persist", "--apply"], "a topic of namespace other itself"),
    (["kafka", "up", "--tls"], "--tls needs --sasl"),
    (["kafka", "up", "--sasl", "--brokers", "3"], "--brokers cannot be used with it"),
    (["task", *CLUSTER, "--handler", "no_such_module_here:f", "--topics", "t", "--group", "g"], "cannot import"),
])
def test_a_wrong_combination_is_one_line_before_any_cluster_is_asked(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str], no_network: NoNetwork
) -> None:
    assert main(argv, reach=no_network) == 2
    err = capsys.readouterr().err
    assert err.startswith("replaybroker: ") and err.count("\n") == 1, err
    assert why in err
    assert no_network == []


def test_the_acls_of_a_role_print_without_a_cluster(capsys: pytest.CaptureFixture[str], no_network: NoNetwork) -> None:
    assert main(["topics", "acls", "--namespace", "shop", "--role", "task", "--principal", "User:t",
                 "--input", "orders", "--group", "shop-enrich"], reach=no_network) == 0
    assert "User:t ALLOW READ             GROUP:LITERAL:shop-enrich" in capsys.readouterr().out


def every_option(parser: argparse.ArgumentParser, path: str = "replaybroker") -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_option(sub, f"{path} {name}")
        elif action.option_strings:
            yield path, action


def helps() -> Iterator[tuple[str, str]]:
    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
        yield path, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")

    return walk(build_parser(), "replaybroker")


def test_every_duration_a_user_types_is_in_ms() -> None:
    durations = re.compile(r"timeout|interval|ttl|watch-ms|-ms\b|seconds|batch-ms|wait")
    for path, action in every_option(build_parser()):
        long = action.option_strings[-1]
        if durations.search(long) or "seconds" in (action.help or ""):
            assert long.endswith("-ms"), f"{path} {long}"
            assert action.type is not float, f"{path} {long}"


def test_help_shows_every_default_one_way_zero_included() -> None:
    for path, text in helps():
        flat = " ".join(text.split())
        assert "``" not in flat and "module" not in flat, path
        assert not re.search(r"\(\d+\)|\d \(default\)", flat), (path, flat)  # "(1000)", "1 (default)"
    formatter = broker.cli.args.Help("replaybroker")
    shown = {}
    for path, action in every_option(build_parser()):
        text = (formatter._get_help_string(action) or "") % {"default": action.default}
        assert text.count("(default") <= 1, (path, text)
        shown[path, action.option_strings[-1]] = text
    assert shown["replaybroker acker", "--expiry-lag-slack"].endswith("(default: 0)")
    assert shown["replaybroker acker", "--session-timeout-ms"].endswith("(default: 10000)")
    assert shown["replaybroker kafka up", "--brokers"].endswith("(default: 1)")


def test_the_library_speaks_of_its_own_arguments_not_of_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        KafkaSettings.from_env()
    assert "bootstrap_servers" in str(refused.value) and "--" not in str(refused.value)


def test_a_task_without_replay_topics_says_so_once_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from broker.task import Task, without_replay_topics
    from tests.unit.fakes import FakeKafka

    assert without_replay_topics(["a", "a.replay", "b", "c.replay", "b"]) == ["b"]
    caplog.set_level(logging.WARNING, logger="broker.task")
    for topics, warned in ((["orders", "orders.replay"], False), (["orders", "clicks"], True)):
        caplog.clear()
        task = Task(KafkaSettings("fake:9092"), "shop", topics, "g", lambda r, c: None, kafka=FakeKafka(partitions=4))
        task.check_topics()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == warned, lines
        if warned:
            assert "orders, clicks without orders.replay, clicks.replay" in lines[0]
            assert "shop.dlq" in lines[0]


@pytest.mark.parametrize("role_args", [
    ["--role", "source", "--principal", "User:source", "--data-topic", "orders"],
    ["--role", "source", "--principal", "User:source", "--data-topic", "orders:4"],
    ["--role", "task", "--principal", "User:task", "--group", "shop.enrich", "--input", "orders", "--output", "enriched"],
    ["--role", "acker", "--principal", "User:acker", "--data-topic", "orders"],
])
def test_the_acls_of_the_readme_print(role_args: list[str], capsys: pytest.CaptureFixture[str],
                                      no_network: NoNetwork) -> None:
    assert main(["topics", "acls", "--namespace", "shop", *role_args], reach=no_network) == 0
    out = capsys.readouterr().out
    assert "TOPIC:LITERAL:shop.persist" in out and ":4" not in out


def test_a_moment_is_iso_epoch_ms_or_a_span_ago() -> None:
    import time

    from broker.cli.args import moment

    assert moment("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert moment("2023-11-14T22:13:20") == 1_700_000_000_000  # no zone: UTC
    assert moment("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    assert moment("1700000000000") == 1_700_000_000_000
    now = int(time.time() * 1000)
    assert abs(moment("2h") - (now - 7_200_000)) < 5_000
    assert abs(moment("90s") - (now - 90_000)) < 5_000
    for bad in ("yesterday", "2h ago", "-5", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            moment(bad)


def test_status_text_stays_readable_at_a_thousand_partitions(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: at P = 1 000 the text output printed every partition's figure; it sums them up
    (the JSON keeps every figure)."""

    pending = [0] * 1000
    pending[7], pending[999] = 40, 3
    result = {"namespace": "big", "ledger_partitions": 1000, "pending": 43, "pending_per_partition": pending,
              "pending_unknown_partitions": [*range(500, 700), 900], "sources": {"pending": "counters"},
              "outages": {"big.enrich": {"since_ms": 1_700_000_000_000, "for_s": 12.5}}}
    calls = Calls(status=lambda *_a: dict(result))
    assert main(["status", "--bootstrap", "fake:9092", "--namespace", "big"], reach=lambda *_a, **_k: None, calls=calls) == 0
    out = capsys.readouterr().out
    assert "pending_per_partition: 1000 partitions: total 43, min 0, max 40; largest 7: 40, 999: 3, 998: 0" in out
    assert "pending_unknown_partitions: 201 [500-699, 900]" in out
    assert "outages: big.enrich since 2023-11-14 22:13:20 UTC (12.5 s)" in out  # the tasks in an outage
    assert len(max(out.splitlines(), key=len)) < 200
    assert main(["status", "--bootstrap", "fake:9092", "--namespace", "big", "--json"], reach=lambda *_a, **_k: None,
                calls=calls) == 0
    assert len(orjson_loads(capsys.readouterr().out)["pending_per_partition"]) == 1000


def orjson_loads(text: str) -> Any:
    import orjson

    return orjson.loads(text)
