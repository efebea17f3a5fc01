"""The ``replaybroker`` command. Each subcommand is a thin layer over a module function."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from broker.errors import ReplayBrokerError

log = logging.getLogger("replaybroker")


def resolve_bootstrap(explicit: str | None, *, start_embedded: bool = False) -> str:
    """--bootstrap, else KAFKA_BOOTSTRAP_SERVERS, else the running embedded broker, else (when
    ``start_embedded``) a newly started embedded broker left running for later commands."""
    import os

    from broker import kafka_local

    if explicit:
        return explicit
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    state = kafka_local.running_state(kafka_local.default_run_dir())
    if state is not None:
        return state.bootstrap
    if start_embedded:
        print("starting the embedded Kafka (replaybroker kafka down stops it)", file=sys.stderr)
        return kafka_local.LocalKafka().start(detach=True).bootstrap
    raise ReplayBrokerError(
        "no Kafka: pass --bootstrap, set KAFKA_BOOTSTRAP_SERVERS, or run `replaybroker kafka up`"
    )


def _cmd_kafka(args: argparse.Namespace) -> int:
    from broker import kafka_local

    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.action == "up":
        return kafka_local.main_up(run_dir)
    kafka = kafka_local.LocalKafka(run_dir)
    if args.action == "status":
        state = kafka_local.running_state(kafka.run_dir)
        if state is None:
            print(f"not running (run dir {kafka.run_dir})")
            return 1
        print(f"running: {state.bootstrap} Kafka {state.kafka_version} pid {state.pid} run dir {state.run_dir}")
        return 0
    if args.action == "down":
        print("stopped" if kafka.stop() else "not running")
        return 0
    raise AssertionError(args.action)


def _cmd_setup(args: argparse.Namespace) -> int:
    import time

    from broker import kafka_local

    started = time.monotonic()
    kafka_local.require_java()
    version, jars = kafka_local.kafka_classpath()
    print(f"Kafka {version}: {len(jars)} jars", file=sys.stderr)
    connector = kafka_local.spark_kafka_connector_jars()
    print(f"Spark Kafka connector: {len(connector)} jars", file=sys.stderr)
    print(f"setup done in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _cmd_partition(args: argparse.Namespace) -> int:
    from broker.partitioning import partition_keys

    for index in partition_keys(args.partitioner, args.partitions, args.keys):
        print(index)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from broker.demo import main_demo

    return main_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaybroker", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="the embedded single-node Kafka")
    kafka.add_argument("action", choices=["up", "status", "down"])
    kafka.add_argument("--run-dir", help="state directory (default ~/.cache/replaybroker/run/kafka)")
    kafka.set_defaults(func=_cmd_kafka)

    setup = sub.add_parser("setup", help="resolve the Kafka and Spark connector jars (Maven)")
    setup.set_defaults(func=_cmd_setup)

    part = sub.add_parser("partition", help="print the partition index of each string key")
    part.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka")
    part.add_argument("--partitions", type=int, required=True)
    part.add_argument("keys", nargs="+")
    part.set_defaults(func=_cmd_partition)

    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded (or given) Kafka")
    demo.add_argument("--bootstrap", help="existing Kafka (default: embedded)")
    demo.add_argument("--records", type=int, default=10_000)
    demo.add_argument("--json", action="store_true", help="one JSON object on stdout")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args))
    except ReplayBrokerError as exc:
        print(f"replaybroker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
