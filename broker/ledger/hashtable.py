"""A numpy open-addressing hash table keyed by srid, operated on whole batches of keys.

This is the storage layer of the ledger table (``broker.ledger.store.EntryStore`` holds it):
where an entry lives, how a key finds it, how the table grows and how entries leave. What the
columns *mean* (XOR value, registration, failure, changelog state, timeouts) is the ledger's
business; here they are columns, except for the deadline of a free slot and the LIVE flag
bit, which this layer owns.

Layout
------
Open addressing with linear probing over five columns of capacity ``C`` (any multiple of 8,
not a power of two): ``keys`` int64 (srid; 0 = never used), ``value`` int64, ``offset`` int64
(-1 when unset), ``deadline`` int32 (a tick; INT32_MAX in every free slot, so a scan for due
deadlines never selects one and needs no flags) and ``flags`` uint8 (bit 0x80, LIVE, is this
table's; the other seven belong to the caller). 29 bytes per slot and no Python object per
entry, so bytes per entry = 29 / load. Every rebuild sizes the table so that the entries it
must hold fill 62.5 % of it (``max_load - 1/8`` with the default ``max_load`` 0.75), and the
next rebuild comes when live + deleted slots would pass 75 %: a growing table runs between
load 0.625 (46 B per entry) and 0.75 (39 B) at every size, growing by x1.2 per rebuild (a
power-of-two table doubles and swings between 0.375 and 0.75: 39..77 B). Deletions alone
never rebuild, so the load drops below 0.625 only while entries leave faster than new ones
arrive, until the next rebuild. A rebuild briefly holds the old and the new columns.
Capacities are multiples of 8 so that ``flagged`` can scan the flags 8 per uint64 word.

The home slot is ``(t * C) >> 32`` where ``t`` is the top 32 bits of
``srid * 0x9E3779B97F4A7C15`` (Fibonacci hashing of the uint64 view, scaled to ``[0, C)``
by "fastrange" multiplication instead of a power-of-two shift; it fits uint64 while
``C <= 2**32``), not the low bits: every srid of one ledger partition has the same
``srid mod P``, so the low bits are correlated and would cluster. Probes wrap at ``C``.

Every operation takes a whole batch of sorted unique keys (the caller sorts and reduces its
batch per srid first). All keys probe in rounds - each round looks at the next slot of every
key still searching, and once fewer than 4096 keys search, at the next window of up to 64
consecutive slots of each (one round per slot would cost ~20 numpy calls for each step of the
longest probe path). New keys that race for the same free slot all write their key into it
and read it back: exactly one write survives, that key won, the others keep probing from the
next slot. Key 0 marks an empty slot, so 0 is never a key (the caller rejects it).

Deletion: tombstones, not backward shift
----------------------------------------
A deleted slot keeps ``keys == INT64_MIN`` with the LIVE flag bit clear; probes walk over it,
insertions reuse the first one they pass. Backward-shift deletion would leave no tombstones,
but the shift of one slot depends on every other deletion in the same cluster, so a batch of
deletions would have to be applied one by one in Python. A tombstone is one vectorised write.
Tombstones are reclaimed by reuse and by a rebuild when live + deleted slots would exceed
75 %: the rebuild resizes the table to hold the live entries plus the batch being inserted at
62.5 % (so at least C/8 insertions pass before the next rebuild): it grows, keeps its size
under steady churn, and shrinks when the table has drained (never below the initial
capacity). INT64_MIN is still a valid srid: whether such a slot is live is decided by the
LIVE bit, which the probe reads only for INT64_MIN slots.
"""

from __future__ import annotations

import math

import numpy as np

LIVE = 0x80
"""Flag bit owned by the table: the slot holds an entry (empty and deleted slots have it clear)."""

_TOMBSTONE_KEY = np.iinfo(np.int64).min
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)
_INT32_MAX = int(np.iinfo(np.int32).max)  # the deadline of every free slot: never due
_BYTE_ONES = 0x0101010101010101  # times a flag bit: that bit in each byte of a uint64 word
_MIN_CAPACITY = 8
_MAX_CAPACITY = 1 << 32  # fastrange keeps (32-bit hash) * C inside uint64 while C <= 2**32
_REUSE_HEADROOM = 0.125  # a rebuild leaves at least C/8 free slots before the next one
_SHIFT32 = np.uint64(32)
_MAX_WINDOW = 64  # at most this many slots per key in one probe round
_WINDOW_BUDGET = 4096  # slots one probe round looks at once fewer keys than this still search
_STEPS = np.arange(_MAX_WINDOW, dtype=np.intp)


