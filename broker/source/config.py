"""``SourceConfig``: how a source sends - timeouts, attempts, partitioners, serdes, back-off,
backpressure - and the checks of a timeout and of a number of attempts given per send."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Literal

from broker.errors import ConfigurationError
from broker.headers import AUTO
from broker.retry import DEFAULT_RETRY, RetryPolicy
from broker.schemas import MAX_ATTEMPTS
from broker.serde import BYTES, Serde

Timeout = int | Literal["auto"]
"""A record's timeout: ms, or ``"auto"`` - the acker gives the deadline from the completion
latency it sees for the topic (docs/design.md §6, *Adaptive timeouts*)."""


@dataclass(frozen=True)
class SourceConfig:
    timeout_ms: Timeout = 30_000
    max_attempts: int = 5
    # Data topic -> partitioner name ("kafka" or "spark"); unlisted topics use "kafka".
    partitioners: Mapping[str, str] = field(default_factory=dict)
    producer: Mapping[str, Any] = field(default_factory=dict)
    # Backpressure (Storm's max.spout.pending): at most this many of the source's records
    # pending (persisted, neither completed nor dead-lettered); a send waits for a slot up to
    # max_pending_timeout_ms, then raises BackpressureTimeout. None: no limit.
    max_pending: int | None = None
    max_pending_timeout_ms: int = 30_000
    # How send() turns a value that is not bytes into bytes (broker.serde): the default sends
    # str as UTF-8; JsonSerde(), AvroSerde("schema.avsc") serialize objects. ``serdes``: data
    # topic -> its own serde, over ``serde`` (an App's topics with a serde of their own).
    serde: Serde = BYTES
    serdes: Mapping[str, Serde] = field(default_factory=dict)
    # The back-off between attempts, carried in each persist record: the acker replays a
    # failed or timed-out attempt only once it has passed (docs/design.md §6). The default,
    # DEFAULT_RETRY, waits 0.5 s, 1 s, 2 s, ... (at most 30 s, jitter 0.2). None: at once.
    retry: RetryPolicy | None = DEFAULT_RETRY


def check_timeout(timeout: object) -> None:
    """A positive number of ms or "auto": a negative one would read as the auto marker in the
    persist record (``AUTO_TIMEOUT_MS``)."""
    if timeout != AUTO and (not isinstance(timeout, Integral) or isinstance(timeout, bool) or timeout <= 0):
        raise ConfigurationError(f"timeout_ms must be a positive number of ms or {AUTO!r}, not {timeout!r}")


def check_max_attempts(max_attempts: object) -> None:
    """1 to ``MAX_ATTEMPTS`` attempts: the acker quarantines a persist record outside them."""
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise ConfigurationError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}, not {max_attempts!r}")
