"""The ``replaybroker`` command: run and operate a replay broker on Kafka.

One module per group of commands, each command's parser next to its handler:

- ``services``: ``acker``, ``task``, ``run``, ``bridge``;
- ``topics``: ``topics`` (create, check, acls), ``partition``;
- ``inspection``: ``status``, ``trace``, ``dlq``;
- ``console``: ``console``, the operator's console in the browser;
- ``development``: ``kafka``, ``spark``, ``setup``, ``demo``, ``bench``;
- ``args``: argument types, the help format, options taken from config dataclasses;
- ``connection``: the cluster a command talks to, and the check that it answers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# Pydantic looks for plugins among every installed distribution's entry points when the first
# settings class is built: a noticeable part of every command's start, for plugins this
# command does not use. Set to "" to have them loaded.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from broker.cli import console, development, inspection, services, topics
from broker.cli.args import (
    AT_LEAST_ZERO,
    PORT,
    POSITIVE,
    TopHelp,
    command,
    data_topic,
    fraction,
    global_options,
    namespace_name,
    positive_real,
    record_id,
    topic_name,
)
from broker.cli.connection import (
    NO_CLUSTER,
    REACH_POLL_S,
    REACH_TIMEOUT_S,
    Calls,
    LocalBroker,
    check_reachable,
    local_brokers,
    print_config,
)
from broker.cli.services import acker_config, load_handler, load_object
from broker.cli.topics import ROLE_FLAGS
from broker.errors import ReplayBrokerError

__all__ = [
    "AT_LEAST_ZERO",
    "NO_CLUSTER",
    "PORT",
    "POSITIVE",
    "REACH_POLL_S",
    "REACH_TIMEOUT_S",
    "ROLE_FLAGS",
    "Calls",
    "LocalBroker",
    "acker_config",
    "build_parser",
    "check_reachable",
    "data_topic",
    "fraction",
    "load_handler",
    "load_object",
    "local_brokers",
    "main",
    "namespace_name",
    "positive_real",
    "print_config",
    "record_id",
    "topic_name",
]

DESCRIPTION = """\
Run and operate a replay broker: every record a source sends is tracked until its whole tree
of derived records is acked; a record that fails or times out is replayed, and after its last
attempt dead-lettered.

Try it: `replaybroker demo`. A pipeline: `topics create`, then `acker` and one `task` per
stage (services: SIGTERM stops them cleanly); `status`, `trace` and `dlq` show what became of
the records. Global options (-v) go before or after the command."""


class _Version(argparse.Action):
    """``--version``: the version is looked up only when asked for (``broker._version``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from broker import __version__

        print(f"replaybroker {__version__}")
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command. ``only``: the one command ``main`` parses - a service's
    options are then built for that command alone (the others keep their name and help), as
    they import the service's module, which takes seconds on a small machine."""
    parser = argparse.ArgumentParser(prog="replaybroker", description=DESCRIPTION, formatter_class=TopHelp,
                                     allow_abbrev=False)
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    global_options(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order of `replaybroker --help`: first steps, then a pipeline, then operating it.
    development.add_demo(sub)
    development.add_kafka(sub)
    development.add_spark(sub)
    development.add_setup(sub)
    topics.add_topics(sub)

    def service(name: str) -> None:
        add, help = services.SERVICES[name]
        if only is None or only == name:
            add(sub)
        else:
            command(sub, name, help)

    service("acker")
    service("task")
    services.add_run(sub)
    service("bridge")
    inspection.add_status(sub)
    inspection.add_trace(sub)
    inspection.add_dlq(sub)
    console.add_console(sub)
    topics.add_partition(sub)
    development.add_bench(sub)
    return parser


# Checks of arguments that depend on each other, run after parsing and before any command.
_CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "kafka": development.check_kafka,
    "demo": development.check_demo,
}


def _command_in(argv: list[str]) -> str:
    """The command of a command line: its first argument that is not an option (the global
    options before it take no value); "" if there is none."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def main(argv: list[str] | None = None, *, reach: Callable[..., None] | None = None, calls: Calls | None = None) -> int:
    """``reach``: how a command checks that its cluster answers (default ``check_reachable``);
    ``calls``: what the commands run against it (default: the broker's own)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_in(argv)).parse_args(argv)
    args.reach, args.calls = reach, calls
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from broker.cli.connection import kafka_reason
    from broker.errors import KafkaClientError
    from broker.kafka_io import kafka_errors

    # The failures a command line tool expects (the cluster, the namespace, the input) are
    # one line, ``replaybroker: <what failed>: <why>``; -v adds the traceback. The public
    # API raises only ReplayBrokerErrors; the command line is a boundary of its own for the
    # development commands (bench, demo) that use Kafka's clients directly.
    try:
        check = _CHECKS.get(args.command)
        if check is not None:
            check(args)
        with kafka_errors(args.command):
            return int(args.func(args))
    except ReplayBrokerError as exc:
        if args.verbose:
            traceback.print_exception(exc)
        if isinstance(exc, KafkaClientError):
            print(f"replaybroker: {args.command} failed: {kafka_reason(exc)}", file=sys.stderr)
        else:
            print(f"replaybroker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
