"""The cluster a command talks to - always an explicit choice - and the check that it
answers before a command starts."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.errors import ConfigurationError, KafkaUnreachable

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


def local_broker() -> LocalBroker:
    found = local_brokers()
    if not found:
        raise ConfigurationError("--local: no local Kafka is running (start one with `replaybroker kafka up`)")
    if len(found) > 1:
        running = ", ".join(f"{b.bootstrap} ({b.started_by})" for b in found)
        raise ConfigurationError(f"--local: {len(found)} local Kafkas are running: {running}; pass --bootstrap instead")
    return found[0]


def connection(args: argparse.Namespace) -> tuple[str, Path | None]:
    """The cluster of a service or admin command, and the ``.env`` file of its settings:
    always an explicit choice. An acker or a redrive silently pointed at a development broker
    is worse than one that refuses."""
    if args.local:
        local = local_broker()
        return local.bootstrap, local.env_file
    from broker.settings import env_settings

    servers = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or env_settings().bootstrap_servers
    if not servers:
        raise ConfigurationError(NO_CLUSTER)
    return str(servers), None


@dataclass(frozen=True)
class Calls:
    """What the commands run against their cluster when it is not the broker's own
    (``main(calls=)``: a test hands in stand-ins). None: the broker's, imported when the
    command runs (a service's module takes seconds to import on a small machine)."""

    status: Callable[..., dict[str, Any]] | None = None  # broker.status.status
    acker: Callable[..., Any] | None = None  # broker.acker.Acker
    topics_check: Callable[..., int] | None = None  # broker.topics.check
    check_replication: Callable[..., tuple[list[str], list[str]]] | None = None  # broker.topics.check_replication
    dlq_entries: Callable[..., list[Any]] | None = None  # broker.dlq.list_entries


def calls_of(args: argparse.Namespace) -> Calls:
    """The ``Calls`` ``main`` was handed (``args.calls``)."""
    return getattr(args, "calls", None) or Calls()


REACH_TIMEOUT_S = 10.0
"""How long a command waits for a cluster that accepts connections but does not answer."""
REACH_POLL_S = (0.1, 1.0)
"""The first wait for the metadata answer, doubled up to the last: a refusal is seen between
two waits, a distant cluster gets longer ones."""
RETRY_PAUSE_S = (1.0, 10.0)
"""A service's first pause before it tries an unreachable cluster again, doubled up to the last."""

log = logging.getLogger(__name__)


def check_reachable(
    settings: Any,
    *,
    verbose: bool = False,
    timeout_s: float = REACH_TIMEOUT_S,
    wait_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    attempt: Callable[..., None] | None = None,
) -> None:
    """Raise ``KafkaUnreachable`` unless the cluster answers a metadata request: a command
    against a wrong address fails with the reason librdkafka saw (refused, unresolvable,
    authentication ...) as soon as it saw it - once every bootstrap server failed - and
    after ``timeout_s`` for a cluster that connects but never answers.

    A service (``wait_s`` > 0) started while its cluster is down - a broker restarting - asks
    again with growing pauses for up to ``wait_s``, saying so in one line, then fails the same
    way; a refused authentication or TLS handshake fails at once. ``attempt``: one try
    (default: a metadata request, ``_reach``)."""
    attempt = attempt or _reach
    started, pause = clock(), RETRY_PAUSE_S[0]
    while True:
        try:
            attempt(settings, verbose=verbose, timeout_s=timeout_s)
            return
        except KafkaUnreachable as exc:
            if not exc.retriable or clock() - started + pause > wait_s:
                raise
            if pause == RETRY_PAUSE_S[0]:
                log.warning("%s; trying again for up to %.0fs", exc, wait_s)
        sleep(pause)
        pause = min(pause * 2, RETRY_PAUSE_S[1])


def _reach(settings: Any, *, verbose: bool, timeout_s: float) -> None:
    """One attempt of ``check_reachable``."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    from broker.kafka_errors import Meaning, means
    from broker.kafka_log import without_timing

    errors: list[KafkaError] = []
    conf = settings.client_config()
    conf["error_cb"] = errors.append  # they become the reason of the one line
    if not verbose:
        conf["log_level"] = 0  # the same reasons, once per connection attempt
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout_s
    wait, longest = REACH_POLL_S
    while True:
        try:
            admin.list_topics(timeout=min(wait, max(deadline - time.monotonic(), 0.01)))
            return
        except KafkaException as exc:
            failure = exc
        wait = min(wait * 2, longest)
        admin.poll(0)  # serves the errors collected meanwhile
        if time.monotonic() >= deadline or any(means(e, Meaning.ALL_BROKERS_DOWN | Meaning.CREDENTIALS) for e in errors):
            break
    reasons = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
    why = without_timing(reasons[-1]) if reasons else kafka_reason(failure)
    unreachable = KafkaUnreachable(f"cannot reach Kafka at {settings.bootstrap_servers}: {why}")
    unreachable.retriable = not any(means(e, Meaning.CREDENTIALS) for e in errors)
    raise unreachable from failure


def kafka_reason(exc: BaseException) -> str:
    from confluent_kafka import KafkaError

    from broker.errors import KafkaClientError

    if isinstance(exc, KafkaClientError):
        return exc.reason
    err = exc.args[0] if exc.args else None
    return str(err.str()) if isinstance(err, KafkaError) else str(exc)


def cluster_settings(args: argparse.Namespace) -> Any:
    """The ``KafkaSettings`` of a command's cluster, once it answered (``-v``: printed) to
    ``args.reach`` (``main``'s ``reach``; default ``check_reachable``)."""
    from broker.settings import KafkaSettings

    bootstrap, env_file = connection(args)
    # A service (--wait-for-kafka-ms) waits for a cluster it cannot reach yet; a command fails at once.
    wait = getattr(args, "wait_for_kafka_ms", None)
    overrides: dict[str, Any] = {} if wait is None else {"start_wait_s": wait / 1000}
    settings = KafkaSettings.from_env(bootstrap, **({"env_file": env_file} if env_file else {}), **overrides)
    if args.verbose:
        print_config(settings, args.command)
    service = hasattr(args, "wait_for_kafka_ms")
    reach = getattr(args, "reach", None) or check_reachable
    reach(settings, verbose=args.verbose, wait_s=settings.start_wait_s if service else 0.0)
    return settings


def print_config(settings: Any, command: str, file: Any = None) -> None:
    """The effective connection of a command (``-v``), one ``key=value`` a line on stderr,
    secrets masked: what the services will hand to librdkafka."""
    out = file or sys.stderr
    print(f"replaybroker {command}: effective Kafka configuration", file=out)
    for key, value in sorted(settings.describe().items()):
        print(f"  {key}={value}", file=out)
