"""The figures of docs/design.md §9: their keys, units and targets, and how one is recorded.

Every key is present in every run. A figure is ``{"value": number, "unit": ...}`` or, when
it could not be measured, ``{"value": None, "unavailable": "<why>"}`` - never a made-up
number. Ratios are figures too (``unit: "x"``). A figure with a target also carries
``target`` (text) and ``met`` (bool).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECTIONS = ("fold", "console", "restore", "throughput", "latency", "replay", "takeover", "redrive", "spark", "scale")
# What a run without --only measures: scale starts a 3-broker cluster of its own and creates
# 1 000 ledger partitions on it (bench.scale), minutes on a small host - only when asked.
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "scale")


def default_results_dir() -> Path:
    """Outside the source tree: ``$REPLAYBROKER_HOME/bench`` (``~/.cache/replaybroker/bench``)."""
    root = os.environ.get("REPLAYBROKER_HOME") or Path.home() / ".cache" / "replaybroker"
    return Path(root) / "bench"


# The topics a completed record writes to (bench.cost.role_of)
COST_ROLES = ("persist", "data", "acks", "ledger", "__consumer_offsets", "__transaction_state")

# The console's pages timed by bench.console, by figure key (console.<page>_median_ms)
CONSOLE_PAGES = ("overview", "newest", "by_key", "by_reason", "by_topic_time", "by_header", "deep_page", "one",
                 "quarantine", "redrive", "audit")

FOLD_SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
TAKEOVER_SIZES = (100_000, 1_000_000)


def size_label(n: int) -> str:
    """10_000 -> "1e4"."""
    exp = len(str(n)) - 1
    return f"1e{exp}" if n == 10**exp else str(n)


@dataclass(frozen=True)
class Spec:
    key: str
    unit: str
    what: str
    # (comparison, bound): ">=" or "<=" against a number; None = no target.
    target: tuple[str, float] | None = None
    zero: bool = False  # 0 is a measurement (a count of what should not happen), not a failure


def _specs() -> list[Spec]:
    specs = [
        Spec("throughput.pipeline_rps", "records/s", "completed source records/s, source -> task -> acker"),
        Spec("throughput.raw_rps", "records/s", "raw confluent-kafka produce -> consume, same records"),
        Spec("throughput.share_rps", "records/s", "KIP-932 share group, explicit ACCEPT per record"),
        Spec("throughput.pipeline_vs_raw", "x", "pipeline / raw throughput", (">=", 0.5)),
        Spec("throughput.pipeline_vs_share", "x", "pipeline / share-group throughput", (">=", 1.0)),
        Spec("throughput.skeleton_rps", "records/s",
             "the pipeline's unavoidable Kafka calls alone (broker/bench/hops.py: skeleton), completed records/s"),
        Spec("throughput.skeleton_vs_raw", "x",
             "skeleton / raw throughput: the ceiling of throughput.pipeline_vs_raw on this host"),
        Spec("throughput.pipeline_vs_skeleton", "x", "pipeline / skeleton throughput: the share of the ceiling reached"),
        *[Spec(f"cpu.{system}_us_per_record", "µs", f"CPU of every process of the {what} and the broker's JVM per "
               "completed record, in the throughput window")
          for system, what in (("pipeline", "pipeline"), ("skeleton", "skeleton"), ("raw", "raw baseline"),
                               ("share", "share-group baseline"))],
        Spec("cpu.pipeline_vs_share", "x", "share group's CPU per record / the pipeline's (1: as cheap)"),
        Spec("check.counters_vs_tail", "x", "completions by the acker's counters / those a tail read, one persist "
             "partition of a drained run (1 exactly: throughput counts by the counters)"),
    ]
    for n in FOLD_SIZES:
        s = size_label(n)
        specs += [
            Spec(f"fold.{s}.table_pairs_per_s", "pairs/s", f"LedgerTable.fold, {s} pending entries, one core", (">=", 2e6)),
            Spec(f"fold.{s}.dict_pairs_per_s", "pairs/s", f"plain Python dict fold, {s} pending entries"),
            Spec(f"fold.{s}.table_vs_dict", "x", "LedgerTable / dict fold rate"),
            Spec(f"fold.{s}.table_bytes_per_entry", "B", f"LedgerTable bytes per pending entry at {s}", ("<=", 48.0)),
            Spec(f"fold.{s}.dict_bytes_per_entry", "B", f"dict fold bytes per pending entry at {s}"),
        ]
    for name in ("kafka", "spark"):
        specs += [
            Spec(f"keys.{name}_batch_us_per_key", "µs", f"{name} partition of 256 new keys hashed together "
                 "(Source.send_many), per key"),
            Spec(f"keys.{name}_one_us_per_key", "µs", f"{name} partition of the same keys one at a time, per key"),
            Spec(f"keys.{name}_one_vs_batch", "x", "one at a time / together (how much cheaper a batch is)"),
        ]
    specs += [
        Spec(f"keys.zipf{s:g}_p{p}_max_vs_mean", "x",
             f"records of the busiest of {p} ledger partitions / the mean, keys Zipf s={s:g} (10 000 keys)")
        for p in (16, 1000) for s in (0.0, 0.8, 1.1)
    ]
    specs += [
        Spec("latency.load_rps", "records/s", "offered load: 50 % of the measured pipeline throughput"),
        Spec("latency.pipeline_p50_ms", "ms", "persist -> completed tombstone visible (read_committed), p50"),
        Spec("latency.pipeline_p99_ms", "ms", "persist -> completed tombstone visible (read_committed), p99"),
        Spec("latency.pipeline_p999_ms", "ms", "persist -> completed tombstone visible (read_committed), p99.9"),
        Spec("latency.pipeline_start_p99_ms", "ms",
             "p99 of the records sent in the run's first seconds (the warm window, from idle to the load): "
             "left out of the p50/p99/p99.9 above"),
        Spec("latency.fixed_load_rps", "records/s", "a fixed offered load, the same in every run"),
        Spec("latency.fixed_p50_ms", "ms", "persist -> completed tombstone visible at the fixed load, p50"),
        Spec("latency.fixed_p99_ms", "ms", "persist -> completed tombstone visible at the fixed load, p99 "
             "(two runs compare by it: the 50 % load moves with the peak)"),
        Spec("latency.raw_p50_ms", "ms", "raw produce -> consume at the same rate, p50"),
        Spec("latency.raw_p99_ms", "ms", "raw produce -> consume at the same rate, p99"),
        Spec("latency.raw_p999_ms", "ms", "raw produce -> consume at the same rate, p99.9"),
        Spec("latency.p99_budget_ms", "ms", "target for the pipeline p99: commit interval + 100 ms"),
        Spec("latency.p99_vs_raw", "x", "pipeline p99 / raw p99"),
        Spec("console.dead_letters", "records", "dead letters in the console's index (bench.console)"),
        Spec("console.ledger_partitions", "partitions", "ledger partitions of the Overview's status samples"),
        Spec("console.index_fill_s", "s", "the index filled with those dead letters"),
        *(Spec(f"console.{page}_median_ms", "ms", f"console page {page}: request to last byte, median",
               ("<=", 300.0)) for page in CONSOLE_PAGES),
        Spec("redrive.dead_letters", "records", "dead letters redriven (bench.redrive)"),
        Spec("redrive.rate_asked", "records/s", "dlq redrive --rate"),
        Spec("redrive.rate_written", "records/s", "redriven records the task wrote a second, first to last"),
        Spec("redrive.rate_reported", "records/s", "redriven / seconds as dlq redrive reports it (planning included)"),
        Spec("redrive.seconds", "s", "the redrive's process, start to exit"),
        Spec("redrive.live_rate", "records/s", "live records sent a second, before and during the redrive"),
        Spec("redrive.live_p50_ms_baseline", "ms", "live send -> written, p50, without a redrive"),
        Spec("redrive.live_p99_ms_baseline", "ms", "live send -> written, p99, without a redrive"),
        Spec("redrive.live_p50_ms_during", "ms", "live send -> written, p50, while the redrive runs"),
        Spec("redrive.live_p99_ms_during", "ms", "live send -> written, p99, while the redrive runs"),
        Spec("replay.timeout_ms", "ms", "configured per-record timeout"),
        Spec("replay.after_fail_p50_ms", "ms", "explicit fail (task) -> replay record visible, p50"),
        Spec("replay.after_fail_p99_ms", "ms", "explicit fail (task) -> replay record visible, p99"),
        Spec("replay.after_timeout_p50_ms", "ms", "persist of a never-acked record -> replay visible, p50"),
        Spec("replay.after_timeout_p99_ms", "ms", "persist of a never-acked record -> replay visible, p99"),
        Spec("replay.after_fail_vs_timeout", "x", "replay-after-fail p99 / configured timeout"),
        Spec("replay.after_timeout_vs_timeout", "x", "replay-after-timeout p99 / configured timeout"),
        Spec("replay.adaptive_fixed_timeout_ms", "ms", "fixed timeout sized for the worst case of the latency-shift "
             "runs (also the adaptive ceiling)"),
        Spec("replay.fixed_detect_p50_ms", "ms", "send of a dropped record -> its replay visible, fixed timeout, p50"),
        Spec("replay.fixed_detect_max_ms", "ms", "send of a dropped record -> its replay visible, fixed timeout, max"),
        Spec("replay.adaptive_detect_p50_ms", "ms", "send of a dropped record -> its replay visible, timeout auto, p50"),
        Spec("replay.adaptive_detect_max_ms", "ms", "send of a dropped record -> its replay visible, timeout auto, max"),
        Spec("replay.adaptive_detect_speedup", "x", "fixed / adaptive detection p50 under the latency shift",
             (">=", 3.0)),
        Spec("replay.fixed_spurious_per_1e5", "replays", "replays of records that completed (a slow task), "
             "per 10^5 records, fixed timeout, task slowing down 5x", zero=True),
        Spec("replay.adaptive_spurious_per_1e5", "replays", "replays of records that completed (a slow task), "
             "per 10^5 records, timeout auto, task slowing down 5x", zero=True),
        Spec("cost.pipeline.writes_per_record", "records", "Kafka records appended per completed record, all topics "
             "(internal ones included), drained run at the latency load"),
        Spec("cost.pipeline.bytes_per_record", "B", "bytes appended to the broker's logs per completed record, all topics"),
        Spec("cost.pipeline.txn_markers_per_record", "markers", "transaction markers appended per completed record"),
        *[Spec(f"cost.pipeline.{role}.{what}_per_record", unit, f"{desc} per completed record, {role}")
          for role in COST_ROLES
          for what, unit, desc in (("writes", "records", "records appended"), ("bytes", "B", "bytes appended"))],
        Spec("cost.pipeline.broker_cpu_us_per_record", "µs", "the broker's CPU per completed record (its threads)"),
        Spec("cost.raw.writes_per_record", "records", "Kafka records appended per consumed record, raw baseline"),
        Spec("cost.raw.bytes_per_record", "B", "bytes appended to the broker's logs per consumed record, raw baseline"),
        Spec("cost.raw.broker_cpu_us_per_record", "µs", "the broker's CPU per consumed record, raw baseline"),
        Spec("cost.bytes_vs_raw", "x", "pipeline / raw bytes appended per record"),
        Spec("cost.broker_vs_skeleton", "x", "the broker's CPU per completed record in the throughput window, "
             "pipeline / skeleton", ("<=", 1.5)),
        *[spec for system in ("pipeline", "skeleton") for spec in (
            Spec(f"requests.{system}_per_1k", "requests", f"requests of the {system}'s clients to the broker per "
                 "1 000 completed records, throughput window (by API: by_api; bench.requests)"),
            Spec(f"requests.{system}.produce_per_1k", "requests", f"Produce requests per 1 000 records, {system}"),
            Spec(f"requests.{system}.fetch_per_1k", "requests", f"consumer Fetch requests per 1 000 records, {system}"),
            Spec(f"requests.{system}.records_per_produce", "records", f"records per Produce request, {system}"),
            Spec(f"requests.{system}.bytes_per_produce", "B", f"bytes per Produce request, {system}"),
            Spec(f"requests.{system}.bytes_per_fetch", "B", f"record bytes per consumer Fetch response, {system}"),
        )],
        Spec("requests.pipeline_vs_skeleton", "x", "requests per completed record, pipeline / skeleton"),
        Spec("cost.broker_cpu_vs_raw", "x", "pipeline / raw broker CPU per record"),
        Spec("restore.entries", "entries", "live entries in the changelog partition restored"),
        Spec("restore.seconds", "s", "the acker's restore path (Acker._load from the start)"),
        Spec("restore.entries_per_s", "entries/s", "changelog restore rate"),
        Spec("takeover.session_timeout_s", "s", "the acker group's session timeout (bounds detection below)"),
    ]
    for n in TAKEOVER_SIZES:
        s = size_label(n)
        for mode in ("standby", "cold"):
            how = "with --standby" if mode == "standby" else "without standby"
            specs += [
                Spec(f"takeover.{s}.{mode}.detection_s", "s",
                     f"kill -9 of one of two ackers holding {s} pending entries -> survivor's assignment, {how}"),
                Spec(f"takeover.{s}.{mode}.restore_s", "s", f"survivor's assignment callback (restore), {s} entries, {how}",
                     ("<=", 1.0) if mode == "standby" and n == 1_000_000 else None),
                Spec(f"takeover.{s}.{mode}.total_s", "s",
                     f"kill -9 -> first completion on the victim's partition, {s} entries, {how}"),
                Spec(f"takeover.{s}.{mode}.survivor_gap_s", "s",
                     f"longest gap between completions of the survivor's own partition meanwhile, {s}, {how}"),
            ]
    specs += [
        Spec("spark.plain_rps", "records/s", "the order job without acking, records read / micro-batch time, median batch"),
        Spec("spark.acked_rps", "records/s", "the same job under Acking, same input, same Spark session"),
        Spec("spark.acked_vs_plain", "x", "acked / plain records/s", (">=", 0.8)),
        Spec("spark.jit_share", "x",
             "the Spark JVM's JIT compiler time per wall time over the rounds kept (after the warm-up)",
             zero=True),
        Spec("spark.plain_batch_p50_ms", "ms", "micro-batch time (triggerExecution) without acking, p50"),
        Spec("spark.acked_batch_p50_ms", "ms", "micro-batch time (triggerExecution) under Acking, p50"),
        Spec("spark.plain_rows_per_batch", "rows", "rows per micro-batch, without acking"),
        Spec("spark.acked_rows_per_batch", "rows", "rows per micro-batch, under Acking"),
        Spec("spark.plain_jobs_per_batch", "jobs", "Spark jobs per micro-batch without acking, p50"),
        Spec("spark.acked_jobs_per_batch", "jobs", "Spark jobs per micro-batch under Acking, p50"),
        Spec("spark.large_plain_rps", "records/s", "spark.plain_rps with larger micro-batches (a topic of its own)"),
        Spec("spark.large_acked_rps", "records/s", "spark.acked_rps with the same larger micro-batches"),
        Spec("spark.large_rows_per_batch", "rows", "rows per micro-batch of the larger batches, under Acking"),
        Spec("spark.large_acked_vs_plain", "x",
             "acked / plain records/s with the larger micro-batches (the acking's per-batch cost spread wider)"),
    ]
    for prefix, sink in (("spark.sink", "OriginDeltaSink, replay window 600 s"), ("spark.parquet_sink",
                                                                                "OriginParquetSink")):
        specs += [
            Spec(f"{prefix}_small_rows", "rows", f"rows already in the small sink ({sink})"),
            Spec(f"{prefix}_large_rows", "rows", f"rows already in the large sink ({sink})"),
            Spec(f"{prefix}_small_batch_p50_ms", "ms", f"write of one micro-batch into the small sink, p50 ({sink})"),
            Spec(f"{prefix}_large_batch_p50_ms", "ms", f"write of one micro-batch into the large sink, p50 ({sink})"),
            Spec(f"{prefix}_batch_growth", "x", f"large / small sink batch time ({sink})",
                 ("<=", 1.5) if prefix == "spark.sink" else None),
        ]
    specs += [
        Spec("spark.optimize.every", "batches", "OriginDeltaSink(optimize_every=n): OPTIMIZE before every n-th batch"),
        Spec("spark.optimize.batch_mean_ms", "ms",
             "write of one micro-batch with optimize_every, mean over 2n batches (OPTIMIZE included)"),
        Spec("spark.optimize.plain_batch_mean_ms", "ms", "the same batches into a table never compacted, mean"),
        Spec("spark.optimize.batch_cost", "x", "mean batch time with / without optimize_every"),
        Spec("spark.optimize.batch_p50_ms", "ms", "write of one micro-batch with optimize_every, p50"),
        Spec("spark.optimize.plain_batch_p50_ms", "ms", "the same batches, never compacted, p50"),
        Spec("spark.optimize.run_ms", "ms", "OPTIMIZE's own time (ZORDER BY written_at), p50 of its runs"),
        Spec("spark.optimize.files_before", "files", "files of the table before the last OPTIMIZE"),
        Spec("spark.optimize.files_after", "files", "files of the table after the last OPTIMIZE"),
        Spec("spark.optimize.files", "files", "files of the compacted table after the batches"),
        Spec("spark.optimize.plain_files", "files", "files of the table never compacted after the same batches"),
    ]
    return specs + _scale_specs()


SCALE_ACKERS = (1, 2, 4)
SCALE_PARTITIONS = (16, 1000)


def _scale_specs() -> list[Spec]:
    """bench.scale: a 3-broker cluster, many ledger partitions, several ackers and tasks."""
    specs = [
        Spec("scale.load_rps", "records/s", "offered load of every scale run (fixed, so two runs compare)"),
        Spec("scale.session_timeout_s", "s", "the ackers' session timeout in the scale runs"),
    ]
    for p in SCALE_PARTITIONS:
        specs += [
            Spec(f"scale.p{p}.cpu_us_per_record", "µs", f"one acker's CPU per completed record, P={p}"),
            Spec(f"scale.p{p}.commit_ms", "ms", f"the acker's mean commit (one transaction over its partitions), P={p}"),
            Spec(f"scale.p{p}.takeover_restore_s", "s",
                 f"a survivor's assignment callback (restore) after kill -9 of one of two ackers, P={p}"),
            Spec(f"scale.p{p}.takeover_partitions_per_s", "partitions/s",
                 f"ledger partitions restored per second of that callback, P={p}"),
        ]
    specs += [
        Spec("scale.p1000.served_s", "s", "topics of P=1000 created -> one acker owns every ledger partition "
             "(the brokers create 4 000 partitions x 3 replicas first)"),
        Spec("scale.cpu_p1000_vs_p16", "x", "acker CPU per completed record, P=1000 / P=16", ("<=", 1.5)),
        Spec("scale.commit_p1000_vs_p16", "x", "mean commit time, P=1000 / P=16"),
        Spec("scale.p16.status_s", "s", "`replaybroker status` wall time (a new process), P=16"),
        Spec("scale.status_p1000_s", "s", "`replaybroker status` wall time (a new process), P=1000", ("<=", 2.0)),
    ]
    for n in SCALE_ACKERS:
        specs += [
            Spec(f"scale.ackers{n}.cpu_us_per_record", "µs", f"CPU of all {n} ackers per completed record, P=1000"),
            Spec(f"scale.ackers{n}.instance_cpu_us_per_record", "µs",
                 f"the busiest of {n} ackers: its CPU per record it completed, P=1000"),
            Spec(f"scale.ackers{n}.records_max_vs_min", "x",
                 f"records completed by the busiest of {n} ackers / the idlest, uniform keys, P=1000"),
            Spec(f"scale.ackers{n}.idle_cpu_pct", "%",
                 f"all {n} ackers' CPU with nothing to do just before their window, % of a core, P=1000"),
            Spec(f"scale.ackers{n}.cpu_us_per_record_above_idle", "µs",
                 f"what the window's records cost all {n} ackers above that idle floor, per completed record"),
        ]
    specs += [
        Spec("scale.acker_cpu_2_vs_1", "x", "total acker CPU per completed record, 2 instances / 1"),
        Spec("scale.acker_cpu_4_vs_1", "x", "total acker CPU per completed record, 4 instances / 1", ("<=", 1.25)),
        Spec("scale.acker_cpu_above_idle_4_vs_1", "x",
             "acker CPU per completed record above the instances' idle floor, 4 instances / 1"),
        Spec("scale.zipf_s", "exponent", "Zipf exponent of the skewed run's keys", zero=True),
        Spec("scale.zipf_partition_max_vs_mean", "x", "records of the busiest ledger partition / the mean, Zipf keys, "
             "P=1000"),
        Spec("scale.uniform_partition_max_vs_mean", "x", "the same with keys taken in turn (the run's baseline)"),
        Spec("scale.zipf_acker_max_vs_min", "x", "records of the busiest of 4 ackers / the idlest, Zipf keys"),
        Spec("scale.zipf_acker_max_vs_mean", "x", "records of the busiest of 4 ackers / the mean, Zipf keys"),
    ]
    for mode in ("cold", "standby"):
        how = "with --standby" if mode == "standby" else "without standby"
        specs += [
            Spec(f"scale.takeover_{mode}_s", "s", f"kill -9 of one of 4 ackers (P=1000, {how}): the session's "
                 "expiry -> the first completion on one of its partitions",
                 ("<=", 5.0) if mode == "standby" else None, zero=True),
            Spec(f"scale.takeover_{mode}_total_s", "s", f"the same from the kill, {how}"),
            Spec(f"scale.takeover_{mode}_all_s", "s",
                 f"kill -9 -> every partition of the victim assigned to a survivor (its log), {how}"),
            Spec(f"scale.takeover_{mode}_late_records", "records",
                 f"records of the victim's partitions completed only after the takeover (they waited), {how}",
                 zero=True),
        ]
    specs += [
        Spec("scale.task_join_max_gap_ms", "ms", "a task's longest gap between records handled while a second "
             "task joins its group (consumer group protocol)", ("<=", 1000.0)),
        Spec("scale.task_join_max_gap_ms_eager", "ms", "the same with the classic protocol and the eager range "
             "assignor (tasks before the consumer protocol)"),
        Spec("scale.task_steady_max_gap_ms", "ms", "the longest such gap before the join (the steady baseline)"),
        Spec("scale.idle_acker_cpu_pct", "%", "an idle acker's CPU, % of a core (P=16)", zero=True),
        Spec("scale.idle_acker_p1000_cpu_pct", "%", "an idle acker's CPU owning 1 000 ledger partitions, % of a core"),
        Spec("scale.idle_task_cpu_pct", "%", "an idle task's CPU, % of a core", zero=True),
        Spec("scale.idle_brokers_cpu_pct", "%", "the 3 brokers' CPU with that idle acker and task, % of a core"),
        Spec("scale.idle_brokers_p1000_cpu_pct", "%", "the 3 brokers' CPU with one idle acker owning 1 000 ledger "
             "partitions (no task), % of a core"),
        Spec("scale.idle_brokers_base_cpu_pct", "%", "the 3 brokers' CPU with no client, % of a core (the baseline)"),
    ]
    return specs


SPECS: dict[str, Spec] = {s.key: s for s in _specs()}
FIGURE_KEYS: tuple[str, ...] = tuple(SPECS)


class Figures:
    """The figures of one run, filled section by section."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}

    def set(self, key: str, value: float | None, *, unavailable: str | None = None, **extra: Any) -> None:
        spec = SPECS[key]
        if value is None or not _finite(value) or value < 0 or (value == 0 and not spec.zero):
            reason = unavailable or (f"not a positive number: {value!r}" if value is not None else "not measured")
            self.values[key] = {"value": None, "unit": spec.unit, "unavailable": reason, **extra}
            return
        entry: dict[str, Any] = {"value": _round(float(value)), "unit": spec.unit, **extra}
        if spec.target is not None:
            op, bound = spec.target
            entry["target"] = f"{op} {bound:g}"
            entry["met"] = bool(value >= bound if op == ">=" else value <= bound)
        self.values[key] = entry

    def unavailable(self, keys: list[str] | tuple[str, ...], reason: str) -> None:
        for key in keys:
            if key not in self.values:
                self.set(key, None, unavailable=reason)

    def ratio(self, key: str, num: str, den: str) -> None:
        a, b = self.value(num), self.value(den)
        if a is None or b is None:
            missing = num if a is None else den
            self.set(key, None, unavailable=f"{missing} unavailable")
        else:
            self.set(key, a / b)

    def value(self, key: str) -> float | None:
        entry = self.values.get(key)
        return None if entry is None else entry.get("value")

    def complete(self, reason: str = "not measured in this run") -> dict[str, dict[str, Any]]:
        """Every key, in the registry's order; missing ones marked unavailable."""
        self.unavailable(FIGURE_KEYS, reason)
        return {k: self.values[k] for k in FIGURE_KEYS}


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def _round(x: float) -> float:
    if abs(x) >= 100:
        return round(x, 1)
    return float(f"{x:.4g}")
