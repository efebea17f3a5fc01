"""The acker's settings."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ConfigurationError
from broker.ledger.adaptive import AdaptivePolicy


def default_instance_id() -> str:
    """Host name, process id and a random suffix: unique per process, so two ackers on one
    host never share a transactional id (each would fence the other, in a loop). Not stable
    across restarts: that takes an explicit ``instance_id`` (``--instance-id``)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class AckerConfig:
    commit_interval_ms: int = 100
    # A pending entry that had no event, mark or touch yet and the deadline of its persist
    # record is left out of the changelog (its persist record holds all of it; a restore
    # reads ns.persist from the restore floor, docs/design.md §5) for at most this long on
    # the acker's clock, then logged by the next commit, early or not: most trees complete
    # within it and never touch the changelog, while the floor stays at most this long
    # (and a commit interval) behind.
    unlogged_ms: int = 1_000
    orphan_ttl_ms: int = 60_000
    # After a timeout is replayed, the acker keeps the expired entry's XOR value (a WATCH
    # entry, in the changelog) this long, so that late events of the original attempt can
    # still complete it and mark the replay superseded (docs/design.md §6); at most
    # ``max_watches`` per ledger partition (those over it are not watched, and counted).
    # None: orphan_ttl_ms. 0 turns superseding off.
    watch_ms: int | None = None
    max_watches: int = 100_000
    tick_ms: int = 100
    batch_size: int = 20_000
    poll_timeout_ms: int = 20
    # Stable per instance: a restarted instance fences its predecessor and aborts its open
    # transaction at once, instead of waiting for transaction_timeout_ms. Empty: a fresh
    # default_instance_id() (unique, not stable), and instance_id_generated is set.
    instance_id: str = ""
    transaction_timeout_ms: int = 10_000
    replay_cache_entries: int = 20_000
    # Explicit failures are decided in windows that close this long after their first fail
    # mark arrived, all ledger partitions together and in the order of their records: fail
    # marks of one key travel through different ledger partitions, which Kafka does not
    # order among each other.
    fail_hold_ms: int = 150
    # Tail the changelog of every partition this instance does not own, so a takeover is
    # a catch-up read instead of a full restore (docs/design.md §5: standby replicas).
    standby: bool = False
    # Entries expire only once the acker has read its inputs up to the high watermark it saw
    # (broker.acker.lag); this many messages short of it counts as read. 0 is exact: the
    # position steps over transaction markers. More lets an entry time out while up to this
    # many unread messages could still complete it.
    expiry_lag_slack: int = 0
    # A failed record whose payload cannot be read from ns.persist waits in its table
    # (durably, see broker.ledger.table: deferred decisions) instead of holding up the
    # commit of everything else: it is read again after payload_retry_ms, doubling up to
    # payload_retry_max_ms, and dead-lettered without its value after payload_tries tries -
    # at once when the record is provably gone (below the log start, compacted away).
    payload_tries: int = 5
    # Payloads not in the cache are read from ns.persist in bulk, at most this many per
    # commit and for at most payload_fetch_timeout_ms: one commit must stay far inside
    # max.poll.interval.ms (60 s) however many records time out at once (a restart after
    # an outage: every payload cache is empty). The rest wait in their tables, durably,
    # and are decided by the next commits in persist order.
    max_fetches_per_commit: int = 2_000
    # At most this many replays a second per data topic (None: no limit), with a second's
    # worth as a burst: a replay over it waits in its table, durably and in its place
    # (deferred to its turn), instead of landing on a pipeline that is still fragile. Per
    # acker process: n ackers replay up to n times as many.
    replay_rate_per_s: float | None = None
    payload_fetch_timeout_ms: int = 10_000
    payload_retry_ms: int = 1_000
    payload_retry_max_ms: int = 30_000
    stats_interval_ms: int = 10_000
    # The group protocol of the acker's consumer group. "consumer" (KIP-848, Kafka >= 4.0):
    # the broker's ``range`` assignor keeps partition i of ns.persist and ns.acks on one
    # member and moves only the partitions that change owner, while the others keep
    # completing. "classic": the eager ``range`` assignor, for older clusters - every
    # membership change pauses every acker of the namespace.
    group_protocol: str = "consumer"
    # How long a member that stopped heartbeating (killed, partitioned away) keeps its
    # partitions. With the consumer protocol this is a setting of the GROUP, which the acker
    # sets at start (``consumer.session.timeout.ms``; the broker bounds it with
    # group.consumer.min/max.session.timeout.ms); with the classic one, of each client.
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    # With an explicit instance_id, join as a static member (``group.instance.id``): a
    # restarted instance gets its own partitions back and nobody else's move. Its
    # partitions wait for it up to session_timeout_ms after it stops, even a clean stop.
    static_membership: bool = True
    # librdkafka settings merged last into the acker's group consumer (e.g. a shorter
    # max.poll.interval.ms, so a stalled member is replaced sooner).
    consumer: Mapping[str, Any] = field(default_factory=dict)
    # Serve Prometheus metrics on this port (broker.metrics; 0: any free port, see
    # Acker.metrics_server.port); None: no HTTP server.
    metrics_port: int | None = None
    # Adaptive timeouts (a source's timeout "auto", docs/design.md §6): a record registered
    # now gets now + clamp(p99.9 of its topic's recent completion latencies x safety factor,
    # floor, ceiling); the initial timeout (None: the ceiling) while the window holds fewer
    # than adaptive_min_samples latencies. The window forgets a latency after
    # adaptive_window_ms. The estimate is not persisted: a new owner learns it again.
    adaptive_floor_ms: int = 1_000
    adaptive_ceiling_ms: int = 300_000
    adaptive_safety_factor: float = 3.0
    adaptive_quantile: float = 0.999
    adaptive_initial_ms: int | None = None
    adaptive_min_samples: int = 500
    adaptive_window_ms: int = 20_000
    # Timed-out auto records raise the estimate (as latencies of at least their timeout) only
    # while they are more than this share of the topic's records in the window: a slow-down,
    # not the odd record a task dropped.
    adaptive_timeout_share: float = 0.01
    # Timings of the service loop. A rebalance callback restores its partitions for up to
    # assign_restore_ms and leaves the rest to the loop, which gives a restore as long as the
    # last commit took, between restore_slice_ms and restore_slice_max_ms (about half the loop:
    # broker.acker.assignment.restore_slice). A quiet acker skips its commits for up to
    # quiet_recheck_ms (Acker.commit); it waits rejoin_backoff_ms before joining its group again
    # after losing it. A send_offsets_to_transaction is given offsets_timeout_ms, and waited
    # for left_behind_ms more before its producer is left behind (librdkafka #5456).
    assign_restore_ms: int = 50
    restore_slice_ms: int = 50
    restore_slice_max_ms: int = 1_000
    quiet_recheck_ms: int = 1_000
    rejoin_backoff_ms: int = 1_000
    offsets_timeout_ms: int = 30_000
    left_behind_ms: int = 5_000
    # False folds without transactions: ONLY to show what breaks (tests); never in production.
    exactly_once: bool = True
    instance_id_generated: bool = field(default=False, init=False, compare=False)

    @property
    def adaptive(self) -> AdaptivePolicy:
        return AdaptivePolicy(
            floor_ms=self.adaptive_floor_ms, ceiling_ms=self.adaptive_ceiling_ms,
            safety_factor=self.adaptive_safety_factor, quantile=self.adaptive_quantile,
            initial_ms=self.adaptive_initial_ms, min_samples=self.adaptive_min_samples,
            window_ms=self.adaptive_window_ms, timeout_share=self.adaptive_timeout_share,
        )

    @property
    def watch_for_ms(self) -> int:
        """How long a replayed timeout is watched: ``watch_ms``, or the orphan TTL when unset."""
        return self.orphan_ttl_ms if self.watch_ms is None else self.watch_ms

    @property
    def static(self) -> bool:
        """Whether the acker joins its group as a static member."""
        return self.static_membership and not self.instance_id_generated

    def __post_init__(self) -> None:
        if self.replay_rate_per_s is not None and not (
            isinstance(self.replay_rate_per_s, (int, float)) and 0 < self.replay_rate_per_s < float("inf")
        ):
            raise ConfigurationError(f"replay_rate_per_s must be a positive number or None, not {self.replay_rate_per_s!r}")
        if self.group_protocol not in ("consumer", "classic"):
            raise ConfigurationError(f"group_protocol must be 'consumer' or 'classic', not {self.group_protocol!r}")
        try:
            self.adaptive  # noqa: B018 - checks the adaptive settings
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        if not self.instance_id:
            object.__setattr__(self, "instance_id", default_instance_id())
            object.__setattr__(self, "instance_id_generated", True)
