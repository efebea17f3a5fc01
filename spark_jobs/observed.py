"""The ack step's events taken from the jobs a micro-batch runs anyway: ``observe()`` metrics.

``Acking`` needs, per batch, every tracked input's ``(srid, record id)``, every child's
``(srid, child id)`` and the srids the decision failed. Computing them is a Spark job of its
own (``acking.xor_events``), and that job, with the cache of the batch it read, was most of
what acking added to a batch (docs/benchmarks.md, "Spark: the cost of acking"). But every row they
come from already passes through a job that runs anyway: the decision and the children are
pinned (lazy local checkpoints, ``acking.pin``) and the pins are filled by the jobs that write
the outputs. An ``EventObserver`` puts an ``observe()`` node on the batch (``inputs``) and one
under each pin (``pin_rows``, ``pin_fails``, ``pin_children``) and, after the writes, reads
what the nodes under the pins aggregated from the very plans that filled them - so the
events cost no job, and the batch need not be cached for a second reader.

An observation is only as good as the tasks that reported it, so what is read is checked, and
where it cannot be trusted ``events`` answers ``None`` (``missed`` says why) and the caller
runs the events job as before. What each part may and may not lack (docs/design.md §4):

- **inputs' ids** (XORed into their trees): a missing one leaves its tree incomplete until its
  timeout (a replay), a doubled one cancels out the same way - never an early completion. They
  are read from the pin whose plan read the batch (the most rows, if several did, one only:
  two would XOR every id twice); a batch no pin read (the handler's rows built from elsewhere)
  goes to the events job.
- **fail marks and children's ids** must not be missing: an input acked without the fail mark
  of its failed row completes a tree whose output was not written, and an input acked
  without its child's id completes the tree before the child is processed - a loss either
  way. They are read only when the pin is filled (its RDD checkpointed) **and** every row in
  it was observed: every partition was, or the ones that were not hold no row (counted in the
  pin, a small job run only then). A task that stored its block and then failed does not
  report its observation, and its retry reads the block without observing it again; an
  empty partition is the usual reason for a partition without observation. Fail marks are a
  set (doubles change nothing); a doubled child id (a partition computed twice) or a child
  observed from an evaluation that was not written only leaves its tree incomplete.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark import SparkContext, StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.tracking import IS_REPLAY, RECORD_ID, SRID

# How every pin (acking.pin, and the observer's) keeps its rows: serialized, in memory, then on
# disk. As deserialized objects every block is sized object by object (SizeEstimator), which
# costs more than serializing the rows (UnsafeRow bytes; docs/benchmarks.md).
PIN_STORAGE = StorageLevel(True, True, False, False)

PARTITION = "_rb_part"  # the column a pin_fails frame keeps: drop it with the decision's

# The ids are observed as plain ``collect_list`` arrays and read here a slice at a time, as
# decimal text. Packed in SQL instead (``packed_ids_sql``: higher-order functions, a lambda per
# id), an observation of two lists costs a batch more than the whole read. And a slice, not
# the whole array: py4j answers in one line, written by the JVM through an 8 kB buffer, so an
# answer longer than that leaves in two TCP segments, and the second waits for the first's
# ACK, which the kernel delays (Nagle's algorithm against delayed ACKs). 350 ids of at most 20
# characters and a comma stay under 8 000 characters.
_SLICE_IDS = 350


@dataclass(frozen=True)
class ObservedEvents:
    """The batch's events, unfolded, as ``xor_events`` would collect them: the ``(srid, x)``
    pairs (aligned arrays), the failed srids (repeats possible), and the counts ``inputs``,
    ``replay_inputs``, ``children``, ``untracked``."""

    srids: np.ndarray
    xors: np.ndarray
    failed: np.ndarray
    counts: dict[str, int]


@dataclass
class _Pinned:
    name: str
    observed: DataFrame  # the frame with its observe() node: its plan filled the pin
    pinned: DataFrame  # the local checkpoint itself (a LogicalRDD)
    kind: str  # "rows", "fails" or "children"


class EventObserver:
    """Observations of one micro-batch (module docstring): ``inputs`` on the batch before the
    handler sees it, ``pin_rows``/``pin_fails``/``pin_children`` instead of ``acking.pin``,
    ``events()`` after the outputs are written."""

    def __init__(self, batch_id: int) -> None:
        self._tag = f"rb_{batch_id}_{uuid.uuid4().hex[:8]}"
        self._inputs: str | None = None  # the inputs' observation
        self._pins: list[_Pinned] = []
        self._unobservable: str | None = None
        self.missed: str | None = None

    def unobservable(self, why: str) -> None:
        """Part of the events is evaluated by the events job only: ``events()`` answers None."""
        self._unobservable = why

    def inputs(self, batch: DataFrame) -> DataFrame:
        """``batch`` with the inputs' observation: every plan over it records the inputs it
        read, and the one under a pin is read back."""
        name = f"{self._tag}_inputs"
        replay = f"coalesce(cast({IS_REPLAY} AS INT), 0)" if IS_REPLAY in batch.columns else "0"
        observed = batch.observe(
            name,
            *_pairs(f"coalesce({RECORD_ID}, 0L)"),
            _expr(f"count({SRID})", "inputs"),
            _expr(f"coalesce(sum(CASE WHEN {SRID} IS NOT NULL THEN {replay} END), 0L)", "replay_inputs"),
            _expr(f"count_if({SRID} IS NULL)", "untracked"),
        )
        self._inputs = name
        return observed

    def pin_rows(self, frame: DataFrame) -> DataFrame:
        """``acking.pin(frame)``: the handler's rows without a decision, pinned so that the
        inputs' observation under them can be read."""
        return self._pin(frame, "rows", {}).drop(PARTITION)

    def pin_fails(self, frame: DataFrame, fail_expr: str, columns: dict[str, Any] | None = None) -> DataFrame:
        """``acking.pin(frame.withColumns(columns))``, recording ``fail_expr`` (SQL over those
        columns: a row's failed srid, or null). The pinned frame keeps a ``PARTITION`` column."""
        return self._pin(frame, "fails", columns or {}, _expr(f"collect_list({fail_expr})", "failed"))

    def pin_children(self, frame: DataFrame, child_id: str) -> DataFrame:
        """``acking.pin(frame)``, recording the ``(srid, child_id)`` of its tracked rows. The
        pinned frame keeps a ``PARTITION`` column."""
        return self._pin(
            frame,
            "children",
            {},
            *_pairs(child_id),
        )

    def _pin(self, frame: DataFrame, kind: str, columns: dict[str, Any], *metrics: Any) -> DataFrame:
        name = f"{self._tag}_{kind}{len(self._pins)}"
        # The partition is taken before the observation (its aggregates take deterministic
        # arguments only); a narrow projection, so it is the pin's partition too. The frame
        # checkpointed is always a new one: an action on a frame resets its plan's
        # observations, and nothing but the pin ever runs this one.
        observed = frame.withColumns({**columns, PARTITION: _expr("spark_partition_id()")}).observe(
            name, *metrics, _expr(f"collect_set({PARTITION})", "partitions")
        )
        pinned = observed.localCheckpoint(eager=False, storageLevel=PIN_STORAGE)
        self._pins.append(_Pinned(name, observed, pinned, kind))
        return pinned

    # ------------------------------------------------------------------ reading

    def _miss(self, why: str) -> ObservedEvents | None:
        self.missed = why
        return None

    def events(self) -> ObservedEvents | None:
        """The batch's events, or ``None`` (``missed`` says why) when the observations are not
        complete enough to be trusted (module docstring)."""
        self.missed = None
        if self._unobservable is not None:
            return self._miss(self._unobservable)
        if self._inputs is None:
            return self._miss("the batch was not observed")
        inputs: list[Any] | None = None
        srids: list[np.ndarray] = []
        xors: list[np.ndarray] = []
        failed = [np.empty(0, dtype=np.int64)]
        children = 0
        for pin in self._pins:
            rdd = pin.pinned._jdf.queryExecution().logical().rdd()
            if not rdd.isCheckpointed():
                return self._miss(f"a pinned {pin.kind} frame was not filled")
            observed = pin.observed._jdf.queryExecution().observedMetrics()
            row = _metrics(observed, pin.name)
            if row is None:
                return self._miss(f"a pinned {pin.kind} frame's observation is missing")
            if pin.kind != "rows" and not _all_observed(pin, row[-1], int(rdd.getNumPartitions())):
                return self._miss(f"a pinned {pin.kind} frame has rows in partitions not observed")
            if pin.kind == "fails":
                failed.append(_ids(row[0]))
            elif pin.kind == "children":
                srids.append(_ids(row[0]))
                xors.append(_ids(row[1]))
                children += len(srids[-1])
            # Each pin whose plan read the batch observed it on its own: one of them is used
            # (two would XOR every id twice), the one that read the most rows.
            seen = _metrics(observed, self._inputs)
            if seen is not None and (inputs is None or _rows_seen(seen) > _rows_seen(inputs)):
                inputs = seen
        if inputs is None:
            return self._miss("no pin read the batch (the handler's rows do not come from it)")
        counts = {"inputs": int(inputs[2]), "replay_inputs": int(inputs[3]), "untracked": int(inputs[4])}
        counts["children"] = children
        return ObservedEvents(
            np.concatenate([_ids(inputs[0]), *srids]),
            np.concatenate([_ids(inputs[1]), *xors]),
            np.concatenate(failed),
            counts,
        )


