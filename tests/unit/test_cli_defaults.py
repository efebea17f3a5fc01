"""The services' tunables on the command line are their config dataclasses' fields: each
flag's default is its field's default (written once, in the dataclass), the help shows it,
and the arguments of a bare command build the dataclass's own defaults."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from broker.acker import AckerConfig
from broker.bridge import BridgeConfig
from broker.cli import build_parser
from broker.cli.args import ConfigOption, Help, config_values, field_default
from broker.cli.services import ACKER_OPTIONS, BRIDGE_OPTIONS, TASK_OPTIONS
from broker.task import TaskConfig

CLUSTER = ["--bootstrap", "h:9092", "--namespace", "ns"]
COMMANDS: list[tuple[str, type, tuple[ConfigOption, ...], list[str]]] = [
    ("acker", AckerConfig, ACKER_OPTIONS, ["acker", *CLUSTER]),
    ("task", TaskConfig, TASK_OPTIONS, ["task", *CLUSTER, "--handler", "m:f", "--topics", "t", "--group", "g"]),
    ("bridge", BridgeConfig, BRIDGE_OPTIONS, ["bridge", *CLUSTER, "--from", "clicks"]),
]


def command_parser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[name]
    return parser


@pytest.mark.parametrize(("name", "config", "options", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_config_flag_defaults_to_its_field(
    name: str, config: type, options: tuple[ConfigOption, ...], argv: list[str]
) -> None:
    actions = {a.dest: a for a in command_parser(name)._actions}
    fields = {f.name for f in dataclasses.fields(config)}
    assert options, name
    for opt in options:
        assert opt.field_name in fields, opt.flag
        action = actions[opt.dest]
        assert action.option_strings == [opt.flag]
        field = field_default(config, opt.field_name)
        if opt.inverted:  # a switch that turns a True field off
            assert (field, action.default, action.nargs) == (True, False, 0), opt.flag
        else:
            assert action.default == field, opt.flag
    args = build_parser().parse_args(argv)
    assert config_values(args, options) == {o.field_name: field_default(config, o.field_name) for o in options}


@pytest.mark.parametrize(("name", "config", "options", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_the_help_shows_the_fields_default(
    name: str, config: type, options: tuple[ConfigOption, ...], argv: list[str]
) -> None:
    actions = {a.dest: a for a in command_parser(name)._actions}
    formatter = Help(f"replaybroker {name}")
    for opt in options:
        action = actions[opt.dest]
        text = (formatter._get_help_string(action) or "") % {"default": action.default}
        default = field_default(config, opt.field_name)
        if opt.inverted or isinstance(default, bool):
            assert "(default" not in text or "(default: it" in text, (opt.flag, text)
        elif default is None or "(default" in opt.help:
            assert text.count("(default") <= 1 and "(default: None)" not in text, (opt.flag, text)
        else:
            assert text.endswith(f"(default: {default})"), (opt.flag, text)


def test_the_acker_flags_cover_what_the_command_line_sets() -> None:
    """A flag given on the command line reaches its field (the inverted ones turn it off)."""
    from broker.cli import acker_config

    given: dict[str, Any] = {
        "--dynamic-membership": None, "--group-protocol": "classic", "--session-timeout-ms": "7000",
        "--commit-interval-ms": "250", "--adaptive-floor-ms": "500", "--adaptive-ceiling-ms": "60000",
        "--adaptive-safety-factor": "2.5", "--orphan-ttl-ms": "1000", "--watch-ms": "0", "--max-watches": "3",
        "--expiry-lag-slack": "7", "--standby": None, "--metrics-port": "0", "--unsafe-no-transactions": None,
        "--replay-rate-per-s": "500", "--transaction-timeout-ms": "60000",
    }
    assert set(given) == {o.flag for o in ACKER_OPTIONS}
    argv = ["acker", *CLUSTER, "--instance-id", "a1"]
    for flag, value in given.items():
        argv += [flag] if value is None else [flag, value]
    config = acker_config(build_parser().parse_args(argv))
    assert (config.static_membership, config.group_protocol, config.session_timeout_ms) == (False, "classic", 7000)
    assert (config.commit_interval_ms, config.adaptive_floor_ms, config.adaptive_ceiling_ms) == (250, 500, 60_000)
    assert (config.adaptive_safety_factor, config.orphan_ttl_ms, config.watch_ms) == (2.5, 1000, 0)
    assert (config.max_watches, config.expiry_lag_slack, config.standby) == (3, 7, True)
    assert (config.metrics_port, config.exactly_once, config.instance_id) == (0, False, "a1")
    assert (config.replay_rate_per_s, config.transaction_timeout_ms) == (500.0, 60_000)


def test_the_spark_demo_takes_the_sinks_of_its_job() -> None:
    demo = pytest.importorskip("spark_jobs.demo")
    from broker.cli.development import SPARK_SINKS

    assert SPARK_SINKS == demo.SINKS


@pytest.mark.parametrize(("argv", "sink"), [([], "parquet"), (["--sink", "delta"], "delta")])
def test_the_spark_demo_passes_its_sink(
    argv: list[str], sink: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = pytest.importorskip("spark_jobs.demo")

    seen: dict[str, Any] = {}

    def run_spark_demo(bootstrap: str, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs, bootstrap=bootstrap)
        return {"lost": 0}

    monkeypatch.setattr(demo, "run_spark_demo", run_spark_demo)
    from broker.cli import main

    assert main(["demo", "--spark", "--bootstrap", "h:9092", "--json", *argv], reach=lambda *_a, **_k: None) == 0
    assert (seen["bootstrap"], seen["sink"]) == ("h:9092", sink)


def test_a_sink_without_spark_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from broker.cli import main

    assert main(["demo", "--sink", "delta"]) == 2
    assert capsys.readouterr().err == "replaybroker: demo --sink needs --spark\n"


def test_a_command_builds_the_services_options_only_for_itself() -> None:
    """`main` builds a service's options (which import its module) only for that command:
    the rest of the command line reads the same and starts without them."""
    import subprocess
    import sys

    assert build_parser("partition").format_help() == build_parser().format_help()
    assert command_parser("acker").format_help() == next(
        a for a in build_parser("acker")._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["acker"].format_help()
    script = ("import sys; from broker.cli import main; main(['partition', '--partitions', '2', 'a']); "
              "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['broker', 'acker'], "
              "['broker', 'task'], ['broker', 'bridge'])))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["0", "[]"]
