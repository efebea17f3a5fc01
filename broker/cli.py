"""The ``replaybroker`` command. Each subcommand is a thin layer over a module function."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from broker.errors import ConfigurationError, KafkaUnreachable, ReplayBrokerError

log = logging.getLogger("replaybroker")


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
    if args.action == "down":
        print("stopped" if kafka.stop() else "not running")
        return 0
    raise AssertionError(args.action)


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
    if args.action == "down":
        print("stopped" if cluster.stop() else "not running")
        return 0
    raise AssertionError(args.action)


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
    import time

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
    "(--local: the embedded Kafka of `replaybroker kafka up`)"
)


def _bootstrap(args: argparse.Namespace) -> str:
    """The cluster of a service or admin command: always an explicit choice. An acker or a
    redrive silently pointed at a development broker is worse than one that refuses."""
    if args.local:
        from broker.dev import kafka_local

        state = kafka_local.running_state(kafka_local.default_run_dir())
        if state is None:
            raise ConfigurationError("--local: no embedded Kafka is running (start it with `replaybroker kafka up`)")
        return state.bootstrap
    from broker.settings import env_settings

    servers = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or env_settings().bootstrap_servers
    if not servers:
        raise ConfigurationError(NO_CLUSTER)
    return str(servers)


REACH_TIMEOUT_S = 10.0


def check_reachable(settings: Any, *, verbose: bool = False) -> None:
    """Raise ``KafkaUnreachable`` unless the cluster answers a metadata request within
    ``REACH_TIMEOUT_S``: a command against a wrong address fails at once, with the reason
    librdkafka saw (refused, unresolvable ...), instead of retrying for minutes."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    from broker.kafka_log import without_timing

    errors: list[KafkaError] = []
    conf = settings.client_config()
    conf["error_cb"] = errors.append  # they become the reason of the one line
    if not verbose:
        conf["log_level"] = 0  # the same reasons, once per connection attempt
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=REACH_TIMEOUT_S)
    except KafkaException as exc:
        admin.poll(0)  # serves the errors collected meanwhile
        reasons = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        why = without_timing(reasons[-1]) if reasons else _kafka_reason(exc)
        raise KafkaUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {why}") from exc


def _kafka_reason(exc: BaseException) -> str:
    from confluent_kafka import KafkaError

    err = exc.args[0] if exc.args else None
    return str(err.str()) if isinstance(err, KafkaError) else str(exc)


def _settings(args: argparse.Namespace) -> Any:
    from broker.settings import KafkaSettings

    settings = KafkaSettings.from_env(_bootstrap(args))
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


def _parse_data_topics(specs: list[str]) -> dict[str, int]:
    out = {}
    for spec in specs:
        name, _, n = spec.rpartition(":")
        if not name or not n.isdigit():
            raise ReplayBrokerError(f"--data-topic takes NAME:PARTITIONS, got {spec!r}")
        out[name] = int(n)
    return out


def _cmd_topics(args: argparse.Namespace) -> int:
    from broker import topics

    if args.action == "acls":
        return _cmd_acls(args)
    settings = _settings(args)
    ns = topics.Namespace(args.namespace)
    data = _parse_data_topics(args.data_topic or [])
    if args.action == "create":
        if args.partitions is None:
            raise ReplayBrokerError("topics create needs --partitions")
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