def _pairs(x: str) -> tuple[Any, Any]:
    """The metrics ``srids`` and ``xors``: each tracked row's srid and ``x`` (SQL), aligned -
    ``x`` is null exactly where the srid is, and ``collect_list`` skips both."""
    return (
        _expr(f"collect_list({SRID})", "srids"),
        _expr(f"collect_list(CASE WHEN {SRID} IS NOT NULL THEN {x} END)", "xors"),
    )


def _expr(sql: str, alias: str | None = None) -> Column:
    """``F.expr(sql)`` (with its ``alias``), built once per Spark context: the observations
    ask for the same expressions every batch, and building a Column is several py4j round
    trips (~0.1-0.5 ms each). A Column is an unresolved expression, resolved anew in each
    plan it is used in, so one object serves every batch."""
    return _built_expr(sql, alias, SparkContext._active_spark_context)


@functools.lru_cache(maxsize=64)
def _built_expr(sql: str, alias: str | None, _context: Any) -> Column:
    column = F.expr(sql)
    return column.alias(alias) if alias is not None else column


def _all_observed(pin: _Pinned, partitions: Any, total: int) -> bool:
    """Whether every row of the pin was observed: every partition was, or the ones that were
    not are empty - counted in the pin itself (a small job, read from its blocks, only when a
    partition was not observed: an empty one is the usual reason)."""
    seen = {int(p) for p in str(partitions.mkString(",")).split(",") if p}
    missing = sorted(set(range(total)) - seen)
    return not missing or pin.pinned.where(F.col(PARTITION).isin(missing)).limit(1).count() == 0


def _rows_seen(inputs: list[Any]) -> int:
    return int(inputs[2]) + int(inputs[4])


def _ids(values: Any) -> np.ndarray:
    """A Scala ``Seq`` of bigints (an observed ``collect_list``), read ``_SLICE_IDS`` at a time."""
    size = int(values.length())
    parts = [
        np.array(values.slice(start, start + _SLICE_IDS).mkString(",").split(","), dtype=np.int64)
        for start in range(0, size, _SLICE_IDS)
    ]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _metrics(observed: Any, name: str) -> list[Any] | None:
    """The values of observation ``name`` in a Scala ``Map[String, Row]``, or ``None``."""
    found = observed.get(name)
    if found.isEmpty():
        return None
    row = found.get()
    return [row.get(i) for i in range(row.size())]
