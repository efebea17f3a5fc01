"""Topics and ACLs: ``topics create|check|acls`` and ``partition``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from broker.cli.args import POSITIVE, action, actions, cluster, command, data_topic, topic_name
from broker.cli.connection import calls_of, cluster_settings
from broker.errors import ConfigurationError

# The flags of `topics acls` each role takes; any other is an error, not ignored.
ROLE_FLAGS = {
    "source": ("data_topic", "transactional_id"),
    "task": ("group", "input", "output"),
    "acker": ("data_topic",),
    "bridge": ("group", "input", "output"),
    "console": ("data_topic", "redrive"),
}
_ACL_FLAGS = ("data_topic", "transactional_id", "group", "input", "output", "redrive")


def add_topics(sub: Any) -> None:
    top = command(sub, "topics", "create or check a namespace's topics, or print a role's ACLs")
    acts = actions(top, "create what is missing, only check, or print (--apply: create) a role's ACLs")

    def data_topics(parser: argparse.ArgumentParser, help: str) -> None:
        parser.add_argument("--data-topic", action="append", type=data_topic, metavar="NAME:PARTITIONS", help=help)

    create = action(acts, "create", "create the namespace's topics that are missing, then check them all",
                    run_topics)
    cluster(create)
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
    check = action(acts, "check", "check the namespace's topics: partitions, settings, replication", run_topics)
    cluster(check)
    data_topics(check, "a data topic and its partition count, checked with its NAME.replay (repeatable)")

    acls = action(acts, "acls", "print the least ACLs of a role (--apply: create them)", run_acls)
    cluster(acls)
    acls.add_argument("--role", choices=list(ROLE_FLAGS), required=True, help="the role")
    acls.add_argument("--principal", metavar="User:NAME", required=True, help="the principal of the role")
    acls.add_argument("--apply", action="store_true", help="create them (default: print only)")
    acls.add_argument("--data-topic", action="append", type=topic_name, metavar="NAME",
                      help="source, acker, console: a data topic it writes, or whose replay topic it writes or reads (repeatable)")
    acls.add_argument("--group", help="task, bridge: the consumer group (bridge default: NS.bridge.INPUT)")
    acls.add_argument("--input", action="append", metavar="TOPIC", help="task, bridge: an input topic (repeatable)")
    acls.add_argument("--output", action="append", metavar="TOPIC",
                      help="task, bridge: an output topic (repeatable; bridge default: INPUT.guaranteed)")
    acls.add_argument("--transactional-id", help="source: its transactional id, if it uses transactions")
    acls.add_argument("--redrive", action="store_true",
                      help="console: also what a redrive writes (default: read-only, and its audit log)")


def run_topics(args: argparse.Namespace) -> int:
    from broker import topics

    ns = topics.Namespace(args.namespace)
    data = dict(args.data_topic or [])
    settings = cluster_settings(args)
    if args.action == "create":
        created = topics.create(settings, ns, args.partitions, data, replication=args.replication_factor,
                                min_insync=args.min_insync_replicas)
        for name in created:
            print(f"created {name}")
    calls = calls_of(args)
    P = (calls.topics_check or topics.check)(settings, ns, data)
    problems, warnings = (calls.check_replication or topics.check_replication)(settings, ns, data)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if problems:
        print(f"namespace {ns.name}: {P} ledger partitions, replication problems:", file=sys.stderr)
        for line in problems:
            print(f"- {line}", file=sys.stderr)
        return 2
    print(f"namespace {ns.name}: ok, {P} ledger partitions")
    return 0


def run_acls(args: argparse.Namespace) -> int:
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
        redrive=args.redrive,
    )
    for line in acls.render(principal, rules):
        print(line)
    if args.apply:
        n = acls.apply(cluster_settings(args), principal, rules)
        print(f"applied {n} ACLs for {principal}", file=sys.stderr)
    return 0


def add_partition(sub: Any) -> None:
    part = command(sub, "partition", "print the partition index of each string key")
    part.add_argument("--partitioner", choices=["kafka", "spark"], default="kafka",
                      help="Kafka's murmur2 or Spark's HashPartitioning")
    part.add_argument("--partitions", type=POSITIVE, required=True, help="partition count of the topic")
    part.add_argument("keys", nargs="+", help="keys (UTF-8 strings)")
    part.set_defaults(func=run_partition)


def run_partition(args: argparse.Namespace) -> int:
    from broker.partitioning import partition_keys

    for index in partition_keys(args.partitioner, args.partitions, args.keys):
        print(index)
    return 0
