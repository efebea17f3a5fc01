"""Adaptive timeouts: a streaming quantile of completion latency per source topic, and the
deadlines it gives (docs/design.md §6, *Adaptive timeouts*). Pure: arrays and a clock value
in, timeouts out; nothing reads a clock or does I/O.

Why a histogram of log buckets over a sliding window
----------------------------------------------------
A fixed timeout must be sized for the worst latency a pipeline ever shows, so a record whose
task dropped it waits that long to be replayed. An adaptive one follows what completions take
now: ``timeout = clamp(quantile x safety_factor, floor, ceiling)``. The acker folds events
by the array, so the estimator takes whole arrays of latencies (one ``bincount`` per
batch), and its memory is fixed: ``slots x BUCKETS`` int64 counts per topic (8 x 256 x 8 B =
16 KiB), whatever the rate. Buckets are logarithmic, ``BUCKETS_PER_DOUBLING`` per power of
two (each 9 % wide), 1 ms to 2^32 ms; the quantile is read as its bucket's *upper* edge, never
below the true sample quantile. The window is ``slots`` buckets of time that rotate: a sample
is forgotten ``window_ms`` after it was added, so a latency that drops is followed within one
window; one that rises is followed as soon as a tail of slow completions shows, within a
commit. With fewer than ``min_samples`` in the window the estimate is not trusted and the
initial timeout applies.

Timeouts are samples too, censored ones: a record that timed out took at least its timeout.
Without them a slow-down that outruns the estimate would never be seen - every slow record
times out, only the fast ones complete - and its replays would time out as well, up to the
DLQ. With all of them, one dropped record (a task bug, not slowness) in 1 000 would become the
p99.9 and multiply the next timeouts by the safety factor, again with each drop. So they are
kept apart and count only while they are more than ``timeout_share`` of the topic's records
in the window: slowness, not the odd drop.

Where latencies come from
-------------------------
The table keeps no registration time (4 B per entry would break the memory budget of
docs/design.md §9). ``AutoRegistrations`` keeps, per ledger partition, one run per batch of
persist records registered (and per change of topic inside it): its first persist offset, the
acker's clock at registration and the topic's id - entries of one batch share their time, and
an entry's persist offset (a column of the table) finds its run by binary search. Runs below
the oldest pending entry are dropped at each commit, so the structure is bounded by the
batches in flight, not by the entries. An entry restored from the changelog has no run: its
completion is no sample (a new owner learns again).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BUCKETS_PER_DOUBLING = 8
_DOUBLINGS = 32
BUCKETS = BUCKETS_PER_DOUBLING * _DOUBLINGS  # 1 ms .. 2^32 ms
MAX_TOPICS = 1_024
"""Topics with an estimate of their own; later ones share one (``OTHER_TOPICS``): the topic is
read from a header, and a stream of made-up names must not grow the acker without bound."""
OTHER_TOPICS = "*"
_OTHER = OTHER_TOPICS.encode()


def bucket_of(latency_ms: np.ndarray) -> np.ndarray:
    """Bucket index of each latency (ms); below 1 ms counts as 1 ms."""
    x = np.clip(np.asarray(latency_ms, dtype=np.float64), 1.0, 2.0**_DOUBLINGS - 1)
    return np.minimum((np.log2(x) * BUCKETS_PER_DOUBLING).astype(np.intp), BUCKETS - 1)


def upper_edge_ms(bucket: int) -> float:
    """The largest latency bucket ``bucket`` holds."""
    return float(2.0 ** ((bucket + 1) / BUCKETS_PER_DOUBLING))


class LatencyWindow:
    """Counts of latencies per log bucket over the last ``window_ms``, in ``slots`` rotating
    slices of time; see the module doc."""

    def __init__(self, window_ms: int = 20_000, slots: int = 10) -> None:
        if slots < 1 or window_ms < slots:
            raise ValueError("a latency window needs at least one slot of at least 1 ms")
        self.slots = slots
        self.slot_ms = window_ms // slots
        self.counts = np.zeros((slots, BUCKETS), dtype=np.int64)
        self._slot: int | None = None  # absolute slot number (now_ms // slot_ms) of the head

    def _advance(self, now_ms: int) -> None:
        """Clear the slots that time left behind; a clock that went back changes nothing."""
        s = now_ms // self.slot_ms
        if self._slot is None:
            self._slot = s
            return
        if s <= self._slot:
            return
        for k in range(1, min(s - self._slot, self.slots) + 1):
            self.counts[(self._slot + k) % self.slots] = 0
        self._slot = s

    def add(self, latencies_ms: np.ndarray, now_ms: int) -> None:
        """Count a batch of latencies at time ``now_ms``."""
        lat = np.asarray(latencies_ms).reshape(-1)
        self._advance(now_ms)
        if lat.size:
            assert self._slot is not None
            self.counts[self._slot % self.slots] += np.bincount(bucket_of(lat), minlength=BUCKETS)

    def merged(self, other: LatencyWindow) -> LatencyWindow:
        """A new window holding both windows' counts (both advanced to the same time)."""
        both = LatencyWindow(self.slots * self.slot_ms, self.slots)
        both.counts = self.counts + other.counts
        both._slot = self._slot
        return both

    def samples(self, now_ms: int) -> int:
        """Latencies in the window at ``now_ms``."""
        self._advance(now_ms)
        return int(self.counts.sum())

    def quantile(self, q: float, now_ms: int) -> float | None:
        """The ``q``-quantile of the window's latencies as the upper edge of its bucket (None:
        empty): at or above the sample quantile, by at most one bucket (9 %)."""
        self._advance(now_ms)
        cum = np.cumsum(self.counts.sum(axis=0))
        n = int(cum[-1])
        if n == 0:
            return None
        rank = max(1, int(np.ceil(q * n)))  # the rank-th smallest sample
        return upper_edge_ms(int(np.searchsorted(cum, rank)))


