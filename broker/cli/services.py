"""The services: ``acker``, ``task``, ``run`` (an App's roles) and ``bridge`` - each runs
until SIGTERM. Their tunables are options of the config dataclass they fill
(``AckerConfig``, ``TaskConfig``, ``BridgeConfig``), with that field's default. Those
dataclasses live beside the services, whose modules take a second or more to import: they
are imported when a parser of theirs is built (``SERVICES``), not with this module."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.cli.args import (
    AT_LEAST_ZERO,
    PORT,
    POSITIVE,
    add_config_options,
    command,
    config_values,
    option,
    positive_real,
    service_cluster,
)
from broker.cli.connection import calls_of, cluster_settings
from broker.errors import ConfigurationError

if TYPE_CHECKING:
    from broker.acker.config import AckerConfig

log = logging.getLogger("replaybroker")


METRICS_PORT = option(
    "--metrics-port", type=PORT, metavar="N",
    help="serve Prometheus metrics (replaybroker_*) on http://0.0.0.0:N/metrics (default: no metrics server)",
)


# ------------------------------------------------------------------ acker

ACKER_OPTIONS = (
    option(
        "--dynamic-membership", field="static_membership", inverted=True,
        help="with --instance-id, still join as a dynamic member: a clean stop hands the partitions "
        "over at once (scaling down) instead of keeping them for a restart up to the session timeout",
    ),
    option(
        "--group-protocol", choices=["consumer", "classic"],
        help="consumer (KIP-848, Kafka >= 4.0): only partitions that change owner move; "
        "classic: eager range rebalances that pause every acker (older clusters)",
    ),
    option(
        "--session-timeout-ms", type=POSITIVE,
        help="how long a silent (killed) acker keeps its partitions; within the broker's "
        "group.consumer.min/max.session.timeout.ms",
    ),
    option("--commit-interval-ms", type=POSITIVE, help="time between commits"),
    option(
        "--transaction-timeout-ms", type=POSITIVE,
        help="how long a commit's transaction may stay open before its coordinator aborts it; a "
        "takeover after a kill -9 waits this long for the dead instance's open transaction. Raise it "
        "when a commit touching many partitions takes longer (one produce request a partition)",
    ),
    # Records sent with timeout "auto".
    option("--adaptive-floor-ms", type=POSITIVE, help="'auto' timeouts: the shortest the acker gives"),
    option("--adaptive-ceiling-ms", type=POSITIVE,
           help="'auto' timeouts: the longest, and the first before enough samples"),
    option("--adaptive-safety-factor", type=positive_real,
           help="'auto' timeouts: p99.9 of the topic's completion latency times this"),
    option("--orphan-ttl-ms", type=POSITIVE,
           help="how long events for an unknown srid are kept before they count as orphans"),
    option(
        "--watch-ms", type=AT_LEAST_ZERO,
        help="how long a replayed timeout is watched for a late completion of its original, which "
        "supersedes the replay - and how long a last attempt's dead letter waits for it; 0: no "
        "watches (default: the orphan TTL)",
    ),
    option("--replay-rate-per-s", type=positive_real,
           help="replays a second per data topic at most, a second's worth as a burst; the rest wait "
           "in the ledger, in order (default: no limit)"),
    option("--max-watches", type=AT_LEAST_ZERO,
           help="watches kept per ledger partition (those over it are not watched, counted watch_skipped)"),
    option(
        "--expiry-lag-slack", type=AT_LEAST_ZERO,
        help="unread input messages that still count as caught up when judging timeouts "
        "(0: timeouts wait until every ack written before the deadline is read)",
    ),
    option("--standby", action="store_true",
           help="tail the changelog of partitions this instance does not own (fast takeover)"),
    METRICS_PORT,
    option("--unsafe-no-transactions", field="exactly_once", inverted=True,
           help="fold WITHOUT transactions - loses exactly-once; only to demonstrate what breaks"),
)
"""The options of ``replaybroker acker`` that set an ``AckerConfig`` field, in help order."""


ACKER_HELP = "run an acker (SIGTERM stops it cleanly)"


def add_acker(sub: Any) -> None:
    from broker.acker.config import AckerConfig

    acker = command(sub, "acker", ACKER_HELP)
    service_cluster(acker)
    acker.add_argument(
        "--instance-id",
        help="stable id of this instance: a restart with the same id fences its predecessor's "
        "transaction at once and, as a static group member, gets its partitions back without moving "
        "anyone else's (default: host name + process id, unique but new at every start)",
    )
    add_config_options(acker, AckerConfig, ACKER_OPTIONS)
    acker.set_defaults(func=run_acker)


def acker_config(args: argparse.Namespace) -> AckerConfig:
    """The ``AckerConfig`` of ``replaybroker acker``'s arguments."""
    from broker.acker.config import AckerConfig

    return AckerConfig(
        **config_values(args, ACKER_OPTIONS),
        **({"instance_id": args.instance_id} if args.instance_id else {}),
    )


