"""Inspection: ``status``, ``trace`` and ``dlq list|redrive`` - what became of the records."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from broker.cli.args import (
    POSITIVE,
    action,
    actions,
    cluster,
    command,
    json_option,
    moment,
    positive_real,
    record_id,
)
from broker.cli.connection import calls_of, cluster_settings
from broker.errors import ConfigurationError


def add_status(sub: Any) -> None:
    st = command(sub, "status", "pending, completed, replayed, DLQ of a namespace")
    cluster(st)
    json_option(st)
    st.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    import orjson

    from broker.status import status

    result = (calls_of(args).status or status)(cluster_settings(args), args.namespace)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        return 0
    sources = result.pop("sources")
    for name, value in result.items():
        where = f"   ({sources[name]})" if name in sources else ""
        print(f"{name:>24}: {_readable(name, value)}{where}")
    return 0


# A list longer than this is summed up in the text output (the JSON keeps it whole).
LONGEST_LIST = 16


def _readable(name: str, value: object) -> object:
    """``value`` as a line of text stays readable at 1 000 partitions: partition numbers as
    ranges, per-partition figures as their total, spread and the largest ones; the tasks in an
    outage with since when (UTC) and for how long."""
    if name == "outages" and isinstance(value, dict):
        from datetime import UTC, datetime

        return "; ".join(
            f"{task} since {datetime.fromtimestamp(o['since_ms'] / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC ({o['for_s']:.1f} s)"
            for task, o in value.items()
        ) or "none"
    if not isinstance(value, list) or len(value) <= LONGEST_LIST:
        return value
    from broker.ranges import counted

    if name.endswith("_partitions"):  # partition numbers
        return counted(value)
    known = [(n, p) for p, n in enumerate(value) if isinstance(n, int)]
    if not known:
        return f"{len(value)} partitions, none known"
    top = ", ".join(f"{p}: {n}" for n, p in sorted(known, reverse=True)[:5])
    figures = [n for n, _ in known]
    return (f"{len(value)} partitions: total {sum(figures)}, min {min(figures)}, max {max(figures)}; "
            f"largest {top}")


def add_trace(sub: Any) -> None:
    tr = command(
        sub, "trace",
        "where one source record is: every attempt's persist record, ledger entry, decision, replay "
        "and DLQ entry (reads the owning partitions of NS.persist and NS.ledger, but the WHOLE replay "
        "topic and NS.dlq: slow on large ones)",
    )
    cluster(tr)
    tr.add_argument("id", type=record_id, nargs="?",
                    help="an srid of any attempt, or the origin (decimal, or 0x hex of its 8 bytes)")
    tr.add_argument("--key", help="instead of an id: the records of this data key (UTF-8), with --topic")
    tr.add_argument("--topic", help="the data topic of --key: it and its replay topic are read in the key's "
                                    "hash partitions only")
    tr.add_argument("--since", help="with --key: records written since (ISO 8601 or epoch ms; default: 24 h ago)")
    json_option(tr)
    tr.set_defaults(func=run_trace)


def run_trace(args: argparse.Namespace) -> int:
    import time

    import orjson

    from broker import trace
    from broker.console.render import parse_time

    if args.key is not None:
        if args.id is not None or not args.topic:
            raise ConfigurationError("trace takes an id, or --key with --topic")
        since = parse_time(args.since) if args.since else int((time.time() - 24 * 3600) * 1000)
        if since is None:
            raise ConfigurationError(f"--since: not a time: {args.since!r}")
        found = trace.find_key(cluster_settings(args), args.topic, args.key.encode(), since_ms=since)
        if args.json:
            sys.stdout.write(orjson.dumps(found).decode() + "\n")
        else:
            for h in found["hits"]:
                print(f"{h['at_ms']} {h['topic']} {h['partition']}@{h['offset']} attempt {h['attempt']} "
                      f"origin {h['origin']} srid {h['srid']}")
            print(f"{len(found['hits'])} record(s) of the key in {found['scanned']} read"
                  + (" (the newest only)" if found["capped"] else ""))
        return 0 if found["hits"] else 1
    if args.id is None:
        raise ConfigurationError("trace takes an id, or --key with --topic")
    result = trace.trace(cluster_settings(args), args.namespace, args.id)
    if args.json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        print(trace.render(result))
    return 0 if result["found"] else 1


def add_dlq(sub: Any) -> None:
    dl = command(sub, "dlq", "list the dead-letter queue, or redrive records from it")
    acts = actions(dl, "show entries, or re-inject them")
    listing = action(acts, "list", "show the entries of NS.dlq", run_dlq)
    cluster(listing)
    json_option(listing)
    listing.add_argument("--limit", type=POSITIVE, help="the first N entries (default: all)")
    redrive = action(
        acts, "redrive", "send dead-lettered records again, as new source records, through their replay topics", run_dlq
    )
    cluster(redrive)
    json_option(redrive)
    redrive.add_argument("--reason-prefix", help="only entries whose reason starts with this (default: any)")
    redrive.add_argument(
        "--origin", nargs="+", action="extend", metavar="ID", type=record_id,
        help="only these origin ids, as `dlq list` prints them or 0x hex (default: any)",
    )
    redrive.add_argument("--topic", nargs="+", action="extend", metavar="TOPIC",
                         help="only records of these data topics (default: any)")
    redrive.add_argument("--key", nargs="+", action="extend", metavar="KEY",
                         help="only records with these keys, as UTF-8 text (default: any)")
    redrive.add_argument("--since", type=moment, metavar="TIME",
                         help="only records dead-lettered at or after TIME: ISO 8601, epoch ms or a span ago (30m, 2h, 7d)")
    redrive.add_argument("--until", type=moment, metavar="TIME", help="only records dead-lettered before TIME")
    redrive.add_argument("--rate", type=positive_real, metavar="PER_S",
                         help="at most this many records a second (default: as fast as it goes)")
    redrive.add_argument("--dry-run", action="store_true", help="show what would be redriven, send nothing")
    redrive.add_argument("--timeout-ms", type=POSITIVE, help="per-record timeout (default: 30000)")
    redrive.add_argument("--max-attempts", type=POSITIVE, help="attempts before the DLQ again (default: 5)")
    runs = action(acts, "runs", "show the redrives run so far: who, when, the filter, how many", run_dlq)
    cluster(runs)
    json_option(runs)


def run_dlq(args: argparse.Namespace) -> int:
    import orjson

    from broker import dlq

    if args.action == "list":
        listed = (calls_of(args).dlq_entries or dlq.list_entries)(cluster_settings(args), args.namespace, args.limit)
        if args.json:
            sys.stdout.write(orjson.dumps([dlq.entry_json(e, m) for e, m in listed]).decode() + "\n")
        else:
            for entry, marker in listed:
                print(dlq.format_entry(entry, marker))
            print(f"{len(listed)} entries in {args.namespace}.dlq", file=sys.stderr)
        return 0
    if args.action == "runs":
        runs = dlq.read_runs(cluster_settings(args), args.namespace)
        if args.json:
            sys.stdout.write(orjson.dumps(runs).decode() + "\n")
        else:
            for run in runs:
                print(f"{run.get('at')} {run.get('who')}: {run.get('redriven')} redriven, filter {run.get('filter')}, "
                      f"rate {run.get('rate_per_s') or 'unlimited'}")
            print(f"{len(runs)} redrive runs in {args.namespace}.dlq.redriven", file=sys.stderr)
        return 0
    where = dlq.RedriveFilter(
        args.reason_prefix, args.origin or None, args.topic or None,
        [k.encode() for k in args.key] if args.key else None, args.since, args.until,
    )
    result = dlq.redrive(
        cluster_settings(args),
        args.namespace,
        where=where,
        rate_per_s=args.rate,
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
            print(f"{verb} origin {r['origin']} from {args.namespace}.dlq {r['dlq']} to {r['topic']}'s replay topic")
        print(
            f"{verb} {summary['selected']}; skipped: {summary['skipped_quarantined']} quarantined, "
            f"{summary['skipped_already_redriven']} already redriven, "
            f"{summary['skipped_not_matching']} not matching"
        )
    return 0
