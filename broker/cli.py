"""The ``replaybroker`` command: run and operate a replay broker on Kafka."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import ConfigurationError, KafkaClientError, KafkaUnreachable, ReplayBrokerError

log = logging.getLogger("replaybroker")

DESCRIPTION = """\
Run and operate a replay broker: every record a source sends is tracked until its whole tree
of derived records is acked; a record that fails or times out is replayed, and after its last
attempt dead-lettered.

Try it: `replaybroker demo`. A pipeline: `topics create`, then `acker` and one `task` per
stage (services: SIGTERM stops them cleanly); `status`, `trace` and `dlq` show what became of
the records. Global options (-v) go before or after the command."""


def _cmd_kafka(args: argparse.Namespace) -> int:
    from broker.dev import kafka_local

    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.sasl:
        from broker.dev import kafka_sasl

        run_dir = run_dir or kafka_sasl.default_sasl_run_dir()
        if args.action == "up":
            return kafka_sasl.main_up_sasl(run_dir, args.user or (), tls=args.tls)
    if args.brokers > 1:
        return _cmd_kafka_cluster(args, run_dir)
    if args.action == "up":
        return kafka_local.main_up(run_dir, jfr=args.jfr)
    kafka = kafka_local.LocalKafka(run_dir)
    if args.action == "status":
        state = kafka_local.running_state(kafka.run_dir)
        if state is None:
            print(f"not running (run dir {kafka.run_dir})")
            return 1
        print(f"running: {state.bootstrap} Kafka {state.kafka_version} pid {state.pid} run dir {state.run_dir}")
        return 0
    print("stopped" if kafka.stop() else "not running")
    return 0


def _cmd_kafka_cluster(args: argparse.Namespace, run_dir: Path | None) -> int:
    from broker.dev import kafka_cluster

    cluster = kafka_cluster.LocalCluster(args.brokers, run_dir)
    if args.action == "up":
        return kafka_cluster.main_up(args.brokers, run_dir)
    if args.action == "status":
        state = kafka_cluster.running_cluster(cluster.run_dir)
        if state is None:
            print(f"not running (run dir {cluster.run_dir})")
            return 1
        print(f"running: {state.bootstrap} Kafka {state.kafka_version} pids {state.pids} run dir {state.run_dir}")
        return 0
    print("stopped" if cluster.stop() else "not running")
    return 0


def _cmd_spark(args: argparse.Namespace) -> int:
    from broker.dev import spark_cluster

    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.action == "up":
        return spark_cluster.main_up(run_dir, cores=args.cores, memory=args.memory)
    if args.action == "status":
        return spark_cluster.main_status(run_dir)
    print("stopped" if spark_cluster.LocalSparkCluster(run_dir).stop() else "not running")
    return 0


def _cmd_setup(args: argparse.Namespace) -> int:
    import importlib.util

    from broker.dev import maven

    started = time.monotonic()
    maven.require_java()
    version, jars = maven.kafka_classpath()
    print(f"Kafka {version}: {len(jars)} jars", file=sys.stderr)
    if importlib.util.find_spec("pyspark") is None:
        print("Spark Kafka connector: skipped (pyspark not installed: the `spark` extra)", file=sys.stderr)
    else:
        connector = maven.spark_kafka_connector_jars()
        print(f"Spark Kafka connector: {len(connector)} jars", file=sys.stderr)
        if maven.installed_delta_version() is None:
            print("Delta Lake: skipped (delta-spark not installed: the `spark` extra)", file=sys.stderr)
        else:
            print(f"Delta Lake: {len(maven.delta_jars())} jars", file=sys.stderr)
    print(f"setup done in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _cmd_partition(args: argparse.Namespace) -> int:
    from broker.partitioning import partition_keys

    for index in partition_keys(args.partitioner, args.partitions, args.keys):
        print(index)
    return 0


NO_CLUSTER = (
    "no Kafka cluster given: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP_SERVERS "
    "(--local: the Kafka of `replaybroker kafka up`)"
)


@dataclass(frozen=True)
class LocalBroker:
    """A development Kafka that ``replaybroker kafka up`` started and that still runs."""

    started_by: str  # the command that started it
    bootstrap: str
    env_file: Path | None = None  # its admin's KAFKA_* settings (the SASL broker)


def local_brokers() -> list[LocalBroker]:
    """Every development Kafka running from its default run dir: the single node, the
    local cluster (``--brokers N``) and the secured one (``--sasl``)."""
    from broker.dev import kafka_cluster, kafka_local, kafka_sasl

    found = []
    single = kafka_local.running_state(kafka_local.default_run_dir())
    if single is not None:
        found.append(LocalBroker("kafka up", single.bootstrap))
    cluster = kafka_cluster.running_cluster(kafka_cluster.default_cluster_dir())
    if cluster is not None:
        found.append(LocalBroker(f"kafka up --brokers {len(cluster.pids)}", cluster.bootstrap))
    sasl = kafka_local.running_state(kafka_sasl.default_sasl_run_dir())
    if sasl is not None:
        found.append(LocalBroker("kafka up --sasl", sasl.bootstrap, Path(sasl.run_dir) / "admin.env"))
    return found


def _local_broker() -> LocalBroker:
    found = local_brokers()
    if not found:
        raise ConfigurationError("--local: no local Kafka is running (start one with `replaybroker kafka up`)")
    if len(found) > 1:
        running = ", ".join(f"{b.bootstrap} ({b.started_by})" for b in found)
        raise ConfigurationError(f"--local: {len(found)} local Kafkas are running: {running}; pass --bootstrap instead")
    return found[0]


def _connection(args: argparse.Namespace) -> tuple[str, Path | None]:
    """The cluster of a service or admin command, and the ``.env`` file of its settings:
    always an explicit choice. An acker or a redrive silently pointed at a development broker
    is worse than one that refuses."""
    if args.local:
        local = _local_broker()
        return local.bootstrap, local.env_file
    from broker.settings import env_settings

    servers = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or env_settings().bootstrap_servers
    if not servers:
        raise ConfigurationError(NO_CLUSTER)
    return str(servers), None


REACH_TIMEOUT_S = 10.0
"""How long a command waits for a cluster that accepts connections but does not answer."""
REACH_POLL_S = (0.1, 1.0)
"""The first wait for the metadata answer, doubled up to the last: a refusal is seen between
two waits, a distant cluster gets longer ones."""


def check_reachable(settings: Any, *, verbose: bool = False, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise ``KafkaUnreachable`` unless the cluster answers a metadata request: a command
    against a wrong address fails with the reason librdkafka saw (refused, unresolvable,
    authentication ...) as soon as it saw it - once every bootstrap server failed - and
    after ``timeout_s`` for a cluster that connects but never answers."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    from broker.kafka_log import without_timing

    errors: list[KafkaError] = []
    conf = settings.client_config()
    conf["error_cb"] = errors.append  # they become the reason of the one line
    if not verbose:
        conf["log_level"] = 0  # the same reasons, once per connection attempt
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    final = {KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION, KafkaError._SSL}
    wait, longest = REACH_POLL_S
    while True:
        try:
            admin.list_topics(timeout=min(wait, max(deadline - time.monotonic(), 0.01)))
            return
        except KafkaException as exc:
            failure = exc
        wait = min(wait * 2, longest)
        admin.poll(0)  # serves the errors collected meanwhile
        if time.monotonic() >= deadline or any(e.code() in final for e in errors):
            break
    reasons = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
    why = without_timing(reasons[-1]) if reasons else _kafka_reason(failure)
    raise KafkaUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {why}") from failure


def _kafka_reason(exc: BaseException) -> str:
    from confluent_kafka import KafkaError

    if isinstance(exc, KafkaClientError):
        return exc.reason
    err = exc.args[0] if exc.args else None
    return str(err.str()) if isinstance(err, KafkaError) else str(exc)


def _settings(args: argparse.Namespace) -> Any:
    from broker.settings import KafkaSettings

    bootstrap, env_file = _connection(args)
    settings = KafkaSettings.from_env(bootstrap, **({"env_file": env_file} if env_file else {}))
    if args.verbose:
        print_config(settings, args.command)
    check_reachable(settings, verbose=args.verbose)
    return settings


def print_config(settings: Any, command: str, file: Any = None) -> None:
    """The effective connection of a command (``-v``), one ``key=value`` a line on stderr,
    secrets masked: what the services will hand to librdkafka."""
    out = file or sys.stderr
    print(f"replaybroker {command}: effective Kafka configuration", file=out)
    for key, value in sorted(settings.describe().items()):
        print(f"  {key}={value}", file=out)


def _cmd_topics(args: argparse.Namespace) -> int:
    from broker import topics

    if args.action == "acls":
        return _cmd_acls(args)
    ns = topics.Namespace(args.namespace)
    data = dict(args.data_topic or [])
    settings = _settings(args)
    if args.action == "create":
        created = topics.create(settings, ns, args.partitions, data, replication=args.replication_factor,
                                min_insync=args.min_insync_replicas)
        for name in created:
            print(f"created {name}")
    P = topics.check(settings, ns, data)
    problems, warnings = topics.check_replication(settings, ns, data)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if problems:
        print(f"namespace {ns.name}: {P} ledger partitions, replication problems:", file=sys.stderr)
        for line in problems:
            print(f"- {line}", file=sys.stderr)
        return 2
    print(f"namespace {ns.name}: ok, {P} ledger partitions")
    return 0


# The flags of `topics acls` each role takes; any other is an error, not ignored.
ROLE_FLAGS = {
    "source": ("data_topic", "transactional_id"),
    "task": ("group", "input", "output"),
    "acker": ("data_topic",),
    "bridge": ("group", "input", "output"),
}
_ACL_FLAGS = ("data_topic", "transactional_id", "group", "input", "output")


def _cmd_acls(args: argparse.Namespace) -> int:
    """Print the least ACLs of a role; with --apply, create them (printing needs no cluster)."""
    from broker import acls, topics

    for flag in _ACL_FLAGS:
        if getattr(args, flag) and flag not in ROLE_FLAGS[args.role]:
            raise ConfigurationError(f"topics acls --role {args.role} takes no --{flag.replace('_', '-')}")
    principal = acls.check_principal(args.principal)
    rules = acls.role_acls(
        topics.Namespace(args.namespace),
        args.role,
        data_topics=args.data_topic or [],
        inputs=args.input or [],
        outputs=args.output or [],
        group=args.group,
        transactional_id=args.transactional_id,
    )
    for line in acls.render(principal, rules):
        print(line)
    if args.apply:
        n = acls.apply(_settings(args), principal, rules)
        print(f"applied {n} ACLs for {principal}", file=sys.stderr)
    return 0


_ADAPTIVE = ("adaptive_floor_ms", "adaptive_ceiling_ms", "adaptive_safety_factor")


def acker_config(args: argparse.Namespace) -> Any:
    """The ``AckerConfig`` of ``replaybroker acker``'s arguments."""
    from broker.acker import AckerConfig

    return AckerConfig(
        commit_interval_ms=args.commit_interval_ms,
        orphan_ttl_ms=args.orphan_ttl_ms,
        exactly_once=not args.unsafe_no_transactions,
        standby=args.standby,
        expiry_lag_slack=args.expiry_lag_slack,
        group_protocol=args.group_protocol,
        session_timeout_ms=args.session_timeout_ms,
        static_membership=not args.dynamic_membership,
        metrics_port=args.metrics_port,
        watch_ms=args.watch_ms,
        max_watches=args.max_watches,
        **({"instance_id": args.instance_id} if args.instance_id else {}),
        **{key: getattr(args, key) for key in _ADAPTIVE if getattr(args, key) is not None},
    )