@dataclass(frozen=True)
class AdaptivePolicy:
    """How an adaptive deadline is computed (``AckerConfig.adaptive_*``)."""

    floor_ms: int = 1_000
    ceiling_ms: int = 300_000
    safety_factor: float = 3.0
    quantile: float = 0.999
    # The timeout while a topic has fewer than min_samples in its window (None: the ceiling).
    initial_ms: int | None = None
    min_samples: int = 500
    window_ms: int = 20_000
    slots: int = 10
    # Timeouts raise the estimate while they are more than this share of the window's records.
    timeout_share: float = 0.01

    def __post_init__(self) -> None:
        if not 0 < self.floor_ms <= self.ceiling_ms:
            raise ValueError(f"adaptive floor {self.floor_ms} ms and ceiling {self.ceiling_ms} ms: need 0 < floor <= ceiling")
        if not 0.0 < self.quantile < 1.0 or self.safety_factor <= 0:
            raise ValueError("adaptive quantile must be in (0, 1) and the safety factor positive")

    @property
    def initial(self) -> int:
        return self.ceiling_ms if self.initial_ms is None else self.initial_ms

    def clamp(self, quantile_ms: float) -> int:
        return int(min(self.ceiling_ms, max(self.floor_ms, np.ceil(quantile_ms * self.safety_factor))))


@dataclass(frozen=True)
class Estimate:
    """One topic's figures, for the stats line and the metrics."""

    samples: int  # in the window (timeouts included while they count)
    quantile_ms: float | None  # None: fewer than min_samples, the initial timeout applies
    timeout_ms: int
    given: int  # deadlines given adaptively for this topic by this acker


class AdaptiveTimeouts:
    """Per source topic: a latency window and the timeout it gives. One per acker process:
    latency does not depend on the ledger partition, so its partitions share the estimate."""

    def __init__(self, policy: AdaptivePolicy | None = None) -> None:
        self.policy = policy or AdaptivePolicy()
        self._ids: dict[bytes, int] = {}
        self.names: list[str] = []
        self._windows: list[LatencyWindow] = []
        self._timeouts: list[LatencyWindow] = []  # censored samples, apart (module doc)
        self._given: list[int] = []

    def topic_id(self, topic: bytes) -> int:
        """The id of a source topic (its name as the persist header carries it)."""
        tid = self._ids.get(topic)
        if tid is None:
            if len(self.names) >= MAX_TOPICS and topic != _OTHER:
                return self.topic_id(_OTHER)
            tid = self._ids[topic] = len(self.names)
            self.names.append(topic.decode("utf-8", "replace"))
            self._windows.append(LatencyWindow(self.policy.window_ms, self.policy.slots))
            self._timeouts.append(LatencyWindow(self.policy.window_ms, self.policy.slots))
            self._given.append(0)
        return tid

    def _window(self, tid: int, now_ms: int) -> LatencyWindow:
        """The topic's completions, and its timeouts too while they are more than
        ``timeout_share`` of its records (module doc)."""
        done, late = self._windows[tid], self._timeouts[tid]
        n_late = late.samples(now_ms)
        if n_late and n_late > self.policy.timeout_share * (n_late + done.samples(now_ms)):
            return done.merged(late)
        return done

    def timeout_ms(self, tid: int, now_ms: int) -> int:
        """The timeout a record of topic ``tid`` registered now gets."""
        window = self._window(tid, now_ms)
        if window.samples(now_ms) < self.policy.min_samples:
            return self.policy.initial
        q = window.quantile(self.policy.quantile, now_ms)
        return self.policy.initial if q is None else self.policy.clamp(q)

    def deadlines(self, tids: np.ndarray, now_ms: int) -> np.ndarray:
        """``now + timeout`` (ms, int64) for records of topics ``tids`` registered now; counts
        them as given. One estimate per distinct topic, not per record."""
        out = np.empty(tids.size, dtype=np.int64)
        for tid in np.unique(tids).tolist():
            mine = tids == tid
            out[mine] = now_ms + self.timeout_ms(tid, now_ms)
            self._given[tid] += int(np.count_nonzero(mine))
        return out

    def observe(self, tids: np.ndarray, latencies_ms: np.ndarray, now_ms: int, *, timed_out: bool = False) -> None:
        """Add completion latencies of records of topics ``tids`` (``timed_out``: the records
        timed out after these latencies - censored samples)."""
        if tids.size == 0:
            return
        windows = self._timeouts if timed_out else self._windows
        for tid in np.unique(tids).tolist():
            windows[tid].add(latencies_ms[tids == tid], now_ms)

    def observe_offsets(
        self, runs: AutoRegistrations, offsets: np.ndarray, now_ms: int, *, timed_out: bool = False
    ) -> int:
        """Entries of one ledger partition left the table at ``now_ms``, completed or (with
        ``timed_out``) timed out; their latencies since registration are added by topic.
        Returns how many were auto entries with a known registration time."""
        if not len(runs) or offsets.size == 0:
            return 0
        tids, ms = runs.lookup(offsets)
        auto = tids >= 0
        n = int(np.count_nonzero(auto))
        if n:
            self.observe(tids[auto], now_ms - ms[auto], now_ms, timed_out=timed_out)
        return n

    def estimates(self, now_ms: int) -> dict[str, Estimate]:
        out = {}
        for tid, name in enumerate(self.names):
            window = self._window(tid, now_ms)
            samples = window.samples(now_ms)
            q = window.quantile(self.policy.quantile, now_ms) if samples >= self.policy.min_samples else None
            out[name] = Estimate(samples, q, self.timeout_ms(tid, now_ms), self._given[tid])
        return out

    def summary(self, now_ms: int) -> str:
        """One token per topic for the acker's stats line:
        ``topic:p99.9=<ms|->,timeout=<ms>,n=<samples>,given=<count>``."""
        pct = f"p{self.policy.quantile * 100:g}"
        return " ".join(
            f"{name}:{pct}={'-' if e.quantile_ms is None else round(e.quantile_ms)},"
            f"timeout={e.timeout_ms},n={e.samples},given={e.given}"
            for name, e in self.estimates(now_ms).items()
        )


