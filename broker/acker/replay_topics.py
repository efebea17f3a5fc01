"""The partition counts of the replay topics, looked up beside the acker's loop, never in it.

A decision to replay needs the partition count of ``<topic>.replay`` (a key-hash partition
that is not one of it, or a topic that is missing, sends the record to the DLQ with that
reason), and so does the registration of a record of a new data topic (its placement is
checked: broker.acker.domain). The lookup asks the cluster's metadata and retries it for
``start_wait_s`` when the cluster does not answer: in the loop it would stop every partition's
commits for as long. So a lookup runs on a thread of its own; the loop waits for its answer at
most ``ANSWER_WAIT_S`` (a cluster that answers is seen at once), and until it is in:

- a decision that needs it is deferred (``Decider``: ``fate.DEFERRED``, at the next commit);
- a registration does not check the placement (the replay's decision checks it then).

A count is kept; a missing topic is looked up again after ``MISSING_RECHECK_S`` (it may have
been created since), and ``forget`` drops a count the broker contradicted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from broker.topics import replay_topic

log = logging.getLogger(__name__)

MISSING_RECHECK_S = 60.0
ANSWER_WAIT_S = 0.05


class Unknown:
    """Not known yet: the lookup has not answered."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = Unknown()


class ReplayTopics:
    """Replay topic -> its partition count (None: it does not exist), as last answered."""

    __slots__ = ("_counts", "_lookup", "_max_age_s", "_pending")

    def __init__(self, lookup: Callable[[list[str]], Mapping[str, int | None]], max_age_s: float | None = None) -> None:
        """``max_age_s``: a count older than this is looked up again at its next use, the old
        one answered until the new one is in (None: a count stands until ``forget``, a missing
        topic's for ``MISSING_RECHECK_S``)."""
        self._lookup = lookup
        self._max_age_s = max_age_s
        self._counts: dict[str, tuple[int | None, float]] = {}  # name -> (count, when answered)
        self._pending: dict[str, Future[Mapping[str, int | None]]] = {}

    def partitions(self, topic: str) -> int | Unknown | None:
        """The partition count of ``topic``'s replay topic (None: it does not exist), or
        ``UNKNOWN`` while the lookup has not answered; never waits longer than
        ``ANSWER_WAIT_S``."""
        return self.count(replay_topic(topic))

    def count(self, name: str) -> int | Unknown | None:
        """The partition count of topic ``name``, as ``partitions``."""
        cached = self._counts.get(name)
        if cached is not None and not self._stale(*cached):
            return cached[0]
        # While a count known before is looked up again, it stands (a missing topic's only
        # with ``max_age_s``: else it is asked again as not known).
        standing: int | Unknown | None = UNKNOWN
        if cached is not None and (cached[0] is not None or self._max_age_s is not None):
            standing = cached[0]
        future = self._pending.get(name)
        if future is None:
            future = self._pending[name] = self._start(name)
            try:
                future.result(timeout=ANSWER_WAIT_S)
            except TimeoutError:
                if standing is UNKNOWN:
                    log.warning("no metadata for %s yet: its decisions wait for it", name)
            except Exception:  # noqa: BLE001 - its outcome is read below
                pass
        if not future.done():
            return standing
        del self._pending[name]
        try:
            count = future.result()[name]
        except Exception as exc:  # noqa: BLE001 - a lookup that failed is asked again at the next use
            log.warning("looking up %s failed (%s): asked again at its next use", name, exc)
            return standing
        if count is None:
            log.error("replay topic %s does not exist: its records go to the DLQ", name)
        self._counts[name] = (count, time.monotonic())
        return count

    def _stale(self, count: int | None, when: float) -> bool:
        age = time.monotonic() - when
        if self._max_age_s is not None:
            return age >= self._max_age_s
        return count is None and age >= MISSING_RECHECK_S

    def _start(self, name: str) -> Future[Mapping[str, int | None]]:
        """Look ``name`` up on a daemon thread (one that hangs must not hold up the exit)."""
        future: Future[Mapping[str, int | None]] = Future()

        def run() -> None:
            try:
                future.set_result(self._lookup([name]))
            except BaseException as exc:  # noqa: BLE001 - handed to the loop through the future
                future.set_exception(exc)

        threading.Thread(target=run, name=f"lookup {name}", daemon=True).start()
        return future

    def known(self, topic: str) -> int | None:
        """The count if it is known now (None: missing or not known yet) - for a check that
        may be left to a later one."""
        count = self.partitions(topic)
        return None if isinstance(count, Unknown) else count

    def forget(self, name: str) -> None:
        """Look replay topic ``name`` up again at its next use: the broker called it unknown."""
        self._counts.pop(name, None)