def _cmd_acker(args: argparse.Namespace) -> int:
    from broker.acker import Acker
    from broker.background import tune_gc_for_service

    config = acker_config(args)
    acker = Acker(_settings(args), args.namespace, config)
    tune_gc_for_service()
    acker.run(install_signals=True)
    return 0


def load_object(spec: str, flag: str, example: str, kind: str = "NAME") -> Any:
    """``MODULE:NAME`` -> the object it names, imported as ``python -m`` would (the working
    directory is on the path). ``kind``: what NAME stands for in the messages (``FUNCTION``)."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigurationError(f"{flag} {spec!r}: expected MODULE:{kind}, e.g. {example}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"{flag} {spec!r}: cannot import {module}: {exc}") from exc
    value = getattr(found, name, None)
    if value is None:
        what = "" if kind == "NAME" else f"{kind.lower()} "
        raise ConfigurationError(f"{flag} {spec!r}: {module} has no {what}{name}")
    return value


def load_handler(spec: str) -> Any:
    """``MODULE:FUNCTION`` -> the task handler it names (``handler(record, ctx)``)."""
    handler = load_object(spec, "--handler", "myjob.handlers:enrich", "FUNCTION")
    if not callable(handler):  # there, but not a function
        module, _, name = spec.partition(":")
        raise ConfigurationError(f"--handler {spec!r}: {module} has no function {name}")
    return handler


def _cmd_run(args: argparse.Namespace) -> int:
    from broker.app import App
    from broker.background import tune_gc_for_service

    if args.bootstrap:  # read by the app's settings when first needed
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = args.bootstrap
    app = load_object(args.app, "APP", "shop.pipeline:app")
    if not isinstance(app, App):
        raise ConfigurationError(f"{args.app} is a {type(app).__name__}, not an App")
    if args.list:
        print("\n".join(app.roles))
        return 0
    for role in args.role or ():
        app.service(role)  # an unknown role: one line that lists the app's roles
    if args.role and len(args.role) == 1:
        tune_gc_for_service()  # a service process: one loop
    log.info("running %s of %s (namespace %s)", ", ".join(args.role or app.roles), args.app, app.ns.name)
    app.run(args.role)
    return 0


def _cmd_task(args: argparse.Namespace) -> int:
    from broker.task import Task, TaskConfig
    from broker.topics import REPLAY_SUFFIX, replay_topic

    handler = load_handler(args.handler)
    inputs = list(args.topics)
    if not args.no_replay_topics:
        inputs += [replay_topic(t) for t in args.topics if not t.endswith(REPLAY_SUFFIX)]
    config = TaskConfig(
        batch_size=args.batch_size, commit_interval_ms=args.commit_interval_ms,
        fail_on_exception=not args.stop_on_exception, metrics_port=args.metrics_port,
    )
    from broker.background import tune_gc_for_service

    task = Task(_settings(args), args.namespace, list(dict.fromkeys(inputs)), args.group, handler, config)
    tune_gc_for_service()
    counters = task.run(install_signals=True)
    log.info("task %s stopped: %s", args.group, counters)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import orjson

    from broker.status import status

    result = status(_settings(args), args.namespace)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    sources = result.pop("sources")
    for name, value in result.items():
        where = f"   ({sources[name]})" if name in sources else ""
        print(f"{name:>24}: {value}{where}")
    return 0


def _cmd_dlq(args: argparse.Namespace) -> int:
    import orjson

    from broker import dlq

    if args.action == "list":
        listed = dlq.list_entries(_settings(args), args.namespace, args.limit)
        if args.json:
            sys.stdout.write(orjson.dumps([dlq.entry_json(e, m) for e, m in listed]).decode() + "\n")
        else:
            for entry, marker in listed:
                print(dlq.format_entry(entry, marker))
            print(f"{len(listed)} entries in {args.namespace}.dlq", file=sys.stderr)
        return 0
    result = dlq.redrive(
        _settings(args),
        args.namespace,
        reason_prefix=args.reason_prefix,
        origins=args.origin or None,
        timeout_ms=args.timeout_ms,
        max_attempts=args.max_attempts,
        dry_run=args.dry_run,
    )
    summary = result.summary()
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        verb = "would redrive" if args.dry_run else "redrove"
        for r in summary["records"]:
            print(f"{verb} origin {r['origin']} from {args.namespace}.dlq {r['dlq']} to {r['topic']}")
        print(
            f"{verb} {summary['selected']}; skipped: {summary['skipped_quarantined']} quarantined, "
            f"{summary['skipped_already_redriven']} already redriven, "
            f"{summary['skipped_not_matching']} not matching"
        )
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    import orjson

    from broker import trace

    result = trace.trace(_settings(args), args.namespace, args.id)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        print(trace.render(result))
    return 0 if result["found"] else 1


def _cmd_bridge(args: argparse.Namespace) -> int:
    from broker.bridge import Bridge, BridgeConfig

    config = BridgeConfig(
        input_topic=args.from_topic, target_topic=args.to or "", group_id=args.group or "",
        instance_id=args.instance_id or "", batch_records=args.batch_records, batch_ms=args.batch_ms,
        session_timeout_ms=args.session_timeout_ms, timeout_ms=args.timeout_ms, max_attempts=args.max_attempts,
        partitioner=args.partitioner, exactly_once=not args.unsafe_commit, start=args.start,
    )
    from broker.background import tune_gc_for_service

    bridge = Bridge(_settings(args), args.namespace, config)
    tune_gc_for_service()
    bridge.run(install_signals=True)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from broker.dev.demo import main_demo
    from broker.dev.kafka_local import demo_cluster
    from broker.settings import KafkaSettings

    bootstrap, where = demo_cluster(args.bootstrap)
    print(f"demo on {bootstrap} ({where}): {args.records} records", file=sys.stderr)
    check_reachable(KafkaSettings.from_env(bootstrap), verbose=args.verbose)
    return main_demo(args, bootstrap)


def _cmd_bench(args: argparse.Namespace) -> int:
    from broker.bench.cli import main_bench

    return main_bench(args)


# ------------------------------------------------------------------ the arguments, checked here
# Every value is checked while parsing, before a command waits for any cluster.


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


class _Help(argparse.HelpFormatter):
    """Every option's default the same way, ``(default: X)`` at the end of its help - zero
    included - unless the help says it itself or there is none (a flag, an optional value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default is False or default is argparse.SUPPRESS:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


class _TopHelp(argparse.RawDescriptionHelpFormatter, _Help):
    """The command's own description keeps its paragraphs."""


def _parser(
    sub: Any, name: str, help: str, parents: list[argparse.ArgumentParser] | None = None
) -> argparse.ArgumentParser:
    # No abbreviations: `--timeout 30` must not pass for `--timeout-ms 30`.
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=help, formatter_class=_Help, allow_abbrev=False, parents=parents or []
    )
    _global_options(parser, argparse.SUPPRESS)
    return parser


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """Options any command takes, before or after its name: a command's own copy defaults
    to SUPPRESS, so it sets the value only when given there."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="debug logging, the effective Kafka configuration, tracebacks")


def _actions(parser: argparse.ArgumentParser, help: str) -> Any:
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION", help=help)


def _cluster(parser: argparse.ArgumentParser) -> None:
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


def _metrics_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=PORT, metavar="N",
        help="serve Prometheus metrics (replaybroker_*) on http://0.0.0.0:N/metrics (default: no metrics server)",
    )


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON value on stdout")


def _kafka_parsers(sub: Any) -> None:
    kafka = _parser(sub, "kafka", "a local Kafka for development and demos: one node, a cluster, or a secured one")
    actions = _actions(kafka, "start it (prints the bootstrap servers), show it or stop it")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/kafka, "
                        "run/kafka-cluster with --brokers, run/kafka-sasl with --sasl)")
    common.add_argument("--brokers", type=POSITIVE, default=1,
                        help="nodes: 1 is one node; more a local KRaft cluster, replication 3 and "
                        "min.insync 2 from 3 nodes on")
    common.add_argument("--sasl", action="store_true",
                        help="the secured broker: SASL/SCRAM-SHA-512, ACLs, super user admin (own run dir and ports)")
    for name, help in (("up", "start it"), ("status", "show whether it runs"), ("down", "stop it")):
        action = _action(actions, name, help, _cmd_kafka, parents=[common])
        action.set_defaults(jfr=None, tls=False, user=None)
        if name == "up":
            action.add_argument("--jfr", metavar="FILE", help="one node: record the broker with Java Flight "
                                "Recorder, written to FILE at kafka down (default: no recording)")
            action.add_argument("--tls", action="store_true", help="with --sasl: SASL_SSL with a self-signed CA")
            action.add_argument("--user", action="append", metavar="NAME",
                                help="with --sasl: a SCRAM user to create (repeatable)")

    spark = _parser(sub, "spark", "a local standalone Spark master with one worker (pyspark's jars)")
    actions = _actions(spark, "start it (prints the master URL), show it or stop it")
    for name, help in (("up", "start it"), ("status", "show whether it runs"), ("down", "stop it")):
        action = _action(actions, name, help, _cmd_spark)
        action.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/spark)")
        if name == "up":
            action.add_argument("--cores", type=POSITIVE, default=2, help="cores the worker offers")
            action.add_argument("--memory", default="2g", help="memory the worker offers to executors")


def _check_kafka(args: argparse.Namespace) -> None:
    if (args.tls or args.user) and not args.sasl:
        raise ConfigurationError(f"kafka up {'--tls' if args.tls else '--user'} needs --sasl")
    if args.sasl and args.brokers > 1:
        raise ConfigurationError("kafka --sasl is one node: --brokers cannot be used with it")
    if args.jfr and (args.sasl or args.brokers > 1):
        raise ConfigurationError("kafka up --jfr records the one-node broker only")


def _topics_parsers(sub: Any) -> None:
    top = _parser(sub, "topics", "create or check a namespace's topics, or print a role's ACLs")
    actions = _actions(top, "create what is missing, only check, or print (--apply: create) a role's ACLs")

    def data_topics(parser: argparse.ArgumentParser, help: str) -> None:
        parser.add_argument("--data-topic", action="append", type=data_topic, metavar="NAME:PARTITIONS", help=help)

    create = _action(actions, "create", "create the namespace's topics that are missing, then check them all",
                     _cmd_topics)
    _cluster(create)
    create.add_argument("--partitions", type=POSITIVE, required=True, help="ledger partitions P")
    data_topics(create, "a data topic and its partition count; its NAME.replay is created beside it (repeatable)")
    create.add_argument(
        "--replication-factor", type=POSITIVE,
        help="replicas per partition (default: 3 on a cluster of at least 3 brokers, else 1 with a warning)",
    )
    create.add_argument(
        "--min-insync-replicas", type=POSITIVE,
        help="replicas an acks=all write needs (default: 2 with replication 3, else 1)",
    )
    check = _action(actions, "check", "check the namespace's topics: partitions, settings, replication", _cmd_topics)
    _cluster(check)
    data_topics(check, "a data topic and its partition count, checked with its NAME.replay (repeatable)")

    acls = _action(actions, "acls", "print the least ACLs of a role (--apply: create them)", _cmd_topics)
    _cluster(acls)
    acls.add_argument("--role", choices=list(ROLE_FLAGS), required=True, help="the role")
    acls.add_argument("--principal", metavar="User:NAME", required=True, help="the principal of the role")
    acls.add_argument("--apply", action="store_true", help="create them (default: print only)")
    acls.add_argument("--data-topic", action="append", type=topic_name, metavar="NAME",
                      help="source, acker: a data topic it writes, or whose replay topic it writes (repeatable)")
    acls.add_argument("--group", help="task, bridge: the consumer group (bridge default: NS.bridge.INPUT)")
    acls.add_argument("--input", action="append", metavar="TOPIC", help="task, bridge: an input topic (repeatable)")
    acls.add_argument("--output", action="append", metavar="TOPIC",
                      help="task, bridge: an output topic (repeatable; bridge default: INPUT.guaranteed)")
    acls.add_argument("--transactional-id", help="source: its transactional id, if it uses transactions")


def _action(
    actions: Any, name: str, help: str, func: Callable[[argparse.Namespace], int],
    parents: list[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    parser = _parser(actions, name, help, parents)
    parser.set_defaults(func=func)
    return parser


def _acker_parser(sub: Any) -> None:
    acker = _parser(sub, "acker", "run an acker (SIGTERM stops it cleanly)")
    _cluster(acker)
    acker.add_argument(
        "--instance-id",
        help="stable id of this instance: a restart with the same id fences its predecessor's "
        "transaction at once and, as a static group member, gets its partitions back without moving "
        "anyone else's (default: host name + process id, unique but new at every start)",
    )
    acker.add_argument(
        "--dynamic-membership", action="store_true",
        help="with --instance-id, still join as a dynamic member: a clean stop hands the partitions "
        "over at once (scaling down) instead of keeping them for a restart up to the session timeout",
    )
    acker.add_argument(
        "--group-protocol", choices=["consumer", "classic"], default="consumer",
        help="consumer (KIP-848, Kafka >= 4.0): only partitions that change owner move; "
        "classic: eager range rebalances that pause every acker (older clusters)",
    )
    acker.add_argument(
        "--session-timeout-ms", type=POSITIVE, default=10_000,
        help="how long a silent (killed) acker keeps its partitions; within the broker's "
        "group.consumer.min/max.session.timeout.ms",
    )
    acker.add_argument("--commit-interval-ms", type=POSITIVE, default=100, help="time between commits")
    # Records sent with timeout "auto" (AckerConfig.adaptive_*; unset: its defaults).
    acker.add_argument("--adaptive-floor-ms", type=POSITIVE, help="'auto' timeouts: the shortest the acker gives "
                       "(default: 1000)")
    acker.add_argument(
        "--adaptive-ceiling-ms", type=POSITIVE,
        help="'auto' timeouts: the longest, and the first before enough samples (default: 300000)",
    )
    acker.add_argument(
        "--adaptive-safety-factor", type=positive_real,
        help="'auto' timeouts: p99.9 of the topic's completion latency times this (default: 3)",
    )
    acker.add_argument(
        "--orphan-ttl-ms", type=POSITIVE, default=60_000,
        help="how long events for an unknown srid are kept before they count as orphans",
    )
    acker.add_argument(
        "--watch-ms", type=AT_LEAST_ZERO,
        help="how long a replayed timeout is watched for a late completion of its original, which "
        "supersedes the replay - and how long a last attempt's dead letter waits for it; 0: no "
        "watches (default: the orphan TTL)",
    )
    acker.add_argument(
        "--max-watches", type=AT_LEAST_ZERO, default=100_000,
        help="watches kept per ledger partition (those over it are not watched, counted watch_skipped)",
    )
    acker.add_argument(
        "--expiry-lag-slack", type=AT_LEAST_ZERO, default=0,
        help="unread input messages that still count as caught up when judging timeouts "
        "(0: timeouts wait until every ack written before the deadline is read)",
    )
    acker.add_argument(
        "--standby", action="store_true",
        help="tail the changelog of partitions this instance does not own (fast takeover)",
    )
    _metrics_port(acker)
    acker.add_argument(
        "--unsafe-no-transactions", action="store_true",
        help="fold WITHOUT transactions - loses exactly-once; only to demonstrate what breaks",
    )
    acker.set_defaults(func=_cmd_acker)


def _task_parser(sub: Any) -> None:
    tk = _parser(
        sub, "task",
        "run a task as a service: consume TOPICs (and their replay topics) in consumer group GROUP, "
        "call HANDLER(record, ctx) per record, ack or fail it (SIGTERM stops it cleanly)",
    )
    _cluster(tk)
    tk.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                    help="the handler, imported from the working directory or the installed packages")
    tk.add_argument("--topics", nargs="+", required=True, metavar="TOPIC", help="the data topics to consume")
    tk.add_argument("--group", required=True, help="the consumer group (one per task; instances share it)")
    tk.add_argument("--no-replay-topics", action="store_true",
                    help="do not consume TOPIC.replay as well (replays then go unprocessed)")
    tk.add_argument("--batch-size", type=POSITIVE, default=1000, help="records per poll, at most")
    tk.add_argument("--commit-interval-ms", type=AT_LEAST_ZERO, default=100,
                    help="how often the task waits for its outputs and commits its offsets (0: after every batch)")
    tk.add_argument("--stop-on-exception", action="store_true",
                    help="a handler exception stops the task (default: it fails the record: replay, then DLQ)")
    _metrics_port(tk)
    tk.set_defaults(func=_cmd_task)


def _run_parser(sub: Any) -> None:
    rn = _parser(
        sub, "run",
        "run roles of an App (broker.App): each --role in this process (default: all of them), "
        "until SIGTERM or Ctrl-C; in production one role per process",
    )
    rn.add_argument("app", metavar="MODULE:APP", help="the app, e.g. shop.pipeline:app (imported from the "
                    "working directory or the installed packages)")
    rn.add_argument("--role", action="append", metavar="ROLE",
                    help="acker or task:NAME (repeatable; --list shows them)")
    rn.add_argument("--list", action="store_true", help="print the app's roles and exit")
    rn.add_argument("--bootstrap", metavar="HOST:PORT",
                    help="Kafka bootstrap servers (default: the app's, else $KAFKA_BOOTSTRAP_SERVERS)")
    rn.set_defaults(func=_cmd_run)


def _operate_parsers(sub: Any) -> None:
    st = _parser(sub, "status", "pending, completed, replayed, DLQ of a namespace")
    _cluster(st)
    _json(st)
    st.set_defaults(func=_cmd_status)

    tr = _parser(
        sub, "trace",
        "where one source record is: every attempt's persist record, ledger entry, decision, replay "
        "and DLQ entry (reads the owning partitions of NS.persist and NS.ledger, but the WHOLE replay "
        "topic and NS.dlq: slow on large ones)",
    )
    _cluster(tr)
    tr.add_argument("id", type=record_id,
                    help="an srid of any attempt, or the origin (decimal, or 0x hex of its 8 bytes)")
    _json(tr)
    tr.set_defaults(func=_cmd_trace)

    dl = _parser(sub, "dlq", "list the dead-letter queue, or redrive records from it")
    actions = _actions(dl, "show entries, or re-inject them")
    listing = _action(actions, "list", "show the entries of NS.dlq", _cmd_dlq)
    _cluster(listing)
    _json(listing)
    listing.add_argument("--limit", type=POSITIVE, help="the first N entries (default: all)")
    redrive = _action(actions, "redrive", "send dead-lettered records again, as new source records", _cmd_dlq)
    _cluster(redrive)
    _json(redrive)
    redrive.add_argument("--reason-prefix", help="only entries whose reason starts with this (default: any)")
    redrive.add_argument(
        "--origin", nargs="+", action="extend", metavar="ID", type=record_id,
        help="only these origin ids, as `dlq list` prints them or 0x hex (default: any)",
    )
    redrive.add_argument("--dry-run", action="store_true", help="show what would be redriven, send nothing")
    redrive.add_argument("--timeout-ms", type=POSITIVE, help="per-record timeout (default: 30000)")
    redrive.add_argument("--max-attempts", type=POSITIVE, help="attempts before the DLQ again (default: 5)")


def _bridge_parser(sub: Any) -> None:
    br = _parser(
        sub, "bridge",
        "turn an existing topic into source records: persist + data record per input record, the input "
        "offsets committed in the same transaction (SIGTERM stops it cleanly)",
    )
    _cluster(br)
    br.add_argument("--from", dest="from_topic", required=True, metavar="TOPIC", help="the input topic")
    br.add_argument("--to", metavar="TOPIC", help="the target data topic; it and its replay topic must exist "
                    "(default: TOPIC.guaranteed)")
    br.add_argument("--group", help="the input's consumer group (default: NS.bridge.TOPIC)")
    br.add_argument("--instance-id", help="stable id of this instance: transactional id NS.bridge.ID and a static "
                    "group member, so a restart aborts its predecessor's transaction at once (default: host "
                    "name + process id, new at every start)")
    br.add_argument("--batch-records", type=POSITIVE, default=1000, help="input records per transaction, at most")
    br.add_argument("--batch-ms", type=POSITIVE, default=100, help="time a transaction stays open, at most")
    br.add_argument("--session-timeout-ms", type=POSITIVE, default=10_000,
                    help="how long a silent (killed) instance keeps its input partitions")
    br.add_argument("--timeout-ms", type=POSITIVE, default=30_000, help="per-record timeout of the source records")
    br.add_argument("--max-attempts", type=POSITIVE, default=5, help="attempts before the DLQ")
    br.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka",
                    help="how keys map to partitions of the target topic")
    br.add_argument("--start", choices=["earliest", "latest"], default="earliest",
                    help="where a new group starts reading the input: every record it holds, or only "
                    "what is written from now on (a group with committed offsets resumes there)")
    br.add_argument("--unsafe-commit", action="store_true",
                    help="commit input offsets AFTER the records, outside any transaction - a crash repeats "
                    "records; only to demonstrate what breaks")
    br.set_defaults(func=_cmd_bridge)


def _demo_parser(sub: Any) -> None:
    demo = _parser(sub, "demo", "run the end-to-end demo: source -> task -> task -> acker, with failures")
    demo.add_argument("--bootstrap", metavar="HOST:PORT", help="the Kafka to run on (default: "
                      "$KAFKA_BOOTSTRAP_SERVERS, else the running embedded Kafka, else a new embedded one)")
    demo.add_argument("--records", type=POSITIVE, default=10_000, help="source records to send")
    _json(demo)
    demo.add_argument(
        "--fail-rate", type=fraction,
        help="fraction of first attempts failed explicitly (default: 0, with --spark 0.05)",
    )
    demo.add_argument("--drop-rate", type=fraction, default=0.0, help="fraction of first attempts never acked")
    demo.add_argument("--timeout-ms", type=POSITIVE, default=30_000, help="per-record timeout")
    demo.add_argument("--max-attempts", type=POSITIVE, default=5, help="attempts before the DLQ")
    demo.add_argument("--spark", action="store_true", help="source -> Spark job -> acker")
    demo.add_argument("--master", metavar="URL",
                      help="with --spark: the Spark master, e.g. spark://127.0.0.1:7077 from "
                      "`replaybroker spark up` (default: $SPARK_MASTER, else local[2])")
    demo.add_argument("--keep", action="store_true", help="keep the demo's topics (default: delete them)")
    demo.set_defaults(func=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    from broker import __version__

    parser = argparse.ArgumentParser(prog="replaybroker", description=DESCRIPTION, formatter_class=_TopHelp,
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"replaybroker {__version__}")
    _global_options(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _demo_parser(sub)
    _kafka_parsers(sub)
    setup = _parser(sub, "setup", "download the Kafka, Spark connector and Delta Lake jars (Maven)")
    setup.set_defaults(func=_cmd_setup)
    _topics_parsers(sub)
    _acker_parser(sub)
    _task_parser(sub)
    _run_parser(sub)
    _bridge_parser(sub)
    _operate_parsers(sub)

    part = _parser(sub, "partition", "print the partition index of each string key")
    part.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka",
                      help="Kafka's murmur2 or Spark's HashPartitioning")
    part.add_argument("--partitions", type=POSITIVE, required=True, help="partition count of the topic")
    part.add_argument("keys", nargs="+", help="keys (UTF-8 strings)")
    part.set_defaults(func=_cmd_partition)

    bench = _parser(sub, "bench", "measure throughput, latency and recovery beside their baselines")
    from broker.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)
    return parser


# Checks of arguments that depend on each other, run after parsing and before any command.
_CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {"kafka": _check_kafka}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
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
            print(f"replaybroker: {args.command} failed: {_kafka_reason(exc)}", file=sys.stderr)
        else:
            print(f"replaybroker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