def run_acker(args: argparse.Namespace) -> int:
    from broker.acker import Acker
    from broker.background import tune_gc_for_service

    config = acker_config(args)
    acker = (calls_of(args).acker or Acker)(cluster_settings(args), args.namespace, config)
    tune_gc_for_service()
    acker.run(install_signals=True)
    return 0


# ------------------------------------------------------------------ task

TASK_OPTIONS = (
    option("--batch-size", type=POSITIVE, help="records per poll, at most"),
    option("--commit-interval-ms", type=AT_LEAST_ZERO,
           help="how often the task waits for its outputs and commits its offsets (0: after every batch)"),
    option("--stop-on-exception", field="fail_on_exception", inverted=True,
           help="a handler exception stops the task (default: it fails the record: replay, then DLQ)"),
    option(
        "--group-protocol", choices=["consumer", "classic"],
        help="consumer (KIP-848, Kafka >= 4.0; a cluster without it gets classic): only partitions that "
        "change owner move; classic: cooperative-sticky, which may split a topic from its replay topic",
    ),
    METRICS_PORT,
)
"""The options of ``replaybroker task`` that set a ``TaskConfig`` field, in help order."""


TASK_HELP = (
    "run a task as a service: consume TOPICs (and their replay topics) in consumer group GROUP, "
    "call HANDLER(record, ctx) per record, ack or fail it (SIGTERM stops it cleanly)"
)


def add_task(sub: Any) -> None:
    from broker.task import TaskConfig

    tk = command(sub, "task", TASK_HELP)
    service_cluster(tk)
    tk.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                    help="the handler, imported from the working directory or the installed packages")
    tk.add_argument("--topics", nargs="+", required=True, metavar="TOPIC", help="the data topics to consume")
    tk.add_argument("--group", required=True, help="the consumer group (one per task; instances share it)")
    tk.add_argument("--no-replay-topics", action="store_true",
                    help="do not consume TOPIC.replay as well (replays then go unprocessed)")
    add_config_options(tk, TaskConfig, TASK_OPTIONS)
    tk.set_defaults(func=run_task)