def _multiple_of_8(n: int) -> int:
    """Capacities are multiples of 8: ``flagged`` scans the flags 8 per uint64 word."""
    return max(_MIN_CAPACITY, -(-int(n) // 8) * 8)


def _first_true(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a 2-D bool array: the column of each row's first True (0 if none), and whether
    the row has one."""
    if mask.shape[1] == 1:  # argmax along an axis of length 1 costs a call per row
        return np.zeros(mask.shape[0], np.intp), mask[:, 0]
    col = mask.argmax(axis=1)
    return col, mask.reshape(-1)[_row_offsets(mask.shape[0], mask.shape[1]) + col]


def _row_offsets(rows: int, width: int) -> np.ndarray:
    """Flat index of the first element of each row of a C-contiguous (rows, width) array."""
    return np.arange(0, rows * width, width, dtype=np.intp)


class SridTable:
    """srid -> slot in the columns ``keys``, ``value``, ``offset``, ``deadline``, ``flags``;
    see the module doc.

    The columns are public: callers read and write the entries' values through slot indices
    from ``lookup`` / ``find_or_insert`` (taken after any insertion, which may rebuild and
    replace the columns). Only this class writes ``keys``, moves entries or frees slots.
    """

    keys: np.ndarray
    value: np.ndarray
    offset: np.ndarray
    deadline: np.ndarray
    flags: np.ndarray

    def __init__(self, initial_capacity: int = 1024, *, max_load: float = 0.75) -> None:
        if not 0.25 < max_load <= 0.9:
            raise ValueError(f"max_load must be in (0.25, 0.9], got {max_load}")
        self._max_load = max_load
        self._min_capacity = _multiple_of_8(initial_capacity)
        self._allocate(self._min_capacity)
        self._live = 0
        self._dead = 0  # tombstone slots

    def __len__(self) -> int:
        return self._live

    @property
    def capacity(self) -> int:
        return int(self.keys.size)

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns."""
        return int(
            self.keys.nbytes + self.value.nbytes + self.offset.nbytes + self.deadline.nbytes + self.flags.nbytes
        )

    def home(self, keys: np.ndarray) -> np.ndarray:
        """Fibonacci hashing + fastrange: the top 32 bits t of key * 2**64/phi (wrapping
        uint64) scaled to [0, C) as ``(t * C) >> 32``."""
        h = keys.view(np.uint64) * _FIBONACCI
        h >>= _SHIFT32
        h *= self._capacity_u64
        h >>= _SHIFT32
        return h.astype(np.intp)

    def lookup(self, u: np.ndarray) -> np.ndarray:
        """Slots of sorted unique keys ``u`` (-1 for keys not in the table)."""
        return self._probe(u)[0]

    def find_or_insert(self, u: np.ndarray, deadline: int, flags: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots of sorted unique keys ``u``, inserting the missing ones as fresh entries.

        A fresh entry: value 0, offset -1, ``deadline``, flags ``LIVE | flags``. Rebuilds
        first if the insertions would pass ``max_load``. Returns (slots, batch indices of the
        fresh ones).
        """
        pos, free = self._probe(u)
        missing = np.flatnonzero(pos < 0)
        if missing.size == 0:
            return pos, missing
        if self._live + self._dead + missing.size > self._max_used:
            self._rebuild(self._live + missing.size)
            pos, free = self._probe(u)
        slots = self._claim(u[missing], free[missing])
        pos[missing] = slots
        self.value[slots] = 0
        self.offset[slots] = -1
        self.deadline[slots] = deadline
        self.flags[slots] = LIVE | flags
        return pos, missing

    def delete(self, slots: np.ndarray) -> None:
        """Turn live ``slots`` (unique) into tombstones: key INT64_MIN, flags 0, deadline
        INT32_MAX, offset -1 (``value`` is left as it is). Every slot that is not a registered
        entry holds offset -1, so the smallest registered offset is one unmasked min of the
        column read as unsigned (EntryStore.pending)."""
        if slots.size == 0:
            return
        self.keys[slots] = _TOMBSTONE_KEY
        self.flags[slots] = 0
        self.deadline[slots] = _INT32_MAX
        self.offset[slots] = -1
        self._live -= slots.size
        self._dead += slots.size

    def live_slots(self) -> np.ndarray:
        """Every slot holding an entry, in slot order. O(capacity)."""
        return np.flatnonzero(self.flags & LIVE)

    def flagged(self, bit: int) -> np.ndarray:
        """Slots whose flags have ``bit`` set: find the uint64 words holding one, then look
        inside them (free slots have flags 0, so they never match)."""
        words = np.flatnonzero(self.flags.view(np.uint64) & np.uint64(_BYTE_ONES * bit))
        if not words.size:
            return words  # none: an empty int64 column, as the slots would be
        candidates = (words[:, None] * 8 + np.arange(8)).reshape(-1)
        return candidates[(self.flags[candidates] & bit) != 0]

    # ------------------------------------------------------------------ probing and resizing

    def _allocate(self, capacity: int) -> None:
        if capacity > _MAX_CAPACITY:
            raise MemoryError(f"a ledger table holds at most {_MAX_CAPACITY} slots")
        self.keys = np.zeros(capacity, np.int64)
        self.value = np.zeros(capacity, np.int64)
        self.offset = np.full(capacity, -1, np.int64)
        self.deadline = np.full(capacity, _INT32_MAX, np.int32)  # INT32_MAX: not live
        self.flags = np.zeros(capacity, np.uint8)
        self._capacity = capacity
        self._capacity_u64 = np.uint64(capacity)
        self._max_width = min(capacity, _MAX_WINDOW)
        self._max_used = int(capacity * self._max_load)

    def _width(self, searching: int) -> int:
        """Slots per key in the next probe round: 1 while many keys search, wider for the
        few with long probe paths (each round costs ~20 numpy calls whatever its size)."""
        return max(1, min(self._max_width, _WINDOW_BUDGET // searching))

    def _window(self, s: np.ndarray, width: int) -> np.ndarray:
        """Slots ``s + 0 .. s + width - 1`` of each of ``s`` (one row each), wrapping at C."""
        if width == 1:
            return s[:, None]
        idx = s[:, None] + _STEPS[:width]
        idx[idx >= self._capacity] -= self._capacity
        return idx

    def _probe(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted unique keys ``u``: (slot or -1, first free slot on the probe path).

        The free slot (first tombstone passed, else the empty slot that ended the probe) is
        where a missing key would be inserted. A round looks at one slot per key while many
        keys search, then at windows of consecutive slots (``_width``): the few keys with long
        probe paths cost a few rounds, not one round per slot.
        """
        n = u.size
        pos = np.full(n, -1, np.intp)
        free = np.full(n, -1, np.intp)
        if n == 0:
            return pos, free
        keys, flags = self.keys, self.flags
        may_be_min = bool(u[0] == _TOMBSTONE_KEY)  # u is sorted: INT64_MIN comes first
        tombstones = self._dead > 0
        gi = np.arange(n)  # batch index of each searching key
        k = u
        s = self.home(u)
        while k.size:
            width = self._width(k.size)
            idx = self._window(s, width)
            kk = keys[idx]
            hit = kk == k[:, None]
            flat_idx = idx.reshape(-1)
            if may_be_min:  # a srid of INT64_MIN matches only a live slot
                m = np.flatnonzero(hit & (k == _TOMBSTONE_KEY)[:, None])
                hit.reshape(-1)[m] = (flags[flat_idx[m]] & LIVE) != 0
            stop = hit | (kk == 0)
            col, stopped = _first_true(stop)  # the first hit or empty slot of each row
            at = _row_offsets(k.size, width) + col
            slot = flat_idx[at]
            found = hit.reshape(-1)[at] & stopped
            pos[gi[found]] = slot[found]
            if tombstones:  # the first tombstone before the stop (or in the whole window)
                tomb = kk == _TOMBSTONE_KEY
                m = np.flatnonzero(tomb)
                tomb.reshape(-1)[m] = (flags[flat_idx[m]] & LIVE) == 0
                if width > 1:
                    tomb &= _STEPS[:width] < np.where(stopped, col, width)[:, None]
                tcol, has = _first_true(tomb)
                t = np.flatnonzero(has)
                t = t[free[gi[t]] < 0]
                free[gi[t]] = flat_idx[_row_offsets(k.size, width)[t] + tcol[t]]
            e = np.flatnonzero(stopped & ~found)  # ended at an empty slot
            e = e[free[gi[e]] < 0]
            free[gi[e]] = slot[e]
            searching = np.flatnonzero(~stopped)
            gi = gi[searching]
            k = k[searching]
            s = idx[searching, -1] + 1
            s[s == self._capacity] = 0
        return pos, free

    def _claim(self, k: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Insert missing unique keys ``k``, probing from ``start``; return their slots.

        Each key takes the first free slot of its window (``_width`` slots, as in ``_probe``).
        Keys racing for one free slot all write it and read it back: the surviving write
        wins, the others move on from the next slot. Only ``keys`` and the LIVE bit are set
        here.
        """
        out = np.empty(k.size, np.intp)
        keys, flags = self.keys, self.flags
        gi = np.arange(k.size)
        s = start
        reused = 0
        while gi.size:
            width = self._width(gi.size)
            idx = self._window(s, width)
            kk = keys[idx]
            flat_idx = idx.reshape(-1)
            is_free = kk == 0
            m = np.flatnonzero(kk == _TOMBSTONE_KEY)
            is_free.reshape(-1)[m] = (flags[flat_idx[m]] & LIVE) == 0
            col, has = _first_true(is_free)
            f = np.flatnonzero(has)
            at = f if width == 1 else _row_offsets(gi.size, width)[f] + col[f]
            sf = flat_idx[at]
            kf = k[f]
            keys[sf] = kf
            won = keys[sf] == kf
            ws = sf[won]
            flags[ws] = LIVE
            reused += int(np.count_nonzero(kk.reshape(-1)[at[won]] == _TOMBSTONE_KEY))
            out[gi[f[won]]] = ws
            # losers go on after the slot they lost, keys without a free slot after the window
            nxt = idx[:, -1] + 1
            if width > 1:
                nxt[f] = sf + 1
            lost = np.ones(gi.size, dtype=bool)
            lost[f[won]] = False
            gi = gi[lost]
            k = k[lost]
            s = nxt[lost]
            s[s == self._capacity] = 0
        self._live += out.size
        self._dead -= reused
        return out

    def _rebuild(self, need: int) -> None:
        """Rehash the live entries into a table that holds ``need`` at load max_load - 1/8
        (62.5 %; never below the initial capacity): it grows, keeps or shrinks to fit.

        No probing: in order of home slot, entry ``i`` goes to ``max(home_i, slot_{i-1} + 1)``
        (what inserting them one by one would give), i.e. ``i + cummax(home - i)``. The homes
        are nearly sorted already (old slot order, and fastrange keeps the hash order), so the
        stable sort is cheap. Entries pushed past the last slot wrap: ``_claim`` puts them
        in the first free slots from slot 0.
        """
        capacity = max(self._min_capacity, _multiple_of_8(math.ceil(need / (self._max_load - _REUSE_HEADROOM))))
        old_keys, old_value, old_offset, old_deadline, old_flags = (
            self.keys, self.value, self.offset, self.deadline, self.flags)
        live = np.flatnonzero(old_flags & LIVE)
        keys = old_keys[live]
        self._allocate(capacity)
        home = self.home(keys)
        order = np.argsort(home, kind="stable")
        live = live[order]
        keys = keys[order]
        i = np.arange(live.size)
        slots = np.maximum.accumulate(home[order] - i) + i
        fit = int(np.searchsorted(slots, capacity))  # slots is increasing
        head = slots[:fit]
        self.keys[head] = keys[:fit]
        self.flags[head] = old_flags[live[:fit]]  # LIVE before _claim: an INT64_MIN srid is live
        self._live = fit
        self._dead = 0
        if fit < live.size:
            wrapped = self._claim(keys[fit:], np.zeros(live.size - fit, np.intp))
            slots[fit:] = wrapped
            self.flags[wrapped] = old_flags[live[fit:]]
        self.value[slots] = old_value[live]
        self.offset[slots] = old_offset[live]
        self.deadline[slots] = old_deadline[live]
