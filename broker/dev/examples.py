"""What the examples in ``examples/`` share: their command line, and their summary from
ground truth - the persist topic's tombstones and what the pipeline's last hop wrote."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Set
from contextlib import contextmanager
from typing import Any

import orjson

from broker.completions import OutcomeTail
from broker.dev.kafka_local import demo_cluster
from broker.settings import KafkaSettings
from broker.topics import Namespace, create, delete, layout


def parse_args(doc: str | None, argv: list[str] | None, records: int = 1000) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka (default: $KAFKA_BOOTSTRAP_SERVERS, "
                        "else the embedded Kafka, started if none runs)")
    parser.add_argument("--records", type=int, default=records, help=f"records to send (default: {records})")
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics afterwards")
    parser.add_argument("-v", "--verbose", action="store_true", help="log warnings (handler failures ...)")
    args = parser.parse_args(argv)
    if args.records <= 0:
        parser.error("--records must be positive")
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR, stream=sys.stderr)
    return args


@contextmanager
def namespace(args: argparse.Namespace, name: str, data_topics: Mapping[str, int],
              partitions: int = 4) -> Iterator[tuple[KafkaSettings, Namespace, OutcomeTail]]:
    """A fresh namespace ``name-<random>`` with ``data_topics`` (``{suffix: partitions}``,
    named ``<ns>.<suffix>``), tailed for outcomes; its topics are deleted afterwards unless
    ``--keep``."""
    settings = KafkaSettings.from_env(demo_cluster(args.bootstrap)[0])
    ns = Namespace(f"{name}-{uuid.uuid4().hex[:8]}")
    topics = {f"{ns.name}.{suffix}": n for suffix, n in data_topics.items()}
    create(settings, ns, partitions, topics)
    tail = OutcomeTail(settings, ns)
    try:
        yield settings, ns, tail
    finally:
        tail.close()
        if not args.keep:
            delete(settings, layout(ns, partitions, topics))


def wait_for_outcomes(tail: OutcomeTail, records: int | Collection[int], timeout_s: float = 120.0) -> None:
    """Until every record has an outcome (completed or dead-lettered), at most ``timeout_s``:
    ``records`` of the namespace's, or each of these origins."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tail.poll(0.2)
        ended = set(tail.log.completed_origins()) | tail.log.dlq_origins()
        if len(ended) >= records if isinstance(records, int) else ended.issuperset(records):
            return


def drop_namespace(settings: KafkaSettings, ns: Namespace, partitions: int, data_topics: Iterable[str]) -> None:
    """Delete the namespace's topics and ``data_topics`` with their replay topics."""
    delete(settings, layout(ns, partitions, dict.fromkeys(data_topics, 1)))


def report(tail: OutcomeTail, sent: Mapping[Any, int], written: Set[Any], *, records: int | None = None) -> int:
    """Print the summary as the last line on stdout; exit code 0 only when nothing is lost.

    ``sent``: each record's name -> its origin (``SendResult.origin``); ``written``: the names
    the last hop wrote; ``records``: how many were sent, if ``sent`` may miss some (a bridge's
    input records that were never bridged). A record is completed when its tree completed (its
    tombstone says so) and the last hop wrote it; lost when it is neither completed nor
    dead-lettered."""
    tail.poll(1.0)
    name_of = {origin: name for name, origin in sent.items()}
    completed = {o for o in tail.log.completed_origins() if o in name_of and name_of[o] in written}
    dlq = tail.log.dlq_origins() & set(name_of)
    records = len(sent) if records is None else records
    result = {"records": records, "completed": len(completed), "replayed": tail.log.replays(name_of),
              "dlq": len(dlq), "lost": records - len(completed | dlq)}
    print(orjson.dumps(result).decode())
    return 0 if result["lost"] == 0 and result["completed"] + result["dlq"] == result["records"] else 1