def load_object(spec: str, flag: str, example: str, what: str = "") -> Any:
    """``MODULE:NAME`` -> the object it names, imported as ``python -m`` would (the working
    directory is on the path). ``what`` names the kind of object in the errors."""
    import importlib

    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ConfigurationError(f"{flag} {spec!r}: expected MODULE:{what.upper() or 'NAME'}, e.g. {example}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"{flag} {spec!r}: cannot import {module}: {exc}") from exc
    value = getattr(found, name, None)
    if value is None:
        raise ConfigurationError(f"{flag} {spec!r}: {module} has no {what + ' ' if what else ''}{name}")
    return value


def load_handler(spec: str) -> Any:
    """``MODULE:FUNCTION`` -> the task handler it names (``handler(record, ctx)``)."""
    handler = load_object(spec, "--handler", "myjob.handlers:enrich", "function")
    if not callable(handler):
        module, _, name = spec.partition(":")
        raise ConfigurationError(f"--handler {spec!r}: {module} has no function {name}")
    return handler


def run_task(args: argparse.Namespace) -> int:
    from broker.background import tune_gc_for_service
    from broker.task import Task, TaskConfig
    from broker.topics import REPLAY_SUFFIX, replay_topic

    handler = load_handler(args.handler)
    inputs = list(args.topics)
    if not args.no_replay_topics:
        inputs += [replay_topic(t) for t in args.topics if not t.endswith(REPLAY_SUFFIX)]
    config = TaskConfig(**config_values(args, TASK_OPTIONS))
    task = Task(cluster_settings(args), args.namespace, list(dict.fromkeys(inputs)), args.group, handler, config)
    tune_gc_for_service()
    counters = task.run(install_signals=True)
    log.info("task %s stopped: %s", args.group, counters)
    return 0


# ------------------------------------------------------------------ run: an App's roles


def add_run(sub: Any) -> None:
    rn = command(
        sub, "run",
        "run roles of an App (broker.App): each --role in this process (default: all of them), "
        "until SIGTERM or Ctrl-C; in production one role per process",
    )
    rn.add_argument("app", metavar="MODULE:APP", help="the app, e.g. shop.pipeline:app (imported from the "
                    "working directory or the installed packages)")
    rn.add_argument("--role", action="append", metavar="ROLE",
                    help="acker or task:NAME (repeatable; --list shows them)")
    rn.add_argument("--list", action="store_true", help="print the app's roles and exit")
    rn.add_argument("--setup", action="store_true",
                    help="create the app's topics that are missing, check the layout and exit")
    rn.add_argument("--bootstrap", metavar="HOST:PORT",
                    help="Kafka bootstrap servers (default: the app's, else $KAFKA_BOOTSTRAP_SERVERS)")
    rn.set_defaults(func=run_app)


def run_app(args: argparse.Namespace) -> int:
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
    if args.setup:
        print(f"namespace {app.ns.name}: ok, {app.setup()} ledger partitions")
        return 0
    for role in args.role or ():
        app.service(role)  # an unknown role: one line that lists the app's roles
    if args.role and len(args.role) == 1:
        tune_gc_for_service()  # a service process: one loop
    log.info("running %s of %s (namespace %s)", ", ".join(args.role or app.roles), args.app, app.ns.name)
    app.run(args.role)
    return 0


# ------------------------------------------------------------------ bridge

BRIDGE_OPTIONS = (
    option("--batch-records", type=POSITIVE, help="input records per transaction, at most"),
    option("--batch-ms", type=POSITIVE, help="time a transaction stays open, at most"),
    option("--session-timeout-ms", type=POSITIVE,
           help="how long a silent (killed) instance keeps its input partitions"),
    option("--timeout-ms", type=POSITIVE, help="per-record timeout of the source records"),
    option("--max-attempts", type=POSITIVE, help="attempts before the DLQ"),
    option("--partitioner", choices=["kafka", "spark"], help="how keys map to partitions of the target topic"),
    option("--start", choices=["earliest", "latest"],
           help="where a new group starts reading the input: every record it holds, or only "
           "what is written from now on (a group with committed offsets resumes there)"),
    option("--unsafe-commit", field="exactly_once", inverted=True,
           help="commit input offsets AFTER the records, outside any transaction - a crash repeats "
           "records; only to demonstrate what breaks"),
)
"""The options of ``replaybroker bridge`` that set a ``BridgeConfig`` field, in help order."""


BRIDGE_HELP = (
    "turn an existing topic into source records: persist + data record per input record, the input "
    "offsets committed in the same transaction (SIGTERM stops it cleanly)"
)


def add_bridge(sub: Any) -> None:
    from broker.bridge import BridgeConfig

    br = command(sub, "bridge", BRIDGE_HELP)
    service_cluster(br)
    br.add_argument("--from", dest="from_topic", required=True, metavar="TOPIC", help="the input topic")
    br.add_argument("--to", metavar="TOPIC", help="the target data topic; it and its replay topic must exist "
                    "(default: TOPIC.guaranteed)")
    br.add_argument("--group", help="the input's consumer group (default: NS.bridge.TOPIC)")
    br.add_argument("--instance-id", help="stable id of this instance: transactional id NS.bridge.ID and a static "
                    "group member, so a restart aborts its predecessor's transaction at once (default: host "
                    "name + process id, new at every start)")
    add_config_options(br, BridgeConfig, BRIDGE_OPTIONS)
    br.set_defaults(func=run_bridge)


def run_bridge(args: argparse.Namespace) -> int:
    from broker.background import tune_gc_for_service
    from broker.bridge import Bridge, BridgeConfig

    config = BridgeConfig(
        input_topic=args.from_topic, target_topic=args.to or "", group_id=args.group or "",
        instance_id=args.instance_id or "", **config_values(args, BRIDGE_OPTIONS),
    )
    bridge = Bridge(cluster_settings(args), args.namespace, config)
    tune_gc_for_service()
    bridge.run(install_signals=True)
    return 0


SERVICES: dict[str, tuple[Callable[[Any], None], str]] = {
    "acker": (add_acker, ACKER_HELP),
    "task": (add_task, TASK_HELP),
    "bridge": (add_bridge, BRIDGE_HELP),
}
"""The commands whose parser imports a service's module: how to build it, and its help."""
