"""librdkafka's logs and client errors, through Python ``logging``, each distinct one at most
once per interval.

An unreachable broker makes librdkafka report the same refused connection every few
milliseconds, from every client; the reports are counted and shown once per
``REPEAT_INTERVAL_S`` with the number held back, so the first one is never lost and the
log stays readable. Every client the broker creates carries ``client_logging()`` (through
``KafkaSettings.client_config``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from confluent_kafka import KafkaError

REPEAT_INTERVAL_S = 30.0

# librdkafka's own log lines ("FAIL [replaybroker#producer-1] ... Connect to ... failed")
LIBRDKAFKA = logging.getLogger("replaybroker.librdkafka")
log = logging.getLogger(__name__)

# The parts of a librdkafka line that change between repeats of one event.
# "... Connection refused (after 3ms in state CONNECT, 5 identical error(s) suppressed)"
_VARYING = re.compile(r"\s*\((?:after \d+ms in state|\d+ identical error).*\)$")


def without_timing(text: str) -> str:
    """A librdkafka message without the suffix that changes between its repeats."""
    return _VARYING.sub("", text)


class RepeatLimiter:
    """Admits each key at most once per ``interval_s``; counts what it holds back.

    ``admit(key)`` is None when the key was seen less than ``interval_s`` ago (a held-back
    repeat), else the number of repeats held back since it was last admitted (0 the first
    time). Pure: the clock is injected, so tests step it instead of sleeping."""

    def __init__(self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}
        self._lock = threading.Lock()  # clients report from the threads that poll them

    def admit(self, key: Hashable) -> int | None:
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)


class RepeatFilter(logging.Filter):
    """A logging filter that lets each distinct message through once per interval, and
    says how many repeats it held back."""

    def __init__(self, limiter: RepeatLimiter) -> None:
        super().__init__()
        self.limiter = limiter

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        held = self.limiter.admit((record.levelno, without_timing(message)))
        if held is None:
            return False
        if held:
            record.msg, record.args = f"{message} ({held} repeats in the last {self.limiter.interval_s:g}s not shown)", ()
        return True


_ERRORS = RepeatLimiter()
LIBRDKAFKA.addFilter(RepeatFilter(RepeatLimiter()))


def error_cb(err: KafkaError, limiter: RepeatLimiter = _ERRORS) -> None:
    """librdkafka's ``error_cb``: one log line per distinct error (code and text) per interval.

    Most of these are transient (a broker down, a connection refused) and librdkafka retries
    them by itself; the calls that need the cluster fail with their own error."""
    held = limiter.admit((err.code(), err.str()))
    if held is None:
        return
    more = f" ({held} repeats in the last {limiter.interval_s:g}s not shown)" if held else ""
    level = logging.ERROR if err.fatal() else logging.WARNING
    log.log(level, "Kafka client error: %s%s", err.str(), more)


def client_logging() -> dict[str, Any]:
    """The librdkafka settings that route a client's logs and errors into Python logging."""
    return {"logger": LIBRDKAFKA, "error_cb": error_cb}
