"""Acking from ``foreachBatch``: the user's batch function, then one XOR event per srid.

``Acking(bootstrap, namespace, handler)`` is the function to hand to ``foreachBatch``. For each
micro-batch, in this order:

1. the handler runs on the batch (tracking columns included) and returns a ``BatchResult``:
   the rows it decided about (``rows``, default the batch), which of them failed (``failed``)
   and a ``write`` function for its outputs;
2. the decision is evaluated ONCE: ``rows`` with a decision column is pinned with
   ``localCheckpoint`` (``pin``; a DataFrame of failed srids is pinned as it is), and ``write`` gets the
   rows not failed from that pinned copy - so the rows written are exactly the rows acked,
   whatever a nondeterministic or flaky expression would answer on a second evaluation;
3. children (``Emit``, returned by ``write`` or listed in the result) get fresh record ids,
   pinned with ``localCheckpoint`` so the ids written are the ids XORed, and are written to
   their topic with the parent's tracking under a new id (``rb-t``) and an ``rb-path`` (the
   parent's path plus the child's index among the parent's children, see ``Emit``);
4. the events - every tracked input's ``(srid, record id)``, every child's ``(srid, child id)``
   and the srids the pinned decision failed - are read from ``observe()`` metrics that the
   jobs of steps 2 and 3 filled while they wrote (``spark_jobs/observed.py``); where those
   cannot be shown complete (or ``AckingConfig.observe_events`` is off) one Spark job without
   a shuffle gathers them instead, packed as big-endian int64 bytes into one row;
5. the driver folds them per srid with numpy (docs/design.md §4: ``r.id ^ child_1.id ^ ...``,
   XORed over every input of that srid in the batch, or a fail mark when the decision failed
   any of its rows), cuts them per ledger partition ``srid mod P`` into ``XorBatch`` values
   and produces each to ``ns.acks[partition]``, waiting for delivery.

Outputs go out before the acks, so a batch that dies half-way has at worst written outputs
without acks: Spark runs it again from the checkpoint, or its srids time out and are
replayed (at-least-once; sinks dedup by origin and path). The sink's commit is the decision
(``spark_jobs/committed.py``): ``write`` commits to ``BatchResult.sink``, the decision is
recorded there before step 5, and a batch the sink has committed already takes its decision
from that record, not from the handler - a rerun acks exactly what the first run wrote. An exception from the handler fails
the whole batch the same way; to fail single records, return them in ``BatchResult.failed``. A
batch whose acks went out twice folds its events twice, which the ledger treats as a missing
event: a later timeout, never an early completion.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import reduce
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, Message, Producer
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from broker.errors import ConfigurationError, DeliveryError, ReplayBrokerError
from broker.kafka_io import kafka_errors
from broker.ledger.table import xor_by_srid
from broker.markers import SupersededMarkers
from broker.schemas import XorBatch
from broker.settings import KafkaSettings
from broker.topics import Namespace, check
from spark_jobs.committed import Committed, CommittingSink
from spark_jobs.observed import PARTITION, PIN_STORAGE, EventObserver
from spark_jobs.reader import as_settings, kafka_options
from spark_jobs.tracking import (
    ATTEMPT,
    IS_REPLAY,
    ORIGIN,
    PATH,
    RECORD_ID,
    SRID,
    child_path,
    new_id,
    packed_ids_sql,
    tracking_headers,
    user_headers,
    with_tracking_columns,
)

log = logging.getLogger(__name__)

CHILD_ID = "child_id"
CHILD_PATH = "child_path"
_HEADERS_TYPE = "array<struct<key:string,value:binary>>"


@dataclass(frozen=True)
class Emit:
    """Children for another fault-tolerant topic, anchored to their parents' trees.

    ``frame`` has ``value`` (string or binary), optional ``key`` and ``headers`` (user
    headers; ``rb-t`` and ``rb-path`` are replaced), and the parent's ``srid``, ``origin``, ``attempt`` and
    ``path`` carried over from the input rows (and, best, its ``record_id``: two deliveries
    of one parent in a batch then number their children apart). Children of untracked parents
    (null srid) are written untracked. ``partition_column`` names a column that picks the
    partition (default: the producer's partitioner on the key); it is explicit because frames
    derived from the input batch carry the *input's* ``partition`` column.

    A child's path is its parent's plus ``.i``, ``i`` numbering the parent's children of all
    the batch's emits together, ordered by (emit, topic, key, value, headers, partition) - by
    content, so a replay or a re-run of the batch gives every child the path it had before.
    """

    topic: str
    frame: DataFrame
    partition_column: str | None = None


Writer = Callable[[DataFrame, int], Sequence[Emit] | None]


@dataclass(frozen=True)
class BatchResult:
    """What the handler tells the acker about its batch, before any output is written.

    ``failed``: a boolean Column over ``rows`` (default: the batch), or a DataFrame with a
    ``srid`` column (every srid in it fails). Failed srids are replayed at once (or
    dead-lettered after their max attempts); every other tracked input is acked.

    ``rejected``: a string Column over ``rows``, the reason a row can never succeed (null: it
    is not rejected) - a malformed record, a permanent error. A rejected row fails like a
    failed one (no output, not acked), and its record is dead-lettered at once with
    ``rb-reason: rejected: <reason>``, whatever attempts it has left (``TaskContext.reject``).
    With ``failed`` it needs ``failed`` as a Column too. A batch run again after its sink
    committed it fails its rejected rows instead (the sink's record keeps the srids, not the
    reasons): they are replayed, and rejected again.

    ``write(ok, batch_id)``: writes the outputs from ``ok``, the rows of ``rows`` that did not
    fail, read from the pinned decision (step 2 of the module docstring); it may return the
    children to emit. Write outputs here, not in the handler: a write in the handler evaluates
    the batch a second time, and a nondeterministic decision (a flaky lookup, a dimension
    table that changed, ``rand()``) may then leave out a row that is acked as complete.

    ``emits``: children that do not depend on the decision (``write`` may return more).

    ``rows`` is pinned with every column it has (Spark cannot prune columns through a local
    checkpoint): keep in it only what the decision and ``write`` read.

    ``sink``: the ``CommittingSink`` that ``write`` commits the batch to - required with
    ``write``. A batch id it has committed already (a rerun) is not decided again: its
    decision is the one recorded with the commit (``spark_jobs/committed.py``).
    """

    failed: Column | DataFrame | None = None
    rejected: Column | None = None
    emits: Sequence[Emit] = ()
    rows: DataFrame | None = None
    write: Writer | None = None
    sink: CommittingSink | None = None

    def checked_sink(self) -> CommittingSink | None:
        """``sink``, refused unless it can tell a committed batch from a new one."""
        if self.write is None:
            return None
        if self.sink is None:
            raise ConfigurationError(
                "BatchResult.write needs the sink it commits to (BatchResult.sink): a batch run "
                "again must ack what that sink committed, not a new decision"
            )
        if not isinstance(self.sink, CommittingSink):
            raise ConfigurationError(
                f"{type(self.sink).__name__} is not a CommittingSink (write -> bool, committed, "
                "record): a batch run again could ack rows its sink does not hold"
            )
        return self.sink


def committed_failures(rows: DataFrame, committed: Committed) -> DataFrame:
    """The srids of ``rows`` to fail in a rerun of a committed batch: every one its record
    does not ack (every one, if the record is missing)."""
    srids = rows.select(SRID).where(F.col(SRID).isNotNull()).distinct()
    if committed.acked is None or committed.acked.size == 0:
        return srids
    acked = rows.sparkSession.createDataFrame([(int(v),) for v in committed.acked], f"{SRID} long")
    return srids.join(F.broadcast(acked), SRID, "left_anti")


class Decision:
    """The pinned outcome of a ``BatchResult``: the rows to write (``ok``) and the srids to fail
    (``failed``). A pinned decision's ``failed`` frame is built when first asked for: only the
    events job reads it, and every DataFrame built costs an analysis of the whole plan."""

    def __init__(
        self,
        ok: DataFrame,
        failed: Column | DataFrame | None = None,
        *,
        failed_of: Callable[[], DataFrame] | None = None,
        rejected: Column | None = None,
    ) -> None:
        self.ok = ok
        self._failed = failed
        self._failed_of = failed_of
        # With ``failed`` a Column over the batch: the rejections' reasons, over the batch too
        # (evaluated with it by the events job). Otherwise a failed DataFrame carries them in
        # its ``REJECTION`` column.
        self.rejected = rejected

    @property
    def failed(self) -> Column | DataFrame | None:
        if self._failed is None and self._failed_of is not None:
            self._failed = self._failed_of()
        return self._failed


DECISION = "_rb_failed"
REJECTION = "_rb_rejection"  # why a failed row was rejected (null: failed, not rejected)


def decide(batch: DataFrame, result: BatchResult, observer: EventObserver | None = None) -> Decision:
    """Evaluate ``result.failed`` once per row (step 2 of the module docstring).

    Without ``write`` nothing else reads the decision: it is left to the ack step, which
    evaluates it once, and nothing is pinned. With an ``observer`` the pins record what the
    ack step needs while the outputs' jobs fill them (``spark_jobs/observed.py``), and the
    rows are pinned even without a decision, so the inputs' ids are recorded under a pin.
    """
    rows = batch if result.rows is None else result.rows
    if result.rejected is not None:
        return _decide_rejections(rows, result, observer)
    failed = result.failed
    if failed is None:
        if observer is not None and result.write is not None:
            return Decision(observer.pin_rows(rows), None)
        return Decision(rows, None)
    if SRID not in rows.columns:
        raise ConfigurationError(
            "BatchResult.rows lacks the srid column: carry it over from the batch, the fail "
            "marks are per srid"
        )
    if isinstance(failed, Column):
        flag = F.coalesce(failed, F.lit(False))
        if result.write is None:
            _evaluated_by_the_events_job(observer)
            return Decision(rows, failed if result.rows is None else rows.where(flag).select(SRID))
        # One evaluation, kept: a recomputed plan would ask the decision again (a cached
        # block can be evicted and recomputed; a local checkpoint is read, never recomputed).
        if observer is not None:
            # The decision column and the observer's partition column in one projection (each
            # DataFrame built is an analysis of the whole plan); both dropped after the pin.
            decided = observer.pin_fails(rows, f"CASE WHEN {DECISION} THEN {SRID} END", {DECISION: flag})
            extra = [DECISION, PARTITION]
        else:
            decided, extra = pin(rows.withColumn(DECISION, flag)), [DECISION]
        return Decision(
            decided.where(~F.col(DECISION)).drop(*extra),
            failed_of=lambda: decided.where(F.col(DECISION) & F.col(SRID).isNotNull()).select(SRID),
        )
    if result.write is None:
        _evaluated_by_the_events_job(observer)
        return Decision(rows, failed)
    marked = failed.select(SRID).where(F.col(SRID).isNotNull())
    srids = observer.pin_fails(marked, SRID).select(SRID) if observer is not None else pin(marked)
    if observer is not None:
        rows = observer.pin_rows(rows)
    # Untracked rows (null srid) match nothing and stay.
    return Decision(rows.join(srids.distinct(), SRID, "left_anti"), srids)


def _decide_rejections(rows: DataFrame, result: BatchResult, observer: EventObserver | None) -> Decision:
    """``decide`` with rejections: a rejected row fails, and its reason goes with its fail
    mark - from one evaluation, as the decision: the events job's projection over the batch,
    or the pinned rows."""
    if isinstance(result.failed, DataFrame):
        raise ConfigurationError("BatchResult.rejected needs failed as a Column (or None), not a DataFrame")
    if SRID not in rows.columns:
        raise ConfigurationError(
            "BatchResult.rows lacks the srid column: carry it over from the batch, the fail marks are per srid"
        )
    reason = result.rejected.cast("string")  # type: ignore[union-attr]
    flag = F.coalesce(result.failed, F.lit(False)) | reason.isNotNull() if result.failed is not None else reason.isNotNull()
    if observer is not None:
        observer.unobservable("rejections are read with the decision by the events job")
    if result.write is None:
        if result.rows is None:
            return Decision(rows, flag, rejected=reason)
        return Decision(rows, rows.where(flag).select(SRID, reason.alias(REJECTION)))
    decided = pin(rows.withColumn(DECISION, flag).withColumn(REJECTION, reason))
    return Decision(
        decided.where(~F.col(DECISION)).drop(DECISION, REJECTION),
        failed_of=lambda: decided.where(F.col(DECISION) & F.col(SRID).isNotNull()).select(SRID, REJECTION),
    )


def _evaluated_by_the_events_job(observer: EventObserver | None) -> None:
    """A decision without ``write`` is not pinned: nothing observes it, the events job alone
    evaluates it - so the observer's events must not be used (its inputs would be acked
    without their fail marks)."""
    if observer is not None:
        observer.unobservable("the decision is not pinned (no write): the events job evaluates it")


BatchHandler = Callable[[DataFrame, int], BatchResult | None]


def pin(frame: DataFrame) -> DataFrame:
    """``frame`` evaluated once, by the first Spark job that reads it, and read from that copy
    ever after: a local checkpoint, lazy.

    Lazy, not eager: an eager checkpoint is a Spark job of its own per batch, only to count the
    rows; the lazy one is filled by the job that reads the frame first (the outputs' write),
    and after that job Spark computes any partition it did not read (an extra job only then),
    keeps the blocks and cuts the lineage - so every later reader (the fail marks, the events)
    reads the same copy, and a lost block fails the batch instead of evaluating the decision a
    second time. The rows are kept serialized (``PIN_STORAGE``).
    """
    return frame.localCheckpoint(eager=False, storageLevel=PIN_STORAGE)


def catching_udf(fn: Callable[..., Any], return_type: DataType | str) -> Callable[..., Column]:
    """A Python UDF whose exceptions stay with their record instead of failing the batch.

    It returns ``struct<value, error>``: ``value`` is ``fn``'s result, ``error`` is null, or
    ``"ExcType: message"`` when ``fn`` raised for that record - fail those records with
    ``BatchResult(failed=parse(col)["error"].isNotNull())``, so one bad record is replayed
    (then dead-lettered) while the rest of the batch is acked.
    """
    value_type = return_type.simpleString() if isinstance(return_type, DataType) else return_type
    schema = f"struct<value:{value_type},error:string>"

    def guarded(*args: Any) -> tuple[Any, str | None]:
        try:
            return fn(*args), None
        except Exception as exc:  # noqa: BLE001 - the point: any error becomes the record's
            return None, f"{type(exc).__name__}: {exc}"[:1000]

    return F.udf(guarded, schema, useArrow=False)


def _default_name() -> str:
    return f"spark@{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class AckingConfig:
    name: str = field(default_factory=_default_name)  # XorBatch.producer, for diagnosis
    # 16 bytes a pair: 50 000 pairs is 800 kB, under Kafka's default 1 MB message limit.
    max_pairs_per_message: int = 50_000
    # The handler and the events job both read the batch. Off, the events job reads it from
    # Kafka again (the same offsets, the same records): no faster here (docs/benchmarks.md).
    # Not used with observe_events: the ack step then reads nothing of the batch.
    cache_batch: bool = True
    delivery_timeout_ms: int = 60_000
    # librdkafka overrides of the ack producer (linger.ms ...); never of idempotence or acks=all
    producer: Mapping[str, Any] = field(default_factory=dict)
    sink_options: Mapping[str, str] = field(default_factory=dict)  # Spark Kafka sink (emits)
    history: int = 1000  # BatchStats kept
    # Hand the handler the batch without the replays the acker marked superseded
    # (docs/design.md §6): they are acked as leaves, nothing is written for them.
    skip_superseded: bool = True
    # Take the events from observe() metrics of the jobs the batch runs anyway, not from a
    # job of their own (spark_jobs/observed.py); the job still runs where they are not
    # complete.
    observe_events: bool = True


@dataclass
class BatchStats:
    batch_id: int
    inputs: int = 0
    untracked: int = 0
    replay_inputs: int = 0
    srids: int = 0
    pairs: int = 0
    fail_marks: int = 0
    children: int = 0
    messages: int = 0
    skipped: int = 0  # superseded replays acked without handing them to the handler
    events_job: int = 0  # 1: the events were computed by a job of their own (not observed)
    committed: int = 0  # 1: a rerun of a batch its sink had committed, acked as recorded
    handler_s: float = 0.0
    ack_s: float = 0.0


STAT_FIELDS = (
    "inputs", "untracked", "replay_inputs", "srids", "pairs", "fail_marks", "children", "messages", "skipped",
    "events_job", "committed",
)


# --------------------------------------------------------------------------- events (pure Spark)


def with_tracking(batch: DataFrame) -> DataFrame:
    """``batch`` with the tracking columns, decoding ``headers`` if they are not there yet."""
    if SRID in batch.columns and RECORD_ID in batch.columns:
        return batch
    if "headers" not in batch.columns:
        raise ConfigurationError(
            "the batch has neither tracking columns nor headers: read it with "
            "spark_jobs.read_with_replay (or the Kafka source with includeHeaders=true)"
        )
    return with_tracking_columns(batch, "headers")


def without_superseded(batch: DataFrame, marked: DataFrame) -> DataFrame:
    """``batch`` without the rows whose srid is in ``marked`` (a ``srid`` column: superseded
    replays). A broadcast left-anti join in the JVM, no Python per row; untracked rows (null
    srid) match nothing and stay. The events are still computed over the whole batch, so a
    row left out here is acked as a leaf (its record id), which completes its replay."""
    return batch.join(F.broadcast(marked), SRID, "left_anti")


def xor_events(
    inputs: DataFrame,
    ledger_partitions: int,
    failed: Column | DataFrame | None = None,
    children: Sequence[DataFrame] = (),
    rejected: Column | None = None,
) -> DataFrame:
    """The batch's events, unfolded, as one row: ``srids_be``/``xors_be`` (aligned) hold one
    ``(srid, x)`` per tracked input (``x`` its record id) and per child (``x`` its id),
    ``failed_be`` the srids failed (repeats possible), all packed as big-endian int64 bytes;
    ``ledger_partitions``; ``rejected``, the (srid, reason) of the failed ones rejected (a
    ``rejected`` Column beside a ``failed`` one, or a failed DataFrame's ``REJECTION``
    column); and the counts ``inputs``, ``replay_inputs``, ``children``, ``untracked``
    (inputs with a null srid). ``collect_xor_batches`` folds them per srid.

    Every tracked row has a pair (``x`` 0 where it has no id). ``children`` are DataFrames
    of ``srid, child_id``. Everything per row runs in the JVM, as
    one aggregate without grouping: each task packs its rows, one small exchange brings the
    packed rows to one task. Folding per srid in Spark needed a shuffle of every row by ledger
    partition (a job of two full stages); the fold is a sort and an XOR-reduce over arrays on
    the driver instead (``fold_events``), faster per batch
    (docs/benchmarks.md, "Spark: the cost of acking"). The plan is one SQL text over the row
    frames: built from Column objects it took a py4j round trip per expression.
    """
    fail_flag = F.lit(False)
    if isinstance(failed, Column):
        fail_flag = F.coalesce(failed, F.lit(False))
    replay = f"coalesce(cast({IS_REPLAY} AS INT), 0)" if IS_REPLAY in inputs.columns else "0"
    reason = (rejected if isinstance(failed, Column) and rejected is not None else F.lit(None)).cast("string")
    frames: dict[str, Any] = {  # spark.sql puts each in as a temporary view
        "inputs": inputs.select(
            F.col(SRID), F.col(RECORD_ID), fail_flag.alias("_rb_fail"), F.expr(replay).alias("_rb_replay"),
            reason.alias("_rb_reason"),
        )
    }
    no_reason = "CAST(NULL AS STRING)"
    rows = [
        f"SELECT {SRID} AS srid, {RECORD_ID} AS x, _rb_fail AS fail, 1 AS n_inputs, "
        "_rb_replay AS n_replays, 0 AS n_children, _rb_reason AS reason FROM {inputs}"
    ]
    for k, child in enumerate(children):
        frames[f"child{k}"] = child
        rows.append(f"SELECT {SRID} AS srid, {CHILD_ID} AS x, false, 0, 0, 1, {no_reason} FROM {{child{k}}}")
    if isinstance(failed, DataFrame):
        frames["failed"] = failed
        why = f"CAST({REJECTION} AS STRING)" if REJECTION in failed.columns else no_reason
        rows.append(f"SELECT {SRID} AS srid, CAST(NULL AS BIGINT) AS x, true, 0, 0, 0, {why} FROM {{failed}}")
    text = _EVENTS_SQL.format(
        rows="\nUNION ALL ".join(rows),
        partitions=int(ledger_partitions),
        pack_srids=packed_ids_sql("collect_list(srid) FILTER (WHERE srid IS NOT NULL)"),
        pack_xors=packed_ids_sql("collect_list(coalesce(x, 0L)) FILTER (WHERE srid IS NOT NULL)"),
        pack_fails=packed_ids_sql("collect_list(srid) FILTER (WHERE srid IS NOT NULL AND fail)"),
    )
    return inputs.sparkSession.sql(text, **frames)


# ``{rows}``/``{partitions}`` are filled by ``xor_events``; ``{{inputs}}`` ... stay for
# ``spark.sql``, which puts the DataFrames in. Every tracked row gives a pair (a null ``x``,
# as a fail mark's, XORs 0), so the srids counted are every srid the batch touched;
# untracked rows (null srid) are only counted.
_EVENTS_SQL = """
WITH r AS ({rows})
SELECT CAST({partitions} AS INT) AS ledger_partitions,
       {pack_srids} AS srids_be, {pack_xors} AS xors_be, {pack_fails} AS failed_be,
       collect_list(named_struct('srid', srid, 'reason', reason))
         FILTER (WHERE srid IS NOT NULL AND fail AND reason IS NOT NULL) AS rejected,
       CAST(coalesce(sum(n_inputs) FILTER (WHERE srid IS NOT NULL), 0) AS BIGINT) AS inputs,
       CAST(coalesce(sum(n_replays) FILTER (WHERE srid IS NOT NULL), 0) AS BIGINT) AS replay_inputs,
       CAST(coalesce(sum(n_children) FILTER (WHERE srid IS NOT NULL), 0) AS BIGINT) AS children,
       CAST(count_if(n_inputs = 1 AND srid IS NULL) AS BIGINT) AS untracked
FROM r
"""

@dataclass(frozen=True)
class FoldedEvents:
    """The batch's events folded per srid: the pairs to send (XOR not zero, srid not failed),
    the failed srids, each sorted by srid, and how many srids the batch touched."""

    srids: np.ndarray
    xors: np.ndarray
    failed: np.ndarray
    distinct_srids: int


def fold_events(srids: np.ndarray, xors: np.ndarray, failed: np.ndarray) -> FoldedEvents:
    """Per srid the XOR of every ``x`` given for it (docs/design.md §4); a srid with a fail
    mark gets only the mark. A zero XOR is left out: it changes nothing in the ledger, sent
    it would only make an orphan entry."""
    s, x = xor_by_srid(np.asarray(srids, dtype=np.int64), np.asarray(xors, dtype=np.int64))
    fails = np.unique(np.asarray(failed, dtype=np.int64))
    keep = (x != 0) & ~np.isin(s, fails, assume_unique=True)
    return FoldedEvents(s[keep], x[keep], fails, int(np.union1d(s, fails).size))


def collect_xor_batches(
    events: DataFrame, producer: str = "", max_pairs: int = 50_000
) -> tuple[list[XorBatch], dict[str, int]]:
    """Collect ``xor_events`` (one row), fold it per srid and cut it into ``XorBatch`` values
    per ledger partition of at most ``max_pairs`` pairs (and fail marks); also returns the
    counts: ``inputs``, ``replay_inputs``, ``children``, ``untracked``, ``srids`` (touched),
    ``pairs`` and ``fail_marks`` (sent)."""
    row = events.collect()[0]
    counts = {name: int(row[name] or 0) for name in ("inputs", "replay_inputs", "children", "untracked")}
    return xor_batches(
        int(row["ledger_partitions"]),
        np.frombuffer(bytes(row["srids_be"]), dtype=">i8"),
        np.frombuffer(bytes(row["xors_be"]), dtype=">i8"),
        np.frombuffer(bytes(row["failed_be"]), dtype=">i8"),
        counts, producer, max_pairs, {int(r["srid"]): r["reason"] for r in row["rejected"] or ()},
    )


def xor_batches(
    partitions: int,
    srids: np.ndarray,
    xors: np.ndarray,
    failed: np.ndarray,
    counts: Mapping[str, int],
    producer: str = "",
    max_pairs: int = 50_000,
    rejected: Mapping[int, str] | None = None,
) -> tuple[list[XorBatch], dict[str, int]]:
    """Unfolded events (aligned ``(srid, x)`` pairs and failed srids) folded per srid and cut
    per ledger partition; ``counts`` plus ``srids``, ``pairs``, ``fail_marks``. A failed srid
    in ``rejected`` (srid -> why) goes as a rejection instead of a fail mark."""
    folded = fold_events(srids, xors, failed)
    rejects = np.array(sorted(rejected or ()), dtype=np.int64)
    fails_only = np.setdiff1d(folded.failed, rejects, assume_unique=True) if rejects.size else folded.failed
    out = dict(counts)
    out.update(srids=folded.distinct_srids, pairs=len(folded.srids), fail_marks=len(folded.failed))
    pair_lp = np.mod(folded.srids, partitions)
    fail_lp = np.mod(fails_only, partitions)
    reject_lp = np.mod(rejects, partitions)
    batches: list[XorBatch] = []
    for lp in np.union1d(np.union1d(pair_lp, fail_lp), reject_lp).tolist():
        lp_srids, lp_xors = folded.srids[pair_lp == lp], folded.xors[pair_lp == lp]
        fails, lp_rejects = fails_only[fail_lp == lp], rejects[reject_lp == lp]
        for start in range(0, max(len(lp_srids), len(fails), len(lp_rejects)), max_pairs):
            end = start + max_pairs
            chunk = lp_rejects[start:end]
            batches.append(XorBatch(
                lp, lp_srids[start:end], lp_xors[start:end], fails[start:end], producer,
                rejected=chunk, rejected_reasons=tuple((rejected or {})[int(s)] for s in chunk.tolist()),
            ))
    return batches, out


_EMIT, _PARENT = "_rb_emit", "_rb_parent"


def _child_rows(index: int, emit: Emit) -> DataFrame:
    """``emit``'s rows in the one shape every emit of a batch shares (the Kafka sink's columns
    plus the parent's tracking), so they are numbered and written together."""
    frame = emit.frame
    columns = set(frame.columns)
    missing = {"value", SRID, ORIGIN, ATTEMPT, PATH} - columns
    if missing:
        raise ConfigurationError(
            f"children for {emit.topic} lack {sorted(missing)}: carry the parent's srid, "
            "origin, attempt and path over from the input rows"
        )
    none = F.array().cast(_HEADERS_TYPE)
    own = F.coalesce(user_headers(F.col("headers")), none) if "headers" in columns else none
    key = F.col("key").cast("binary") if "key" in columns else F.lit(None).cast("binary")
    partition = (
        F.col(emit.partition_column).cast("int")
        if emit.partition_column is not None
        else F.lit(None).cast("int")
    )
    parent = F.col(RECORD_ID) if RECORD_ID in columns else F.lit(None).cast("bigint")
    return frame.select(
        F.lit(emit.topic).alias("topic"),
        F.lit(index).alias(_EMIT),
        key.alias("key"),
        F.col("value").cast("binary").alias("value"),
        own.alias("headers"),
        partition.alias("partition"),
        F.col(SRID).cast("bigint").alias(SRID),
        F.col(ORIGIN).cast("bigint").alias(ORIGIN),
        F.col(ATTEMPT).cast("int").alias(ATTEMPT),
        F.col(PATH).cast("string").alias(PATH),
        parent.cast("bigint").alias(_PARENT),
    )


# --------------------------------------------------------------------------- errors


class BatchFailed(ReplayBrokerError):
    """A micro-batch failed before its acks were out: Spark runs it again after a restart,
    or its srids time out and replay."""


class BatchInterrupted(BatchFailed):
    """The query was stopped while the batch ran; it runs again after a restart."""


# What Spark 4.0 counts as "interrupted by stop" in a Python foreachBatch error: it matches
# the error text with ``py4j.protocol.Py4JJavaError: An error occurred while
# calling((.|\r\n|\r|\n)*)(<one of these>)`` (StreamExecution.PROXY_ERROR).
_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


def _for_spark(exc: Exception, batch_id: int) -> BatchFailed:
    r"""A one-line error for Spark, the full one to our log.

    Spark 4.0's stream thread runs the regex above over the Python traceback it gets back;
    ``(.|\r\n|\r|\n)*`` recurses once per character, so a traceback that embeds a Java
    stack trace (a few kB) overflows the thread's stack: the query thread dies with a
    StackOverflowError and ``query.exception()`` stays empty. A short message keeps Spark's
    own handling working: a stop-time interruption, worded as Spark expects, ends the query
    cleanly; anything else fails it with this message.
    """
    text = str(exc)
    if any(name in text for name in _INTERRUPTIONS):
        log.info("batch %d interrupted (the query is stopping)", batch_id)
        return BatchInterrupted(
            "py4j.protocol.Py4JJavaError: An error occurred while calling foreachBatch: "
            f"java.lang.InterruptedException (batch {batch_id} interrupted by stop)"
        )
    log.error("batch %d failed before its acks were sent", batch_id, exc_info=exc)
    first_line = (text.strip().splitlines() or [""])[0][:500]
    return BatchFailed(f"batch {batch_id} failed: {type(exc).__name__}: {first_line}")


# --------------------------------------------------------------------------- the wrapper


def _decision_of(batches: Sequence[XorBatch]) -> Committed:
    """What the acks say: the srids they complete (a pair) and fail (a fail mark)."""
    empty = np.empty(0, dtype=np.int64)
    acked = np.concatenate([empty, *(np.asarray(xb.srids, dtype=np.int64) for xb in batches)])
    # A rejection is recorded as a failure: a rerun fails the row (the reason is not kept).
    failed = np.concatenate([empty, *(np.asarray(xb.failed, dtype=np.int64) for xb in batches),
                             *(np.asarray(xb.rejected, dtype=np.int64) for xb in batches)])
    return Committed(acked, failed)


class Acking:
    """``foreachBatch(Acking(bootstrap, namespace, handler))``: run ``handler(batch, batch_id)``
    and ack every tracked input of the batch (module docstring for the order of things)."""

    @kafka_errors("building an Acking")  # the namespace is checked here
    def __init__(
        self,
        bootstrap: str | KafkaSettings,
        namespace: str | Namespace,
        handler: BatchHandler,
        config: AckingConfig | None = None,
    ) -> None:
        self.settings = as_settings(bootstrap)
        self.ns = namespace if isinstance(namespace, Namespace) else Namespace(namespace)
        self.handler = handler
        self.config = config or AckingConfig()
        self.ledger_partitions = check(self.settings, self.ns)
        self._producer: Producer | None = None
        self._delivery_errors: list[str] = []
        # Superseded markers, read on the driver once per batch; as a DataFrame, rebuilt only
        # when new markers were read.
        self._markers = SupersededMarkers(self.settings, self.ns) if self.config.skip_superseded else None
        self._marked: DataFrame | None = None
        self._marked_read = -1
        self.history: deque[BatchStats] = deque(maxlen=self.config.history)
        self.totals: dict[str, int] = dict.fromkeys(
            ("batches", "interrupted", "failed_batches", *STAT_FIELDS), 0
        )

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self.process(batch, batch_id)
        except Exception as exc:  # noqa: BLE001 - every error is re-raised, one line long
            error = _for_spark(exc, batch_id)
            self.totals["interrupted" if isinstance(error, BatchInterrupted) else "failed_batches"] += 1
            raise error from None

    def process(self, batch: DataFrame, batch_id: int) -> BatchStats:
        """One micro-batch: handler, children, events, acks (``__call__`` without the error
        translation for Spark)."""
        started = time.monotonic()
        batch = with_tracking(batch)
        observer = EventObserver(batch_id) if self.config.observe_events else None
        if observer is not None:
            batch = observer.inputs(batch)
        # Observed, the ack step reads nothing of the batch (unless it falls back to the events job).
        cache = self.config.cache_batch and observer is None
        if cache:
            batch = batch.persist()
        try:
            rows, skipped = self._skip_superseded(batch)
            result = self.handler(rows, batch_id) or BatchResult()
            sink = result.checked_sink()
            committed = sink.committed(batch.sparkSession, batch_id) if sink is not None else None
            if committed is not None:
                # A rerun of a committed batch: the commit's decision, not a new one.
                log.info("batch %d is committed in its sink: acking its recorded decision", batch_id)
                result = replace(result, failed=committed_failures(rows, committed), rejected=None)
            decision = decide(rows, result, observer)
            emits = list(result.emits)
            if result.write is not None:
                emits += result.write(decision.ok, batch_id) or ()
            handled = time.monotonic()
            children = self._emit(emits, observer)
            observed = observer.events() if observer is not None else None
            if observed is not None:
                xor_batches_, counts = xor_batches(
                    self.ledger_partitions, observed.srids, observed.xors, observed.failed,
                    observed.counts, self.config.name, self.config.max_pairs_per_message,
                )
            else:
                if observer is not None:
                    log.debug("batch %d: events by a job of their own: %s", batch_id, observer.missed)
                events = xor_events(batch, self.ledger_partitions, decision.failed, children, decision.rejected)
                xor_batches_, counts = collect_xor_batches(
                    events, self.config.name, self.config.max_pairs_per_message
                )
                counts["events_job"] = 1
            if sink is not None and committed is None:
                sink.record(batch.sparkSession, batch_id, _decision_of(xor_batches_))
            self._send(xor_batches_)
        finally:
            if cache:
                batch.unpersist()
        stats = BatchStats(
            batch_id, messages=len(xor_batches_), skipped=skipped, committed=int(committed is not None), **counts
        )
        stats.handler_s = handled - started
        stats.ack_s = time.monotonic() - handled
        self.history.append(stats)
        self.totals["batches"] += 1
        for name in STAT_FIELDS:
            self.totals[name] += getattr(stats, name)
        log.debug("batch %d acked: %s", batch_id, asdict(stats))
        return stats

    def _skip_superseded(self, batch: DataFrame) -> tuple[DataFrame, int]:
        """The rows for the handler and how many superseded replays were left out. Nothing is
        joined or counted while no marker is known (the usual case)."""
        markers = self._markers
        if markers is None:
            return batch, 0
        markers.poll()
        if not markers.srids:
            return batch, 0
        if self._marked is None or markers.read != self._marked_read:
            self._marked = batch.sparkSession.createDataFrame([(s,) for s in markers.srids], f"{SRID} long")
            self._marked_read = markers.read
        marked = F.broadcast(self._marked)
        skipped = batch.join(marked, SRID, "left_semi").count()
        return (without_superseded(batch, self._marked), skipped) if skipped else (batch, 0)

    # ------------------------------------------------------------------ children

    def _emit(self, emits: Sequence[Emit], observer: EventObserver | None = None) -> list[DataFrame]:
        """Write the children with fresh ids and their paths; return ``srid, child_id`` for
        the events."""
        if not emits:
            return []
        children = reduce(DataFrame.unionByName, [_child_rows(k, emit) for k, emit in enumerate(emits)])
        tracked = F.col(SRID).isNotNull()
        # Numbered by content, not by the order rows arrive in: a replay of the tree, or this
        # batch run again, gives each child the path it had - the identity sinks dedup on.
        siblings = Window.partitionBy(SRID, _PARENT, PATH).orderBy(
            _EMIT, "topic", "key", "value", "headers", "partition"
        )
        numbered = children.withColumn(
            CHILD_PATH, F.when(tracked, child_path(F.col(PATH), F.row_number().over(siblings) - 1))
        )
        # Drawn once and pinned: a recomputed uuid() would write one id and XOR another.
        drawn = numbered.withColumn(CHILD_ID, F.when(tracked, new_id()))
        pinned = observer.pin_children(drawn, CHILD_ID) if observer is not None else pin(drawn)
        rb = tracking_headers(F.col(SRID), F.col(CHILD_ID), F.col(ORIGIN), F.col(ATTEMPT), F.col(CHILD_PATH))
        headers = F.when(tracked, F.concat(F.col("headers"), rb)).otherwise(F.col("headers"))
        (
            # One write for every topic: the Kafka sink takes each row's ``topic`` column, and a
            # null ``partition`` leaves the choice to the producer's partitioner.
            pinned.select("topic", "key", "value", headers.alias("headers"), "partition")
            .write.format("kafka")
            .options(**kafka_options(self.settings))
            .option("kafka.enable.idempotence", "true")
            .option("kafka.acks", "all")
            .options(**self.config.sink_options)
            .save()
        )
        return [pinned.select(SRID, CHILD_ID)]

    # ------------------------------------------------------------------ acks

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self._delivery_errors.append(str(err))

    def _send(self, batches: list[XorBatch]) -> None:
        if not batches:
            return
        if self._producer is None:
            self._producer = Producer(
                self.settings.producer_config(user=self.config.producer, defaults={"linger.ms": 2})
            )
        producer = self._producer
        for xb in batches:
            value = xb.encode()
            while True:
                try:
                    producer.produce(
                        self.ns.acks, value=value, partition=xb.ledger_partition, on_delivery=self._on_delivery
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        remaining = producer.flush(self.config.delivery_timeout_ms / 1000)
        if self._delivery_errors or remaining:
            errors, self._delivery_errors = self._delivery_errors, []
            # The batch fails; Spark runs it again, or its srids time out and replay.
            raise DeliveryError(
                f"acks not delivered ({remaining} pending, errors: {errors[:3]})"
            )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.config.delivery_timeout_ms / 1000)
            self._producer = None
        if self._markers is not None:
            self._markers.close()
            self._markers = None

    def __enter__(self) -> Acking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
