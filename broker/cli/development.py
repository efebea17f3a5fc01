"""Development: a local ``kafka`` and ``spark``, ``setup`` of their jars, the ``demo`` and
``bench``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from broker.cli.args import POSITIVE, action, actions, command, fraction, json_option
from broker.errors import ConfigurationError

# ------------------------------------------------------------------ kafka and spark


def add_kafka(sub: Any) -> None:
    kafka = command(sub, "kafka", "a local Kafka for development and demos: one node, a cluster, or a secured one")
    acts = actions(kafka, "start it (prints the bootstrap servers), show it or stop it")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/kafka, "
                        "run/kafka-cluster with --brokers, run/kafka-sasl with --sasl)")
    common.add_argument("--brokers", type=POSITIVE, default=1,
                        help="nodes: 1 is one node; more a local KRaft cluster, replication 3 and "
                        "min.insync 2 from 3 nodes on")
    common.add_argument("--sasl", action="store_true",
                        help="the secured broker: SASL/SCRAM-SHA-512, ACLs, super user admin (own run dir and ports)")
    for name, help in (("up", "start it"), ("status", "show whether it runs"), ("down", "stop it")):
        act = action(acts, name, help, run_kafka, parents=[common])
        act.set_defaults(jfr=None, tls=False, user=None)
        if name == "up":
            act.add_argument("--jfr", metavar="FILE", help="one node: record the broker with Java Flight "
                             "Recorder, written to FILE at kafka down (default: no recording)")
            act.add_argument("--tls", action="store_true", help="with --sasl: SASL_SSL with a self-signed CA")
            act.add_argument("--user", action="append", metavar="NAME",
                             help="with --sasl: a SCRAM user to create (repeatable)")


def check_kafka(args: argparse.Namespace) -> None:
    if (args.tls or args.user) and not args.sasl:
        raise ConfigurationError(f"kafka up {'--tls' if args.tls else '--user'} needs --sasl")
    if args.sasl and args.brokers > 1:
        raise ConfigurationError("kafka --sasl is one node: --brokers cannot be used with it")
    if args.jfr and (args.sasl or args.brokers > 1):
        raise ConfigurationError("kafka up --jfr records the one-node broker only")


def run_kafka(args: argparse.Namespace) -> int:
    from broker.dev import kafka_cluster, kafka_local

    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.sasl:
        from broker.dev import kafka_sasl

        run_dir = run_dir or kafka_sasl.default_sasl_run_dir()
        if args.action == "up":
            return kafka_sasl.main_up_sasl(run_dir, args.user or (), tls=args.tls)
    if args.action == "down":
        # What runs in a run dir is what `kafka up` recorded there, whatever --brokers says.
        if run_dir is None:
            run_dir = kafka_cluster.default_cluster_dir() if args.brokers > 1 else kafka_local.default_run_dir()
        print("stopped" if kafka_cluster.stop_recorded(run_dir) else "not running")
        return 0
    if args.brokers > 1:
        return _kafka_cluster(args, run_dir)
    if args.action == "up":
        return kafka_local.main_up(run_dir, jfr=args.jfr)
    kafka = kafka_local.LocalKafka(run_dir)
    state = kafka_local.running_state(kafka.run_dir)
    if state is None:
        print(f"not running (run dir {kafka.run_dir})")
        return 1
    print(f"running: {state.bootstrap} Kafka {state.kafka_version} pid {state.pid} run dir {state.run_dir}")
    return 0


def _kafka_cluster(args: argparse.Namespace, run_dir: Path | None) -> int:
    from broker.dev import kafka_cluster

    cluster = kafka_cluster.LocalCluster(args.brokers, run_dir)
    if args.action == "up":
        return kafka_cluster.main_up(args.brokers, run_dir)
    state = kafka_cluster.running_cluster(cluster.run_dir)
    if state is None:
        print(f"not running (run dir {cluster.run_dir})")
        return 1
    print(f"running: {state.bootstrap} Kafka {state.kafka_version} pids {state.pids} run dir {state.run_dir}")
    return 0


def add_spark(sub: Any) -> None:
    spark = command(sub, "spark", "a local standalone Spark master with one worker (pyspark's jars)")
    acts = actions(spark, "start it (prints the master URL), show it or stop it")
    for name, help in (("up", "start it"), ("status", "show whether it runs"), ("down", "stop it")):
        act = action(acts, name, help, run_spark)
        act.add_argument("--run-dir", help="state directory (default: ~/.cache/replaybroker/run/spark)")
        if name == "up":
            act.add_argument("--cores", type=POSITIVE, default=2, help="cores the worker offers")
            act.add_argument("--memory", default="2g", help="memory the worker offers to executors")


def run_spark(args: argparse.Namespace) -> int:
    from broker.dev import spark_cluster

    run_dir = Path(args.run_dir) if args.run_dir else None
    if args.action == "up":
        return spark_cluster.main_up(run_dir, cores=args.cores, memory=args.memory)
    if args.action == "status":
        return spark_cluster.main_status(run_dir)
    print("stopped" if spark_cluster.LocalSparkCluster(run_dir).stop() else "not running")
    return 0


# ------------------------------------------------------------------ setup


def add_setup(sub: Any) -> None:
    setup = command(sub, "setup", "download the Kafka, Spark connector and Delta Lake jars (Maven)")
    setup.set_defaults(func=run_setup)


def run_setup(args: argparse.Namespace) -> int:
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


# ------------------------------------------------------------------ demo

SPARK_SINKS = ("parquet", "delta")
"""The sinks of the Spark demo (``spark_jobs.demo.SINKS``; that module needs pyspark)."""


def add_demo(sub: Any) -> None:
    demo = command(sub, "demo", "run the end-to-end demo: source -> task -> task -> acker, with failures")
    demo.add_argument("--bootstrap", metavar="HOST:PORT", help="the Kafka to run on (default: "
                      "$KAFKA_BOOTSTRAP_SERVERS, else the running embedded Kafka, else a new embedded one)")
    demo.add_argument("--records", type=POSITIVE, default=10_000, help="source records to send")
    json_option(demo)
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
    demo.add_argument("--sink", choices=SPARK_SINKS,
                      help="with --spark: where the job writes, OriginParquetSink or OriginDeltaSink "
                      "(Delta's jars: `replaybroker setup`) (default: parquet)")
    demo.add_argument("--keep", action="store_true", help="keep the demo's topics (default: delete them)")
    demo.set_defaults(func=run_demo)


def check_demo(args: argparse.Namespace) -> None:
    if args.sink and not args.spark:
        raise ConfigurationError("demo --sink needs --spark")


def run_demo(args: argparse.Namespace) -> int:
    from broker.cli.connection import check_reachable
    from broker.dev.demo import main_demo
    from broker.dev.kafka_local import demo_cluster
    from broker.settings import KafkaSettings

    bootstrap, where = demo_cluster(args.bootstrap)
    print(f"demo on {bootstrap} ({where}): {args.records} records", file=sys.stderr)
    reach = getattr(args, "reach", None) or check_reachable  # main's reach
    reach(KafkaSettings.from_env(bootstrap), verbose=args.verbose)
    return main_demo(args, bootstrap)


# ------------------------------------------------------------------ bench


def add_bench(sub: Any) -> None:
    from broker.bench.cli import add_arguments

    bench = command(sub, "bench", "measure throughput, latency and recovery beside their baselines")
    add_arguments(bench)
    bench.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from broker.bench.cli import main_bench

    return main_bench(args)