class AutoRegistrations:
    """One ledger partition's registration runs of auto entries: ``(first persist offset,
    registration ms, topic id)``, in offset order; see the module doc. A run with topic id
    -1 holds records with a fixed timeout (they end the run before them)."""

    def __init__(self) -> None:
        self._starts = np.empty(16, np.int64)
        self._ms = np.empty(16, np.int64)
        self._tids = np.empty(16, np.int32)
        self._n = 0
        self._end = -1  # one past the last offset noted: a rewind's second read is ignored

    def __len__(self) -> int:
        return self._n

    def note(self, offsets: np.ndarray, tids: np.ndarray, ms: int) -> None:
        """Persist records at ``offsets`` (ascending) of topics ``tids`` (-1: not auto) were
        registered at ``ms``. Costs nothing while no auto record was ever seen."""
        keep = offsets >= self._end
        offsets, tids = offsets[keep], tids[keep]
        if offsets.size == 0 or (self._n == 0 and not (tids >= 0).any()):
            return
        self._end = int(offsets[-1]) + 1
        first = np.concatenate(([0], np.flatnonzero(tids[1:] != tids[:-1]) + 1))
        starts, run_tids = offsets[first], tids[first].astype(np.int32)
        if self._n and run_tids[0] < 0 and self._tids[self._n - 1] < 0:
            starts, run_tids = starts[1:], run_tids[1:]  # continues a run of fixed records
        k = starts.size
        if self._n + k > self._starts.size:
            size = max(2 * self._starts.size, self._n + k)
            self._starts = np.resize(self._starts, size)
            self._ms = np.resize(self._ms, size)
            self._tids = np.resize(self._tids, size)
        self._starts[self._n : self._n + k] = starts
        self._ms[self._n : self._n + k] = ms
        self._tids[self._n : self._n + k] = run_tids
        self._n += k

    def lookup(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Topic id (-1: not auto, or unknown) and registration ms of the entries at ``offsets``."""
        i = np.searchsorted(self._starts[: self._n], offsets, side="right") - 1
        known = i >= 0
        j = np.maximum(i, 0)
        return np.where(known, self._tids[j], -1), self._ms[j]

    def drop_below(self, offset: int) -> None:
        """Forget the runs that end before ``offset``, the oldest pending entry's (-1: nothing
        pending, every run goes)."""
        if offset < 0:
            self._n = 0
            return
        i = int(np.searchsorted(self._starts[: self._n], offset, side="right")) - 1
        if i > 0:
            n = self._n - i
            self._starts[:n] = self._starts[i : self._n]
            self._ms[:n] = self._ms[i : self._n]
            self._tids[:n] = self._tids[i : self._n]
            self._n = n

    @property
    def nbytes(self) -> int:
        return int(self._starts.nbytes + self._ms.nbytes + self._tids.nbytes)
