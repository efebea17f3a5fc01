"""A source's sends (``RecordSender``: ``Source.send``, ``send_many`` and ``resend`` go
through it): fresh ids drawn in bulk, with their encodings; the persist record's timeout
field; the persist and the data record of each record sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
from confluent_kafka import KafkaException

from broker import ids, kafka_io
from broker.delivery import PendingData, SendFailure
from broker.errors import DeliveryError
from broker.headers import AUTO_TIMEOUT_MS, H_TRACKING, Headers, Tracking, as_bytes, user_headers
from broker.retry import RetryPolicy
from broker.schemas import (
    Failure,
    FirstAttempts,
    avro_headers,
    encode_first_persisted,
    encode_persisted,
    first_attempt_ids,
)
from broker.source.backpressure import Backpressure
from broker.source.config import SourceConfig, Timeout, check_max_attempts, check_timeout
from broker.source.placement import BATCH_KEYS, Placements

IdPair = tuple[int, int, bytes, bytes, bytes, tuple[str, bytes]]
"""A first send's srid and record id, the srid's 8-byte key, both ids' keys one after the
other (the persist value's first 16 bytes, and a first attempt's ``rb-t``: its tracking),
the record's first Avro fields (``schemas.first_attempt_ids``) and its tracking header."""

# Fresh ids drawn in bulk, two per send, with all their encodings (numpy for a whole pool):
# a send encodes none of its ids itself. The pool is a zip over the columns: a draw is one
# ``next``, atomic (threads never share an entry), and the zip reuses its tuple once the
# caller has unpacked it (nothing allocated per draw). A forked child starts empty (it must
# not reuse its parent's ids: the same ids in two processes would cancel in the ledger).
_ID_POOL: Iterator[IdPair] = iter(())
_POOL_PAIRS = 4096
# A keyed record's srid is drawn in its key's ledger partition (``ids.in_partitions``): one
# pool per (P, ledger partition), refilled in bulk like the other, smaller as P grows so that
# all of them together hold about ``_RESIDUE_PAIRS`` pairs.
_RESIDUE_POOLS: dict[int, list[Iterator[IdPair]]] = {}
_RESIDUE_PAIRS = 65_536


def _empty_pool() -> None:
    global _ID_POOL
    _ID_POOL = iter(())
    _RESIDUE_POOLS.clear()


os.register_at_fork(after_in_child=_empty_pool)


def _pairs(srids: np.ndarray, record_ids: np.ndarray) -> Iterator[IdPair]:
    # Big-endian keys, one bytes object per element of a void view (a bytes view, "S",
    # would strip trailing zero bytes): srid, then srid and record id (16 bytes per pair).
    tracking = np.stack([srids, record_ids], axis=1).astype(">i8").view("V16").ravel().tolist()
    return zip(
        srids.tolist(), record_ids.tolist(), srids.astype(">i8").view("V8").tolist(), tracking,
        first_attempt_ids(srids, record_ids), zip(repeat(H_TRACKING), tracking), strict=True,
    )


def _refill() -> None:
    global _ID_POOL
    fresh = ids.new_ids(2 * _POOL_PAIRS)
    _ID_POOL = _pairs(fresh[0::2], fresh[1::2])


def new_id_pair() -> IdPair:
    """A fresh srid in any ledger partition (a keyless record's) and a record id."""
    pair = next(_ID_POOL, None)
    while pair is None:  # (another thread may empty a fresh pool first)
        _refill()
        pair = next(_ID_POOL, None)
    return pair


BATCH_IDS = 64
"""From this many records, a batch's ids are drawn together (``draw_pairs``) when P is over
``POOLED_PARTITIONS``: one numpy pass has a fixed cost that a smaller batch does not repay."""
POOLED_PARTITIONS = 64
"""Up to this P, ids come from a pool per ledger partition (``new_id_pair_in``), each refilled
with at least 1 024 pairs: as cheap per id as one pool."""


def draw_pairs(ledger_partitions: list[int], partitions: int) -> Iterator[IdPair]:
    """A fresh id pair per record, its srid in ``ledger_partitions[i]`` of ``partitions``
    (-1: any), in order."""
    n = len(ledger_partitions)
    if n < BATCH_IDS or partitions <= POOLED_PARTITIONS:
        pools = residue_pools(partitions)
        return iter([(next(pools[lp], None) or new_id_pair_in(pools, lp)) if lp >= 0 else new_id_pair()
                     for lp in ledger_partitions])
    fresh = ids.new_ids(2 * n)
    srids, wanted = fresh[0::2], np.array(ledger_partitions, np.int64)
    srids = np.where(wanted < 0, srids, ids.in_partitions(srids, wanted, partitions))
    return _pairs(srids, fresh[1::2])


