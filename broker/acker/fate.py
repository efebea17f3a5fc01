"""The fate rule of docs/design.md §6 as code: the states of an attempt, the inputs that move
it, and the table itself - one ``Row`` per row of the design's table, in its order
(tests/unit/test_fate_table.py reads the two side by side, so they cannot drift).

The rows are carried out where their input is read: the fold and the expiry in
``broker.ledger.table``, the marks in ``broker.acker.superseding``, the decisions in
``broker.acker.decisions`` - which picks its rows by name (``REPLAYED``, ``HELD``,
``DEFERRED``, ``LOST``, ``QUARANTINED``, ``DEAD_LETTERED``) and writes what they say.

The enums' values are the words of the doc and of the logs: a ``Reason`` is what a replay's
history and a dead letter's ``rb-reason`` say, an ``Outcome`` is a tombstone's
``rb-outcome``.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import NamedTuple

from broker.headers import OUTCOME_COMPLETED, OUTCOME_DLQ, OUTCOME_REPLAY


class Reason(StrEnum):
    """Why an attempt ended without completing (``Failure.reason``, ``rb-reason``)."""

    TIMEOUT = "timeout"  # its deadline passed (gated)
    FAILED = "failed"  # a fail mark: ``TaskContext.fail``
    REJECTED = "rejected"  # a rejection: ``TaskContext.reject``, a fatal exception - its last attempt


class Outcome(StrEnum):
    """Why a srid left the ledger: its tombstone's ``rb-outcome``."""

    COMPLETED = OUTCOME_COMPLETED.decode()
    REPLAY = OUTCOME_REPLAY.decode()
    DLQ = OUTCOME_DLQ.decode()

    @property
    def header(self) -> bytes:
        return self.value.encode()


class State(Enum):
    """The states of an attempt in its ledger partition's table (the table's flags aside)."""

    PENDING = "pending"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    WATCH = "watch"
    HELD = "held"
    DEFERRED = "deferred"
    SUPERSEDED = "superseded"
    GONE = "gone"


class Input(Enum):
    """What moves an attempt on."""

    COMPLETED = "XOR value reaches 0"
    FAIL_MARK = "fail mark"
    REJECTION = "rejection"
    TOUCH = "touch"
    OUTAGE_BEAT = "outage beat"
    SUPERSEDED_MARK = "superseded mark"
    DEADLINE = "deadline passed"
    ENDED = "timed out or failed"
    DECIDED = "decided"
    UNREADABLE = "payload not readable"
    BEFORE_TURN = "before its turn"
    LOST = "payload gone"
    UNDECODABLE = "persist record undecodable"
    WINDOWS_ENDED = "every window ended"
    WATCH_ENDED = "`watch_ms` passed"
    RESTORE = "restore"


class Condition(Enum):
    """What else a row asks of the attempt."""

    NOT_LAST = "not the last attempt, not rejected"
    LAST = "the last attempt, or rejected"
    TIMED_OUT = "timed out"


ANY: tuple[State, ...] = tuple(s for s in State if s is not State.GONE)
_ENDED = (State.FAILED, State.TIMED_OUT)


class Row(NamedTuple):
    """One row of the table: in ``states`` (and ``when``), ``input`` leads to ``next`` (None:
    the same state) and writes a tombstone with ``outcome`` (None: no tombstone). A ``gated``
    input is taken at the partition's read-up-to tick (broker.acker.lag), not the clock's."""

    states: tuple[State, ...]
    input: Input
    next: State | None
    outcome: Outcome | None = None
    when: Condition | None = None
    gated: bool = False

    @property
    def tombstone(self) -> bytes:
        """Its tombstone's ``rb-outcome`` header."""
        if self.outcome is None:
            raise ValueError(f"{self} writes no tombstone")
        return self.outcome.header


COMPLETES = Row((State.PENDING,), Input.COMPLETED, State.GONE, Outcome.COMPLETED)
FAILS = Row((State.PENDING,), Input.FAIL_MARK, State.FAILED)
REJECTS = Row((State.PENDING,), Input.REJECTION, State.FAILED)
TOUCHED = Row((State.PENDING,), Input.TOUCH, State.PENDING)
# A task's outage stops the clock of what is pending (broker.ledger.outages): read like an
# event, so before any expiry at a tick after the beat was sent.
STOPPED = Row((State.PENDING,), Input.OUTAGE_BEAT, State.PENDING, gated=True)
MARKED = Row((State.PENDING,), Input.SUPERSEDED_MARK, State.PENDING)
TIMES_OUT = Row((State.PENDING,), Input.DEADLINE, State.TIMED_OUT, gated=True)
FAIL_WINS = Row((State.FAILED,), Input.DEADLINE, State.FAILED)
REPLAYED = Row(_ENDED, Input.DECIDED, State.WATCH, Outcome.REPLAY, when=Condition.NOT_LAST)
HELD = Row(_ENDED, Input.DECIDED, State.HELD, when=Condition.LAST)
DEFERRED = Row(_ENDED, Input.UNREADABLE, State.DEFERRED)
WAITS = Row(_ENDED, Input.BEFORE_TURN, State.DEFERRED, when=Condition.NOT_LAST)
LOST = Row(_ENDED, Input.LOST, State.HELD)
QUARANTINED = Row(_ENDED, Input.UNDECODABLE, State.GONE, Outcome.DLQ)
COMPLETED_LATE = Row((State.HELD,), Input.COMPLETED, State.GONE, Outcome.COMPLETED, when=Condition.TIMED_OUT)
HELD_SUPERSEDED = Row((State.HELD,), Input.SUPERSEDED_MARK, State.GONE, Outcome.COMPLETED)
DEAD_LETTERED = Row((State.HELD,), Input.WINDOWS_ENDED, State.GONE, Outcome.DLQ, gated=True)
SETTLED = Row((State.SUPERSEDED,), Input.ENDED, State.GONE, Outcome.COMPLETED)
WATCH_COMPLETED = Row((State.WATCH,), Input.COMPLETED, State.GONE, when=Condition.TIMED_OUT)
HANDED_ON = Row((State.WATCH,), Input.SUPERSEDED_MARK, State.GONE)
UNWATCHED = Row((State.WATCH,), Input.WATCH_ENDED, State.GONE, gated=True)
RESTORED = Row(ANY, Input.RESTORE, None)

# docs/design.md §6, "The states of an attempt", row by row.
TABLE: tuple[Row, ...] = (
    COMPLETES, FAILS, REJECTS, TOUCHED, STOPPED, MARKED, TIMES_OUT, FAIL_WINS, REPLAYED, HELD, DEFERRED, WAITS,
    LOST, QUARANTINED, COMPLETED_LATE, HELD_SUPERSEDED, DEAD_LETTERED, SETTLED, WATCH_COMPLETED, HANDED_ON, UNWATCHED, RESTORED,
)
