"""Rejoining the group after a fatal error of the group consumer, and how long to wait.

A static member (``group.instance.id``) that was killed keeps its place in the group until
its session times out. Its successor with the same instance id is refused meanwhile:
librdkafka reports the broker's UNRELEASED_INSTANCE_ID (the consumer protocol) or
FENCED_INSTANCE_ID (the classic one) as a fatal error, and a consumer that had one is
unusable - the acker replaces it (``Recovery.rejoin``). That refusal is expected after every
restart, not an error: the acker waits it out with exponential back-off, capped at half the
session timeout (the predecessor's session ends within one), and says so in one line per
wait period, not per attempt.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from confluent_kafka import KafkaError

from broker.acker.config import AckerConfig
from broker.kafka_errors import Meaning, codes, means
from broker.kafka_io import consumer_protocol_refused, protocol_refused_text
from broker.kafka_log import LIBRDKAFKA, RepeatFilter, RepeatLimiter, error_cb

__all__ = [
    "GROUP_CLIENT_LOG", "INSTANCE_IN_USE", "Rejoins", "classic", "consumer_protocol_refused",
    "group_client_logging", "instance_in_use",
]

log = logging.getLogger("broker.acker")

INSTANCE_IN_USE = tuple(sorted(codes(Meaning.INSTANCE_IN_USE)))
# A fatal error reaches poll() as _FATAL; what caused it is only in its text, the
# description of the broker's error ("Fatal consumer error: Broker: The instance ID is
# still used by another member in the consumer group").
_IN_USE_TEXTS = tuple(KafkaError(code).str() for code in INSTANCE_IN_USE)


def classic(config: AckerConfig, group: str, why: str) -> AckerConfig:
    """``config`` with the classic group protocol (the client-side range assignor gives the
    same co-partitioned assignment; eager: a rebalance moves every partition), said in one
    line. A copy: the caller's config stays as it was."""
    log.warning(
        "%s: the acker joins %s with the classic group protocol and the range assignor "
        "(--group-protocol classic says so and skips this check)", why, group,
    )
    out = copy.copy(config)
    object.__setattr__(out, "group_protocol", "classic")  # frozen
    return out


def instance_in_use(err: KafkaError) -> bool:
    """Whether the group refused this member because its instance id is still another's."""
    return means(err, Meaning.INSTANCE_IN_USE) or _in_use_text(err.str())


def _in_use_text(text: str) -> bool:
    return any(t in text for t in _IN_USE_TEXTS)


class _RefusalsAtDebug(logging.Filter):
    """librdkafka logs every refusal of the member as FATAL (CRITICAL), from a new client each
    time: the acker's own line (per wait period, or for the fallback) says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _in_use_text(message) or protocol_refused_text(message):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return GROUP_CLIENT_LOG.isEnabledFor(logging.DEBUG)
        return True


# The group consumer's librdkafka log; otherwise like every client's (broker.kafka_log).
GROUP_CLIENT_LOG = LIBRDKAFKA.getChild("acker_group")
GROUP_CLIENT_LOG.addFilter(_RefusalsAtDebug())
GROUP_CLIENT_LOG.addFilter(RepeatFilter(RepeatLimiter()))


def _group_error_cb(err: KafkaError) -> None:
    if instance_in_use(err) or consumer_protocol_refused(err):
        log.debug("group consumer refused: %s", err.str())
        return
    error_cb(err)


def group_client_logging() -> dict[str, Any]:
    """The acker's group consumer's ``logger`` and ``error_cb``: a refusal of its instance id
    or of the consumer protocol at DEBUG, everything else as for every client."""
    return {"logger": GROUP_CLIENT_LOG, "error_cb": _group_error_cb}


class Rejoins:
    """The waits before each new group consumer, and the count of refusals waited out."""

    def __init__(self, first_s: float, session_timeout_ms: int, instance: str) -> None:
        self.first_s = first_s
        self.cap_s = max(first_s, session_timeout_ms / 2000)
        self.instance = instance
        self.in_use = 0  # refusals for an instance id still in use, over all wait periods
        self.periods = 0  # wait periods (one log line each)
        self._next_s: float | None = None  # the next wait of the current period (None: none)

    def wait_after(self, err: KafkaError | None, owned: bool) -> float:
        """How long to wait before joining again after ``err`` (None: not the consumer's
        error). ``owned``: the consumer had partitions - a refusal after that starts a new
        wait period."""
        if err is None or not instance_in_use(err):
            self._next_s = None
            if err is not None:
                log.error(
                    "group consumer failed (%s); everything it owned is dropped, joining again in %.1fs",
                    err.str(), self.first_s,
                )
            return self.first_s
        self.in_use += 1
        if self._next_s is None or owned:
            self.periods += 1
            self._next_s = self.first_s
            log.warning(
                "instance id %s is still a member of the group (a previous instance whose session has not "
                "expired yet, or another process with this instance id): joining again with back-off "
                "up to %.1fs until it is released",
                self.instance, self.cap_s,
            )
        wait, self._next_s = self._next_s, min(self._next_s * 2, self.cap_s)
        log.debug("instance id %s still in use (refusal %d): joining again in %.1fs", self.instance, self.in_use, wait)
        return wait