def residue_pools(partitions: int) -> list[Iterator[IdPair]]:
    """The pools of ``new_id_pair_in`` for ``partitions`` ledger partitions, by partition: a
    batch looks them up once."""
    pools = _RESIDUE_POOLS.get(partitions)
    if pools is None:
        pools = _RESIDUE_POOLS[partitions] = [iter(()) for _ in range(partitions)]
    return pools


def new_id_pair_in(pools: list[Iterator[IdPair]], partition: int) -> IdPair:
    """A fresh srid in ledger ``partition`` (``srid mod P``; ``pools`` from
    ``residue_pools(P)``) and a record id."""
    pair = next(pools[partition], None)
    while pair is None:
        n = max(16, min(_POOL_PAIRS, _RESIDUE_PAIRS // len(pools)))
        fresh = ids.new_ids(2 * n)
        pools[partition] = _pairs(ids.in_partitions(fresh[0::2], partition, len(pools)), fresh[1::2])
        pair = next(pools[partition], None)
    return pair


_SHARED: dict[tuple[int, int, int, str, RetryPolicy | None], FirstAttempts] = {}


def first_attempts(
    created_ms: int, timeout_ms: int, max_attempts: int, partitioner: str, retry: RetryPolicy | None = None,
) -> FirstAttempts:
    """``FirstAttempts.of``: the same for every record a source sends within one millisecond
    (``Source.send`` too), so the last few are kept."""
    key = (created_ms, timeout_ms, max_attempts, partitioner, retry)
    shared = _SHARED.get(key)
    if shared is None:
        if len(_SHARED) >= 64:
            _SHARED.clear()
        shared = _SHARED[key] = FirstAttempts.of(*key)
    return shared


def timeout_field(timeout: Timeout) -> int:
    """The persist record's ``timeout_ms``: ``AUTO_TIMEOUT_MS`` for an adaptive timeout (its
    value's prefix then says so, broker.schemas)."""
    return AUTO_TIMEOUT_MS if isinstance(timeout, str) else timeout


class SendResult(NamedTuple):
    srid: int
    record_id: int
    key_hash_partition: int
    origin: int


def first_results(srids: list[int], record_ids: list[int], partitions: list[int]) -> list[SendResult]:
    """The ``SendResult`` of each first attempt (origin = srid), built in bulk: no Python call
    per record."""
    return list(map(tuple.__new__, repeat(SendResult), zip(srids, record_ids, partitions, srids, strict=True)))


_NO_HEADERS = avro_headers(())

BatchRecord = tuple[Any, Any] | tuple[Any, Any, Headers | None]
"""A record of ``send_many``: ``(key, value)`` or ``(key, value, headers)``."""


class Again(NamedTuple):
    """A resend (``Source.resend``, DLQ redrive): a fresh first attempt of ``origin``, at the
    key-hash partition and with the partitioner it was first sent with, carrying its earlier
    rounds (``history``); its data record goes to ``data_topic``."""

    origin: int
    key_hash_partition: int
    partitioner: str
    history: tuple[Failure, ...]
    data_topic: str


class RecordSender:
    """A source's one send path - ``Source.send`` (a batch of one), ``send_many``, ``resend``.

    Per record, in order:
    1. with ``max_pending``, a slot in the window of pending origins (``Backpressure``);
    2. fresh ids, the srid in the ledger partition of the record's key (a resend's: of its
       origin), so every attempt of a key is decided by one acker (docs/design.md §6);
    3. the persist record to ``ns.persist[srid mod P]``: persisting is registering;
    4. the data record: it waits for its persist record (``PendingData``), or, in a
       transaction, is produced at once - the commit makes both visible together.
    What the records of a batch share - the clock, the deadline, the partitioner, the
    placements, the hashing of new keys - is done once per batch.

    It counts the records sent (``sent``) and, in the open transaction, how many
    (``transaction_sent``) and, with ``max_pending``, which (``transaction_srids``: an abort
    gives their slots back)."""

    __slots__ = ("_backpressure", "_config", "_ledger_partitions", "_pending", "_persist", "_placements",
                 "_transactional", "sent", "transaction_sent", "transaction_srids")

    def __init__(
        self, persist: str, config: SourceConfig, placements: Placements, pending: PendingData,
        backpressure: Backpressure, ledger_partitions: Callable[[], int], *, transactional: bool,
    ) -> None:
        """``persist``: the persist topic; ``ledger_partitions``: P, looked up on first use."""
        self._persist = persist
        self._config = config
        self._placements = placements
        self._pending = pending
        self._backpressure = backpressure
        self._ledger_partitions = ledger_partitions
        self._transactional = transactional
        self.sent = 0
        self.transaction_sent = 0
        self.transaction_srids: list[int] = []

    def new_transaction(self) -> None:
        """The counts of the open transaction start again (at its start, and once it is over)."""
        self.transaction_sent = 0
        self.transaction_srids = []

    def send(
        self, topic: str, records: Iterable[BatchRecord], timeout_ms: Timeout | None = None,
        max_attempts: int | None = None, again: Again | None = None,
    ) -> list[SendResult]:
        """``records`` to ``topic``, in order, one ``SendResult`` each; ``timeout_ms`` and
        ``max_attempts`` None (or 0): the config's; ``again``: the one record is a resend.

        A record the producer refuses at once (e.g. over ``message.max.bytes``) stops the batch:
        ``DeliveryError`` names it in ``failures`` and holds the results of the records sent before
        it in ``sent``; the records after it were not sent."""
        config, placements, pending, backpressure = self._config, self._placements, self._pending, self._backpressure
        if timeout_ms:
            check_timeout(timeout_ms)  # the config's was checked when the Source was built
        if max_attempts:
            check_max_attempts(max_attempts)
        timeout, attempts = timeout_field(timeout_ms or config.timeout_ms), max_attempts or config.max_attempts
        batch: Sequence[BatchRecord] = records if isinstance(records, (list, tuple)) else list(records)
        persist, ledger_partitions = self._persist, self._ledger_partitions()
        if len(batch) == 1:  # looked up one by one: for one record, the bulk look-ups cost more
            key = batch[0][0]
            key_b = key if key is None or type(key) is bytes else as_bytes(key)
            keys_b: list[bytes | None] = [key_b]
            if again is not None:
                partition, lp = again.key_hash_partition, again.origin % ledger_partitions
            else:
                partition = placements.key_hash_partition(topic, key_b)
                lp = -1 if key_b is None else placements.ledger_partition(topic, key_b, ledger_partitions, partition)
            parts = [partition]
            pairs: Iterable[IdPair] = (new_id_pair() if lp < 0 else new_id_pair_in(residue_pools(ledger_partitions), lp),)
        else:
            assert again is None  # a resend is one record
            keys_b = [k if k is None or type(k) is bytes else as_bytes(k) for k in map(itemgetter(0), batch)]
            parts, lps = self._place(topic, batch, keys_b, ledger_partitions)
            pairs = draw_pairs(lps, ledger_partitions)
        data_topic = topic if again is None else again.data_topic
        serde = config.serdes.get(topic, config.serde)
        placed = placements.placements(topic)  # the encoded placement of each partition
        partitioner, retry = placements.partitioner(topic), config.retry
        producer = pending.producer
        produce = producer.produce
        on_persist = pending.on_persist
        window = backpressure.window
        transactional = self._transactional
        bounded = config.max_pending is not None
        # What every record of the batch shares, encoded once: its prefix after the ids, the
        # record's last fields (one clock reading), the partitioner of the topic.
        created_ms = pending.created_ms()
        shared = first_attempts(created_ms, timeout, attempts, partitioner, retry)
        srids: list[int] = []  # the results, as columns (``first_results``)
        record_ids: list[int] = []
        partitions: list[int] = []
        waiting: list[Any] = []  # PendingData's entries, flat (broker.delivery.ENTRY_FIELDS)
        try:
            for record, key_b, partition, pair in zip(batch, keys_b, parts, pairs, strict=True):
                value = record[1]
                value_b = value if value is None or type(value) is bytes else serde.serialize(value)
                own = user_headers(record[2]) if len(record) > 2 and record[2] else ()
                if bounded:
                    # The records waiting for a slot may be this batch's own: theirs must be out.
                    pending.extend(waiting)
                    waiting = []
                    backpressure.await_slot(len(self.transaction_srids))
                    window = backpressure.window
                    # Waiting served the producers: the epoch may have moved on, to the other
                    # producer and a later floor of created_ms (PendingData.created_ms).
                    producer = pending.producer
                    produce = producer.produce
                    created_ms = pending.created_ms()
                    shared = first_attempts(created_ms, timeout, attempts, partitioner, retry)
                srid, record_id, srid_b, ids_key, ids_avro, tracking = pair
                if again is None:
                    origin = srid
                    value_p = encode_first_persisted(
                        ids_key, ids_avro, placed[partition], key_b, value_b, avro_headers(own) if own else _NO_HEADERS,
                        shared,
                    )
                else:  # encoded field by field: it keeps its origin, partitioner and history
                    origin = again.origin
                    tracking = (H_TRACKING, Tracking.pack(srid, record_id, origin, 1))
                    value_p = encode_persisted(
                        srid, origin, 1, record_id, record_id, topic, partition, again.partitioner, key_b, value_b,
                        own, created_ms, timeout, attempts, again.history, retry,
                    )
                try:
                    try:
                        # Positional (kafka_io.PRODUCE_ARGS): cheaper than keywords on the hot path.
                        produce(persist, value_p, srid_b, srid % ledger_partitions, on_persist)
                    except BufferError:  # the queue is full: wait for it like any produce
                        kafka_io.produce(producer, persist, key=srid_b, value=value_p,
                                         partition=srid % ledger_partitions, on_delivery=on_persist)
                except KafkaException as exc:
                    failure = SendFailure.of(value_p, exc.args[0])
                    before = f"; the {len(srids)} records before it were sent" if srids else ""
                    raise DeliveryError(
                        f"persist record not produced: {exc}{before}", failures=[failure],
                        sent=self._results(srids, record_ids, partitions, again),
                    ) from exc
                if transactional:
                    # Atomic with its persist record, so it need not wait for it; a transactional
                    # source has one producer, the epoch's (PendingData.use).
                    kafka_io.produce(producer, data_topic, key=key_b, value=value_b, partition=partition,
                                     headers=[*own, tracking])
                else:  # without headers of its own, its tracking header alone: no list kept per record
                    waiting += (srid_b, data_topic, key_b, value_b, partition, [*own, tracking] if own else tracking)
                if window is not None:
                    window.sent(srid, origin)
                    if transactional:
                        self.transaction_srids.append(srid)
                srids.append(srid)
                record_ids.append(record_id)
                partitions.append(partition)
        finally:
            pending.extend(waiting)
            self.sent += len(srids)
            if transactional:
                self.transaction_sent += len(srids)
        return self._results(srids, record_ids, partitions, again)

    def _place(
        self, topic: str, batch: Sequence[BatchRecord], keys_b: list[bytes | None], ledger_partitions: int,
    ) -> tuple[list[int], list[int]]:
        """Each record's key-hash partition, and the ledger partition its srid is drawn in: its
        key's (the key-hash partition when the counts agree, else
        ``Placements.ledger_partition``), -1 for any."""
        placements = self._placements
        if len(batch) >= BATCH_KEYS:  # new keys hashed together, not one by one (their ledger partitions too)
            placements.learn(topic, map(itemgetter(0), batch), ledger_partitions)
        # Looked up per record without a call: the partitions of the keys seen.
        parts: list[Any] = list(map(placements.known_keys(topic).get, keys_b))  # type: ignore[arg-type]  # None: never known
        if None in parts:
            key_hash_partition = placements.key_hash_partition
            parts = [key_hash_partition(topic, k) if p is None else p for k, p in zip(keys_b, parts, strict=True)]
        if placements.data_partitions(topic) == ledger_partitions:
            return parts, parts  # a keyless record's random partition is as good as any
        get_lp = placements.known_ledger(topic).get
        lps = [-1 if k is None else get_lp(k) for k in keys_b]
        if None in lps:
            lps = [lp if lp is not None or k is None else placements.ledger_partition(topic, k, ledger_partitions, p)
                   for k, p, lp in zip(keys_b, parts, lps, strict=True)]
        return parts, lps  # type: ignore[return-value]  # no None left

    @staticmethod
    def _results(srids: list[int], record_ids: list[int], partitions: list[int], again: Again | None) -> list[SendResult]:
        if again is not None:
            return [SendResult(*sent, again.origin) for sent in zip(srids, record_ids, partitions, strict=True)]
        if len(srids) == 1:  # a send's: the bulk build's fixed cost is not repaid by one record
            return [SendResult(srids[0], record_ids[0], partitions[0], srids[0])]
        return first_results(srids, record_ids, partitions)
