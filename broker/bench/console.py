"""Page times of the console (broker.console) over a large dead-letter queue.

``python -m broker.bench.console [--entries 100000] [--partitions 1000] [--repeat 20]``

The console's index is filled with ``entries`` synthetic dead letters (three data topics,
keys of 10 000 customers, four reasons, a header; one in a hundred quarantined), its status
samples with an hour of a namespace of ``partitions`` ledger partitions; then every page is
fetched over HTTP as an operator's browser would, ``repeat`` times each: the median and the
worst time of each page, from the request to the last byte. No Kafka is needed: the pages
read the index and the samples, which is what a page view costs (the tailer and the sampler
run beside them).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from broker.bench.figures import Figures
from broker.console.auth import Authenticator, parse_tokens
from broker.console.index import Filter, Index
from broker.console.server import Console, Server
from broker.dlq import QUARANTINE, RECORD, DlqEntry
from broker.schemas import Failure
from broker.settings import KafkaSettings

TOKEN = "bench-operator-token-0123456789"
BASE_MS = 1_700_000_000_000
REASONS = ("rejected: cannot parse order", "rejected: no such sku", "failed", "timed out")


def entries(n: int, partitions: int = 6) -> list[DlqEntry]:
    out = []
    for i in range(n):
        part, off = i % partitions, i // partitions
        at = BASE_MS + i * 37
        if i % 100 == 99:
            out.append(DlqEntry(part, off, at, QUARANTINE, "quarantine: undecodable XorBatch", None,
                                bytes(range(64)), source=f"bench.acks/{part}/{off}"))
            continue
        reason = REASONS[i % len(REASONS)]
        value = orjson.dumps({"order": i, "customer": f"cust-{i % 10_000}", "items": [{"sku": i % 97, "n": 2}]})
        out.append(DlqEntry(
            part, off, at, RECORD, reason, f"cust-{i % 10_000}".encode(), value,
            (("tenant", f"t{i % 50}".encode()), ("trace-id", f"{i:016x}".encode())),
            origin=10**12 + i, attempts=3, topic=f"bench.topic{i % 3}", key_hash_partition=i % 12,
            partitioner="kafka", history=tuple(Failure(10**13 + i * 3 + a, a, reason, at - (3 - a) * 500) for a in (1, 2, 3)),
        ))
    return out


def status_sample(partitions: int, t: float, i: int) -> dict[str, Any]:
    per = [(p * 7919 + i) % 50 for p in range(partitions)]
    return {
        "namespace": "bench", "ledger_partitions": partitions, "pending": sum(per), "pending_per_partition": per,
        "pending_unknown_partitions": [], "oldest_pending_age_s": 3.2, "completed": 1000 * i, "replayed": 10 * i,
        "superseded": 0, "dlq": 2 * i, "outages": {}, "counters": {"completed": 1000 * i}, "counters_age_s": 0.4,
    }


AUDITED = 20_000  # audit events in the index (one a minute: two weeks of an operator's actions)
RUNS = 2_000  # redrive passes in ns.dlq.redriven


def fill(index: Index, n: int, chunk: int = 10_000) -> float:
    began = time.perf_counter()
    made = entries(n)
    for start in range(0, n, chunk):
        index.add(made[start : start + chunk], positions=[("bench.dlq", 0, start + chunk)])
    index.add([], audits=[(0, i, {"at_ms": BASE_MS + i * 60_000, "who": "operator:bench", "action": "redrive dry run",
                                  "what": {"filter": {"reason_prefix": "rejected"}}, "result": "ok: 12 selected"})
                          for i in range(AUDITED)],
              runs=[(b"run:%013d:bench" % (BASE_MS + i), {"who": "operator:bench", "state": "completed", "redriven": 12,
                                                          "selected": 12, "filter": {}}) for i in range(RUNS)])
    return time.perf_counter() - began


def fetch(port: int, path: str) -> tuple[int, float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    auth = "Basic " + base64.b64encode(f"operator:{TOKEN}".encode()).decode()
    began = time.perf_counter()
    conn.request("GET", path, headers={"Authorization": auth})
    resp = conn.getresponse()
    body = resp.read()
    took = time.perf_counter() - began
    conn.close()
    return resp.status, took, len(body)


def measure(n: int = 100_000, partitions: int = 1000, repeat: int = 20, index_dir: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=index_dir) as tmp:
        index = Index(Path(tmp) / "bench.sqlite")
        fill_s = fill(index, n)
        console = Console(KafkaSettings("127.0.0.1:1"), "bench", Authenticator(parse_tokens(f"operator={TOKEN}")), index)
        now = time.time()
        for i in range(360):  # an hour of samples, every 10 s
            console.sampler.samples.append((now - 3600 + i * 10, status_sample(partitions, now, i)))
        server = Server(console, "127.0.0.1", 0)
        thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
        thread.start()
        # the cursor of a page deep in the list: half the entries newer than it
        deep = index.page(Filter(), size=1)
        cursor = None
        for _ in range(20):
            cursor = index.page(Filter(), cursor=cursor, size=max(1, n // 40)).next_cursor
        # figure key (bench.figures.CONSOLE_PAGES) -> (label, path)
        pages = {
            "overview": (f"overview (P = {partitions})", "/"),
            "newest": ("dead letters, newest", "/dead-letters"),
            "by_key": ("dead letters, by key", "/dead-letters?key=cust-4242"),
            "by_reason": ("dead letters, by reason prefix", "/dead-letters?reason=rejected%3A+no"),
            "by_topic_time": ("dead letters, by topic + time range",
                              f"/dead-letters?topic=bench.topic1&since={BASE_MS + 1_000_000}&until={BASE_MS + 2_000_000}"),
            "by_header": ("dead letters, by header value", "/dead-letters?header=tenant&header_value=t7"),
            "deep_page": (f"dead letters, {n // 2:,} newer before it", f"/dead-letters?cursor={cursor}"),
            "one": ("one dead letter", f"/dead-letters/{deep.rows[0].part}/{deep.rows[0].off}"),
            "quarantine": ("quarantined", "/quarantine"),
            "redrive": (f"redrive ({RUNS:,} passes)", "/redrive"),
            "audit": (f"audit ({AUDITED:,} actions)", "/audit"),
        }
        out: dict[str, Any] = {"entries": n, "ledger_partitions": partitions, "repeat": repeat,
                               "index_fill_s": round(fill_s, 2), "pages_ms": {}}
        try:
            for key, (name, path) in pages.items():
                times, size = [], 0
                for _ in range(repeat):
                    status, took, size = fetch(server.port, path)
                    if status != 200:
                        raise RuntimeError(f"{path}: HTTP {status}")
                    times.append(took * 1000)
                out["pages_ms"][name] = {"median": round(statistics.median(times), 1), "max": round(max(times), 1),
                                         "bytes": size, "key": key}
        finally:
            server.httpd.shutdown()
            server.httpd.server_close()
            index.close()
        return out


def record(figures: Figures, result: dict[str, Any]) -> None:
    """The run's figures (``replaybroker bench --only console``): each page's median."""
    figures.set("console.dead_letters", result["entries"])
    figures.set("console.ledger_partitions", result["ledger_partitions"])
    figures.set("console.index_fill_s", result["index_fill_s"])
    for t in result["pages_ms"].values():
        figures.set(f"console.{t['key']}_median_ms", t["median"])


def markdown(result: dict[str, Any]) -> str:
    lines = [f"console pages over {result['entries']:,} dead letters (index filled in {result['index_fill_s']} s), "
             f"{result['repeat']} fetches each", "", "| page | median ms | max ms | bytes |", "|---|---:|---:|---:|"]
    for name, t in result["pages_ms"].items():
        lines.append(f"| {name} | {t['median']} | {t['max']} | {t['bytes']:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.bench.console", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.entries, args.partitions, args.repeat)
    sys.stdout.write(orjson.dumps(result).decode() + "\n" if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
