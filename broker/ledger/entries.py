"""What a ledger entry is: its flag bits, the result types the table's rules return, and
``Entry`` (one entry, for tests and tooling). No state and no rules here: the parts of
``broker.ledger.table.LedgerTable`` share these names.

An entry is four columns of the hash table (``broker.ledger.store``): ``value`` (running XOR),
``offset`` (persist-record offset, -1 until registered), ``deadline`` (tick) and ``flags``
(the bits below; 0x80 is the hash table's LIVE). Attempt, origin and key-hash partition
(docs/design.md §5) are not columns: they are in the persist record, which a replay fetches
at ``offset`` anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

REGISTERED = 0x01
"""The persist record has been folded (the root event is in ``value``)."""
FAILED = 0x02
"""An explicit failure mark has been seen; the entry never completes, it is replayed."""
LOGGED = 0x04
"""A live changelog record exists for the entry (it needs a tombstone when it leaves)."""
DIRTY = 0x08
"""Changed since the last ``take_dirty`` in a way its persist record does not say."""
DEFERRED = 0x10
"""Failed, decision put off until ``deadline`` (``defer`` / ``take_deferred``)."""
WATCH = 0x20
"""Not an attempt any more: a timed-out entry that was replayed, kept with its ``value`` so that
late events of the original attempt can still bring it to 0 (``watch`` / ``take_superseded``);
its ``offset`` column holds the replay's srid, its ``deadline`` the end of the watch."""
SUPERSEDED = 0x40
"""The original attempt of this (replay) srid completed late: the entry completes as usual
when its events arrive, but is never replayed or dead-lettered (``take_settled``)."""
DURABLE_FLAGS = REGISTERED | FAILED | DEFERRED | WATCH | SUPERSEDED
"""The flag bits that belong to the entry's state and travel through the changelog."""
STATE = REGISTERED | FAILED | DEFERRED | WATCH
"""The bits that decide whether an entry completes at 0: REGISTERED alone, or REGISTERED |
DEFERRED (a held timeout, value kept); WATCH alone is a watch whose original completed late."""
FAILED_MASK = REGISTERED | FAILED | DEFERRED
FAILED_NOW = REGISTERED | FAILED
"""``flags & FAILED_MASK == FAILED_NOW``: what ``take_failed`` hands out (a DEFERRED entry
waits for ``take_deferred``; an unregistered one for its persist record)."""


@dataclass(frozen=True, eq=False)
class Removed:
    """Entries that left the table in one call, as columns (order unspecified).

    ``offsets`` is the persist-record offset to fetch the payload from when replaying
    (-1 for entries that were never registered: orphans).
    """

    srids: np.ndarray  # int64
    offsets: np.ndarray  # int64
    values: np.ndarray | None = None  # int64 XOR values, where the caller needs them (timeouts)

    def __len__(self) -> int:
        return int(self.srids.size)

    @classmethod
    def empty(cls, with_values: bool = False) -> Removed:
        """No entries (``values`` an empty column where ``with_values``, else None): one
        instance each, shared - asked for per partition per commit, and a column of no
        entries cannot change."""
        return _NONE_REMOVED[with_values]

    @classmethod
    def concat(cls, parts: list[Removed]) -> Removed:
        """``parts`` as one (their ``values`` are dropped, unless there is one part)."""
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls(np.concatenate([p.srids for p in parts]), np.concatenate([p.offsets for p in parts]))



_NONE_REMOVED = {
    False: Removed(np.empty(0, np.int64), np.empty(0, np.int64)),
    True: Removed(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)),
}

class Registered(NamedTuple):
    """Result of ``register``."""

    completed: Removed
    """Trees completed by their persist record (all events had arrived before it)."""
    duplicates: np.ndarray
    """bool, aligned with the input: persist records that were NOT folded (srid registered)."""


class Deferred(NamedTuple):
    """Result of ``take_deferred``: deferred entries whose tick has come, by reason."""

    timed_out: Removed
    """Deferred after a timeout."""
    failed: Removed
    """Deferred after an explicit failure (FAILED)."""
    next_offset: int = -1
    """The smallest persist offset of the due entries left in the table by ``limit`` (-1:
    none left)."""


class Expired(NamedTuple):
    """Result of ``expire``."""

    timed_out: Removed
    """Registered entries past their deadline: replay them."""
    orphans: Removed
    """Unregistered entries past their orphan deadline: count them, nothing to replay."""


@dataclass(frozen=True, eq=False)
class Entries:
    """Entry state as columns: what a changelog record holds.

    ``flags`` carries only ``DURABLE_FLAGS``; ``deadlines`` are ticks of this process's
    ``Ticker`` (convert to ms before they leave the process).
    """

    srids: np.ndarray  # int64
    values: np.ndarray  # int64
    flags: np.ndarray  # uint8
    offsets: np.ndarray  # int64
    deadlines: np.ndarray  # int32

    def __len__(self) -> int:
        return int(self.srids.size)


@dataclass(frozen=True, eq=False)
class ChangelogDelta:
    """Result of ``take_dirty``: what the changelog needs since the previous call.

    ``upserts`` and ``tombstones`` never share a srid, so they may be written in any order.
    """

    upserts: Entries
    tombstones: np.ndarray  # int64 srids


@dataclass(frozen=True)
class Entry:
    """One entry, for tests and tooling (the service works with columns)."""

    srid: int
    value: int
    offset: int
    deadline: int
    registered: bool
    failed: bool
    logged: bool
    dirty: bool
    deferred: bool = False
    watching: bool = False
    superseded: bool = False

    @property
    def complete(self) -> bool:
        return (self.registered and not self.failed and not self.deferred and not self.watching
                and self.value == 0)