def _cmd_acls(args: argparse.Namespace) -> int:
    """Print the least ACLs of a role; with --apply, create them (printing needs no cluster)."""
    from broker import acls, topics

    if not args.role or not args.principal:
        raise ReplayBrokerError("topics acls needs --role and --principal")
    principal = acls.check_principal(args.principal)
    rules = acls.role_acls(
        topics.Namespace(args.namespace),
        args.role,
        data_topics=[spec.split(":")[0] for spec in args.data_topic or []],
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

    config = acker_config(args)
    Acker(_settings(args), args.namespace, config).run(install_signals=True)
    return 0


def load_handler(spec: str) -> Any:
    """``MODULE:FUNCTION`` -> the task handler it names (``handler(record, ctx)``), imported
    as ``python -m`` would (the working directory is on the path)."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigurationError(f"--handler {spec!r}: expected MODULE:FUNCTION, e.g. myjob.handlers:enrich")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"--handler {spec!r}: cannot import {module}: {exc}") from exc
    handler = getattr(found, name, None)
    if not callable(handler):
        raise ConfigurationError(f"--handler {spec!r}: {module} has no function {name}")
    return handler


def _cmd_task(args: argparse.Namespace) -> int:
    from broker.task import Task, TaskConfig
    from broker.topics import REPLAY_SUFFIX, replay_topic

    handler = load_handler(args.handler)
    inputs = list(args.topics)
    if not args.no_replay_topics:
        inputs += [replay_topic(t) for t in args.topics if not t.endswith(REPLAY_SUFFIX)]
    config = TaskConfig(
        batch_size=args.batch_size, commit_interval_s=args.commit_interval_ms / 1000,
        fail_on_exception=not args.stop_on_exception, metrics_port=args.metrics_port,
    )
    counters = Task(_settings(args), args.namespace, list(dict.fromkeys(inputs)), args.group, handler, config).run(
        install_signals=True
    )
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

    settings = _settings(args)
    if args.action == "list":
        listed = dlq.list_entries(settings, args.namespace, args.limit)
        if args.json:
            sys.stdout.write(orjson.dumps([dlq.entry_json(e, m) for e, m in listed]).decode() + "\n")
        else:
            for entry, marker in listed:
                print(dlq.format_entry(entry, marker))
            print(f"{len(listed)} entries in {args.namespace}.dlq", file=sys.stderr)
        return 0
    result = dlq.redrive(
        settings,
        args.namespace,
        reason_prefix=args.reason_prefix,
        origins=[dlq.parse_origin(o) for o in args.origin or ()] or None,
        timeout_ms=int(args.timeout * 1000) if args.timeout else None,
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

    try:
        ident = trace.parse_id(args.id)
    except ValueError as exc:
        raise ReplayBrokerError(f"trace takes an srid or origin (decimal or 0x hex), got {args.id!r}") from exc
    result = trace.trace(_settings(args), args.namespace, ident)
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
    Bridge(_settings(args), args.namespace, config).run(install_signals=True)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from broker.dev.demo import main_demo

    return main_demo(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from broker.bench.cli import main_bench

    return main_bench(args)


class _Help(argparse.HelpFormatter):
    """Shows every option's default next to its help (units are in the help text), unless
    the help names its default itself or there is none (a flag, an optional value)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            text += " (default: %(default)s)"
        return text


def _parser(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help, formatter_class=_Help)


def _cluster(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap", metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS; one of them is needed)",
    )
    where.add_argument(
        "--local", action="store_true",
        help="use the running embedded Kafka (`replaybroker kafka up`) instead",
    )
    parser.add_argument("--namespace", required=True, help="the namespace NS of the topics NS.persist, NS.acks ...")


def _metrics_port(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port", type=int, metavar="N",
        help="serve Prometheus metrics (replaybroker_*) on http://0.0.0.0:N/metrics (default: no metrics server)",
    )


def build_parser() -> argparse.ArgumentParser:
    from broker import __version__

    parser = argparse.ArgumentParser(prog="replaybroker", description=__doc__, formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"replaybroker {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = _parser(sub, "kafka", "the embedded single-node Kafka (development and demos)")
    kafka.add_argument("action", choices=["up", "status", "down"], help="start, show or stop it")
    kafka.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/kafka)")
    kafka.add_argument("--jfr", metavar="FILE",
                       help="with up: record the broker with Java Flight Recorder; written to FILE at kafka down "
                            "(default: no recording)")
    kafka.add_argument("--brokers", type=int, default=1,
                       help="nodes: 1 (default) is the embedded single node; 3 a local KRaft cluster with "
                       "replication 3 / min.insync 2 (run dir ~/.cache/replaybroker/run/kafka-cluster)")
    kafka.add_argument(
        "--sasl", action="store_true",
        help="the secured broker: SASL/SCRAM-SHA-512, ACLs, super user admin (own run dir and ports)",
    )
    kafka.add_argument("--tls", action="store_true", help="--sasl up: SASL_SSL with a self-signed CA (keytool)")
    kafka.add_argument("--user", action="append", metavar="NAME", help="--sasl up: a SCRAM user to create (repeatable)")
    kafka.set_defaults(func=_cmd_kafka)

    spark = _parser(sub, "spark", "a local standalone Spark master with one worker (pyspark's jars)")
    spark.add_argument("action", choices=["up", "status", "down"], help="start (prints the master URL), show or stop it")
    spark.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/spark)")
    spark.add_argument("--cores", type=int, default=2, help="up: cores the worker offers")
    spark.add_argument("--memory", default="2g", help="up: memory the worker offers to executors")
    spark.set_defaults(func=_cmd_spark)

    setup = _parser(sub, "setup", "resolve the Kafka, Spark connector and Delta Lake jars (Maven)")
    setup.set_defaults(func=_cmd_setup)

    top = _parser(sub, "topics", "create or check a namespace's topics")
    top.add_argument(
        "action", choices=["create", "check", "acls"],
        help="create what is missing, only check, or print (--apply: create) a role's ACLs",
    )
    _cluster(top)
    top.add_argument("--partitions", type=int, help="ledger partitions P (create)")
    top.add_argument(
        "--data-topic", action="append", metavar="NAME:PARTITIONS",
        help="a data topic and its partition count; its NAME.replay is created beside it (repeatable)",
    )
    top.add_argument(
        "--replication-factor", type=int,
        help="replicas per partition (create; default: 3 on a cluster of at least 3 brokers, else 1 with a warning)",
    )
    top.add_argument(
        "--min-insync-replicas", type=int,
        help="replicas an acks=all write needs (create; default: 2 with replication 3, else 1)",
    )
    top.add_argument("--role", choices=["source", "task", "acker", "bridge"], help="acls: the role")
    top.add_argument("--principal", metavar="User:NAME", help="acls: the principal of the role")
    top.add_argument("--apply", action="store_true", help="acls: create them (default: print only)")
    top.add_argument("--group", help="acls (task, bridge): the consumer group")
    top.add_argument("--input", action="append", metavar="TOPIC", help="acls (task, bridge): an input topic (repeatable)")
    top.add_argument("--output", action="append", metavar="TOPIC", help="acls (task, bridge): an output topic (repeatable)")
    top.add_argument("--transactional-id", help="acls (source): its transactional id")
    top.set_defaults(func=_cmd_topics)

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
        "--session-timeout-ms", type=int, default=10_000,
        help="how long a silent (killed) acker keeps its partitions; within the broker's "
        "group.consumer.min/max.session.timeout.ms",
    )
    acker.add_argument("--commit-interval-ms", type=int, default=100, help="time between commits, ms")
    # Records sent with timeout "auto" (AckerConfig.adaptive_*; unset: its defaults).
    acker.add_argument("--adaptive-floor-ms", type=int, help="'auto' timeouts: the shortest the acker gives, ms (1000)")
    acker.add_argument(
        "--adaptive-ceiling-ms", type=int,
        help="'auto' timeouts: the longest, and the first before enough samples, ms (300000)",
    )
    acker.add_argument(
        "--adaptive-safety-factor", type=float,
        help="'auto' timeouts: p99.9 of the topic's completion latency times this (3)",
    )
    acker.add_argument(
        "--orphan-ttl-ms", type=int, default=60_000,
        help="how long events for an unknown srid are kept before they count as orphans, ms",
    )
    acker.add_argument(
        "--watch-ms", type=int,
        help="how long a replayed timeout is watched for a late completion of its original, which "
        "supersedes the replay - and how long a last attempt's dead letter waits for it; 0: no "
        "watches, ms (default: the orphan TTL)",
    )
    acker.add_argument(
        "--max-watches", type=int, default=100_000,
        help="watches kept per ledger partition (those over it are not watched, counted watch_skipped)",
    )
    acker.add_argument(
        "--expiry-lag-slack", type=int, default=0,
        help="unread input messages that still count as caught up when judging timeouts "
        "(0: timeouts wait until every ack written before the deadline is read)",
    )
    acker.add_argument(
        "--standby",
        action="store_true",
        help="tail the changelog of partitions this instance does not own (fast takeover)",
    )
    _metrics_port(acker)
    acker.add_argument(
        "--unsafe-no-transactions",
        action="store_true",
        help="fold WITHOUT transactions - loses exactly-once; only to demonstrate what breaks",
    )
    acker.set_defaults(func=_cmd_acker)

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
    tk.add_argument("--batch-size", type=int, default=1000, help="records per poll, at most")
    tk.add_argument("--commit-interval-ms", type=int, default=100,
                    help="how often the task waits for its outputs and commits its offsets, ms")
    tk.add_argument("--stop-on-exception", action="store_true",
                    help="a handler exception stops the task (default: it fails the record: replay, then DLQ)")
    _metrics_port(tk)
    tk.set_defaults(func=_cmd_task)

    st = _parser(sub, "status", "pending, completed, replayed, DLQ of a namespace")
    _cluster(st)
    st.add_argument("--json", action="store_true", help="one JSON object on stdout")
    st.set_defaults(func=_cmd_status)

    tr = _parser(
        sub, "trace",
        "where one source record is: every attempt's persist record, ledger entry, decision, replay "
        "and DLQ entry (reads the owning partitions of NS.persist and NS.ledger, but the WHOLE replay "
        "topic and NS.dlq: slow on large ones)",
    )
    _cluster(tr)
    tr.add_argument("id", help="an srid of any attempt, or the origin (decimal, or 0x hex of its 8 bytes)")
    tr.add_argument("--json", action="store_true", help="one JSON object on stdout")
    tr.set_defaults(func=_cmd_trace)

    br = _parser(
        sub, "bridge",
        "turn an existing topic into source records: persist + data record per input record, the input "
        "offsets committed in the same transaction (SIGTERM stops it cleanly)",
    )
    _cluster(br)
    br.add_argument("--from", dest="from_topic", required=True, metavar="TOPIC", help="the input topic")
    br.add_argument("--to", metavar="TOPIC", help="the target data topic (default: TOPIC.guaranteed; "
                    "it and its replay topic must exist)")
    br.add_argument("--group", help="the input's consumer group (default: NS.bridge.TOPIC)")
    br.add_argument("--instance-id", help="stable id of this instance: transactional id NS.bridge.ID and a static "
                    "group member, so a restart aborts its predecessor's transaction at once (default: host "
                    "name + process id, new at every start)")
    br.add_argument("--batch-records", type=int, default=1000, help="input records per transaction, at most")
    br.add_argument("--batch-ms", type=int, default=100, help="time a transaction stays open, at most, ms")
    br.add_argument("--session-timeout-ms", type=int, default=10_000,
                    help="how long a silent (killed) instance keeps its input partitions")
    br.add_argument("--timeout-ms", type=int, default=30_000, help="per-record timeout of the source records, ms")
    br.add_argument("--max-attempts", type=int, default=5, help="attempts before the DLQ")
    br.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka",
                    help="how keys map to partitions of the target topic")
    br.add_argument("--start", choices=["earliest", "latest"], default="earliest",
                    help="where a new group starts reading the input: every record it holds, or only "
                    "what is written from now on (a group with committed offsets resumes there)")
    br.add_argument("--unsafe-commit", action="store_true",
                    help="commit input offsets AFTER the records, outside any transaction - a crash repeats "
                    "records; only to demonstrate what breaks")
    br.set_defaults(func=_cmd_bridge)

    part = _parser(sub, "partition", "print the partition index of each string key")
    part.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka",
                      help="Kafka's murmur2 or Spark's HashPartitioning")
    part.add_argument("--partitions", type=int, required=True, help="partition count of the topic")
    part.add_argument("keys", nargs="+", help="keys (UTF-8 strings)")
    part.set_defaults(func=_cmd_partition)

    demo = _parser(sub, "demo", "run the end-to-end demo on the embedded (or given) Kafka")
    demo.add_argument("--bootstrap", metavar="HOST:PORT", help="existing Kafka (default: the embedded one)")
    demo.add_argument("--records", type=int, default=10_000, help="source records to send")
    demo.add_argument("--json", action="store_true", help="one JSON object on stdout")
    demo.add_argument(
        "--fail-rate", type=float, default=None,
        help="fraction of first attempts failed explicitly (default: 0, with --spark 0.05)",
    )
    demo.add_argument("--drop-rate", type=float, default=0.0, help="fraction of first attempts never acked")
    demo.add_argument("--timeout", type=float, default=30.0, help="per-record timeout, seconds")
    demo.add_argument("--max-attempts", type=int, default=5, help="attempts before the DLQ")
    demo.add_argument("--spark", action="store_true", help="source -> Spark job -> acker")
    demo.add_argument("--master", metavar="URL",
                      help="with --spark: the Spark master, e.g. spark://127.0.0.1:7077 from "
                      "`replaybroker spark up` (default: $SPARK_MASTER, else local[2])")
    demo.add_argument("--keep", action="store_true", help="keep the demo's topics (default: delete them)")
    demo.set_defaults(func=_cmd_demo)

    bench = _parser(sub, "bench", "measure the figures of docs/design.md §9 beside their baselines (broker/bench/)")
    from broker.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    bench.set_defaults(func=_cmd_bench)

    dl = _parser(sub, "dlq", "list the dead-letter queue, or redrive records from it")
    dl.add_argument("action", choices=["list", "redrive"], help="show entries, or re-inject them")
    _cluster(dl)
    dl.add_argument("--json", action="store_true", help="JSON on stdout")
    dl.add_argument("--limit", type=int, help="list: the first N entries (default: all)")
    dl.add_argument("--reason-prefix", help="redrive: only entries whose reason starts with this")
    dl.add_argument(
        "--origin", nargs="+", action="extend", metavar="ID",
        help="redrive: only these origin ids (as `dlq list` prints them, or 0x hex)",
    )
    dl.add_argument("--dry-run", action="store_true", help="redrive: show what would be redriven")
    dl.add_argument("--timeout", type=float, help="redrive: per-record timeout, seconds (default: 30)")
    dl.add_argument("--max-attempts", type=int, help="redrive: attempts before the DLQ again (default: 5)")
    dl.set_defaults(func=_cmd_dlq)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from confluent_kafka import KafkaException

    # The failures a command line tool expects (the cluster, the namespace, the input) are
    # one line, ``replaybroker: <what failed>: <why>``; -v adds the traceback.
    try:
        return int(args.func(args))
    except (ReplayBrokerError, KafkaException) as exc:
        if args.verbose:
            traceback.print_exception(exc)
        if isinstance(exc, KafkaException):
            print(f"replaybroker: {args.command} failed: {_kafka_reason(exc)}", file=sys.stderr)
        else:
            print(f"replaybroker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
