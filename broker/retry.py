"""How long to wait before trying again: ``RetryPolicy`` (exponential back-off with jitter).

Used by a task waiting out a dependency's outage (``TaskConfig.outage_retry``). The n-th wait
is ``initial_ms * multiplier ** (n - 1)``, at most ``max_ms``, spread by ``jitter`` (a
fraction: 0.2 waits 80 % to 120 % of it) so that many waiters do not come back together.
A setting that makes no sense is refused when the policy is built.

A task may also say how long one failure waits (``ctx.fail(retry_after_ms=...)``: a rate limit's
``Retry-After``, a resource known to be back at a given time): that delay replaces the policy's
for that failure, bounded by ``MAX_RETRY_AFTER_MS``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from broker.errors import ConfigurationError

__all__ = ["DEFAULT_RETRY", "MAX_RETRY_AFTER_MS", "RetryPolicy", "checked_retry_after_ms"]

# 24 h. A failed record waits in the acker's ledger, its persist record kept, until its replay:
# a longer wait is a schedule, not a retry, and would outlive the persist topic's retention.
MAX_RETRY_AFTER_MS = 86_400_000


def checked_retry_after_ms(ms: object) -> int:
    """``ms`` as a retry-after, or ValueError: a whole number of ms from 0 (replay at once, the
    policy notwithstanding) to ``MAX_RETRY_AFTER_MS``."""
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= MAX_RETRY_AFTER_MS:
        raise ValueError(f"retry_after_ms must be a whole number of ms from 0 to {MAX_RETRY_AFTER_MS} (24 h), not {ms!r}")
    return ms


@dataclass(frozen=True)
class RetryPolicy:
    initial_ms: int = 200
    multiplier: float = 2.0
    max_ms: int = 5_000
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.initial_ms, int) or isinstance(self.initial_ms, bool) or self.initial_ms <= 0:
            raise ConfigurationError(f"RetryPolicy.initial_ms must be a positive number of ms, not {self.initial_ms!r}")
        if not isinstance(self.max_ms, int) or isinstance(self.max_ms, bool) or self.max_ms < self.initial_ms:
            raise ConfigurationError(
                f"RetryPolicy.max_ms must be a number of ms at least initial_ms ({self.initial_ms}), not {self.max_ms!r}"
            )
        if not (isinstance(self.multiplier, (int, float)) and math.isfinite(self.multiplier) and self.multiplier >= 1):
            raise ConfigurationError(f"RetryPolicy.multiplier must be at least 1, not {self.multiplier!r}")
        if not (isinstance(self.jitter, (int, float)) and 0 <= self.jitter <= 1):
            raise ConfigurationError(f"RetryPolicy.jitter must be a fraction from 0 to 1, not {self.jitter!r}")

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """The wait before try ``attempt + 1`` (``attempt`` >= 1: the tries so far)."""
        exponent = max(0, attempt - 1)
        # min() before the power would overflow a float: the cap is reached long before.
        base = self.max_ms if exponent > 64 else min(self.max_ms, self.initial_ms * self.multiplier**exponent)
        if self.jitter:
            base *= 1 + self.jitter * (2 * (rng or random).random() - 1)
        return max(1, round(base))


# A source's back-off unless it sets its own (``SourceConfig.retry``): 0.5 s, 1 s, 2 s, ... at
# most 30 s, so a failure that is over in a moment costs little and one that lasts does not burn
# every attempt at once.
DEFAULT_RETRY = RetryPolicy(initial_ms=500, multiplier=2.0, max_ms=30_000, jitter=0.2)
