"""The building blocks of every command's parser: argument types checked while parsing -
before a command waits for any cluster - the help format, and options taken from a config
dataclass, so a flag's default is its field's default and is written in one place."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.errors import ConfigurationError

# ------------------------------------------------------------------ the arguments, checked here


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            what = {0: "zero or more", 1: "positive"}.get(minimum, f"at least {minimum}")
            if maximum is not None:
                what = f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value

    return parse


POSITIVE = _whole(1)
AT_LEAST_ZERO = _whole(0)
PORT = _whole(0, 65535)


def _real(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def fraction(text: str) -> float:
    return _real(text, lambda v: 0.0 <= v <= 1.0, "from 0 to 1")


def positive_real(text: str) -> float:
    return _real(text, lambda v: v > 0.0, "positive")


def namespace_name(text: str) -> str:
    from broker.topics import check_namespace_name

    try:
        return check_namespace_name(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def data_topic(spec: str) -> tuple[str, int]:
    name, _, n = spec.rpartition(":")
    if not name or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS (a positive count), got {spec!r}")
    return name, int(n)


def topic_name(spec: str) -> str:
    """A data topic by its name (NAME:PARTITIONS, as `topics create` takes it, too)."""
    name, sep, n = spec.rpartition(":")
    return name if sep and name and n.isdigit() else spec


def record_id(text: str) -> int:
    from broker.trace import parse_id

    try:
        return parse_id(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an id in decimal or 0x hex, got {text!r}") from None


_AGO = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def moment(text: str) -> int:
    """A point in time, as epoch ms: ISO 8601 (``2026-11-27T08:00:00Z``; no zone: UTC), epoch
    ms, or a span ago (``90s``, ``30m``, ``2h``, ``7d``)."""
    import datetime as dt
    import time

    if text[:-1].isdigit() and text[-1:] in _AGO:
        return int(time.time() * 1000) - int(text[:-1]) * _AGO[text[-1]]
    if text.isdigit():
        return int(text)
    try:
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ISO 8601 (2026-11-27T08:00:00Z), epoch ms or a span ago (30m, 2h, 7d), got {text!r}"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return int(at.timestamp() * 1000)


# ------------------------------------------------------------------ options from a config dataclass


@dataclasses.dataclass(frozen=True)
class ConfigOption:
    """An option that sets the field ``field`` of a config dataclass (default: the field
    named like the option). ``inverted``: a switch that turns off a field whose default is
    True (``--unsafe-commit`` clears ``exactly_once``). ``kwargs``: of ``add_argument``."""

    flag: str
    help: str
    field: str = ""
    inverted: bool = False
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def field_name(self) -> str:
        return self.field or self.dest

    def default(self, config: type) -> Any:
        """The option's default: the field's own (False for an inverted switch)."""
        value = field_default(config, self.field_name)
        if self.inverted:
            if value is not True:
                raise TypeError(f"{self.flag} turns off {config.__name__}.{self.field_name}, which is not True")
            return False
        return value

    def value(self, args: argparse.Namespace) -> Any:
        given = getattr(args, self.dest)
        return not given if self.inverted else given


def option(flag: str, help: str, *, field: str = "", inverted: bool = False, **kwargs: Any) -> ConfigOption:
    return ConfigOption(flag, help, field, inverted, kwargs)


def field_default(config: type, name: str) -> Any:
    """The default of the field ``name`` of the dataclass ``config``."""
    for field in dataclasses.fields(config):
        if field.name == name:
            if field.default is dataclasses.MISSING:
                raise TypeError(f"{config.__name__}.{name} has no plain default")
            return field.default
    raise TypeError(f"{config.__name__} has no field {name}")


def add_config_options(parser: argparse.ArgumentParser, config: type, options: Sequence[ConfigOption]) -> None:
    for opt in options:
        extra = {"action": "store_true"} if opt.inverted else dict(opt.kwargs)
        parser.add_argument(opt.flag, dest=opt.dest, default=opt.default(config), help=opt.help, **extra)


def config_values(args: argparse.Namespace, options: Sequence[ConfigOption]) -> dict[str, Any]:
    """The config fields that ``options`` set, as keyword arguments of the dataclass."""
    return {opt.field_name: opt.value(args) for opt in options}


# ------------------------------------------------------------------ the parsers


class Help(argparse.HelpFormatter):
    """Every option's default the same way, ``(default: X)`` at the end of its help - zero
    included - unless the help says it itself or there is none (a switch, an optional value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default is False or default is argparse.SUPPRESS:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


class TopHelp(argparse.RawDescriptionHelpFormatter, Help):
    """The command's own description keeps its paragraphs."""


def command(
    sub: Any, name: str, help: str, parents: list[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    # No abbreviations: `--timeout 30` must not pass for `--timeout-ms 30`.
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, formatter_class=Help, allow_abbrev=False, parents=parents or []
    )
    global_options(parser, argparse.SUPPRESS)
    return parser


def global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """Options any command takes, before or after its name: a command's own copy defaults
    to SUPPRESS, so it sets the value only when given there."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="debug logging, the effective Kafka configuration, tracebacks")


def actions(parser: argparse.ArgumentParser, help: str) -> Any:
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION", help=help)


def action(
    actions: Any, name: str, help: str, func: Callable[[argparse.Namespace], int],
    parents: list[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    parser = command(actions, name, help, parents)
    parser.set_defaults(func=func)
    return parser


def cluster(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap", metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS; one of the two, or --local, is needed)",
    )
    where.add_argument(
        "--local", action="store_true",
        help="use the Kafka that `replaybroker kafka up` started (single node, --brokers N or --sasl)",
    )
    parser.add_argument("--namespace", required=True, type=namespace_name,
                        help="the namespace NS of the topics NS.persist, NS.acks ...")


def service_cluster(parser: argparse.ArgumentParser) -> None:
    """``cluster`` for a service: it waits for a cluster that cannot be reached yet."""
    cluster(parser)
    parser.add_argument(
        "--wait-for-kafka-ms", metavar="MS", type=AT_LEAST_ZERO,
        help="how long the service waits, asking again with back-off, for a cluster it cannot reach "
        "or that does not answer its start-up look-ups (default 120000; 0: fail at once)",
    )


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON value on stdout")
