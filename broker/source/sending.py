"""The per-record work of ``Source.send`` and ``Source.send_many``: fresh ids drawn in bulk,
with their encodings; the persist record's timeout field; and ``send_batch``, the batch
send - what is the same for every record of a batch (the clock, the deadline, the
partitioner, the delivery bookkeeping) is done once per batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
from confluent_kafka import KafkaException, Producer

from broker import ids, kafka_io
from broker.delivery import PendingData, SendFailure
from broker.errors import DeliveryError
from broker.headers import AUTO_TIMEOUT_MS, H_TRACKING, Headers, as_bytes, user_headers
from broker.retry import RetryPolicy
from broker.schemas import FirstAttempts, avro_headers, encode_first_persisted, first_attempt_ids
from broker.source.backpressure import Backpressure
from broker.source.placement import Placements
from broker.topics import Namespace


class Sender(Protocol):
    """What ``send_batch`` uses of a ``broker.source.Source`` (its send state)."""

    ns: Namespace
    config: Any
    sent: int
    _placements: Placements
    _producer: Producer
    _pending: PendingData
    _backpressure: Backpressure
    _transactional: bool
    _transaction_srids: list[int]
    _in_transaction_sent: int

    @property
    def ledger_partitions(self) -> int: ...

    def _produce(self, topic: str, **kwargs: Any) -> None: ...

Timeout = int | Literal["auto"]
"""A record's timeout: ms, or ``"auto"`` - the acker gives the deadline from the completion
latency it sees for the topic (docs/design.md §6, *Adaptive timeouts*)."""


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


def send_batch(
    source: Sender, topic: str, records: Iterable[BatchRecord], timeout: Timeout, max_attempts: int
) -> list[SendResult]:
    """``Source.send_many``'s records, in order: one persist record each, and their data
    records added to the source's waiting ones at once (or, in a transaction, produced).

    A record the producer refuses at once (e.g. over ``message.max.bytes``) stops the batch:
    ``DeliveryError`` names it in ``failures`` and holds the results of the records sent before
    it in ``sent``; the records after it were not sent."""
    placements = source._placements
    batch: Sequence[BatchRecord] = records if isinstance(records, list | tuple) else list(records)
    persist, ledger_partitions = source.ns.persist, source.ledger_partitions
    # New keys hashed together, not one by one (their ledger partitions too).
    placements.learn(topic, map(itemgetter(0), batch), ledger_partitions)
    serde = source.config.serdes.get(topic, source.config.serde)
    key_hash_partition = placements.key_hash_partition
    # Looked up per record without a call: the partitions of the keys seen, the placements.
    known_keys, placed = placements.known_keys(topic), placements.placements(topic)
    producer = source._pending.producer
    produce = producer.produce
    # Each record's key-hash partition, and its srid drawn in its key's ledger partition (the
    # key-hash partition when the counts agree, else placement.Placements.ledger_partition):
    # the batch's ids are drawn together (draw_pairs), whatever P is.
    keys_b = [k if k is None or type(k) is bytes else as_bytes(k) for k in map(itemgetter(0), batch)]
    parts: list[Any] = list(map(known_keys.get, keys_b))  # type: ignore[arg-type]  # None: never known
    if None in parts:
        parts = [key_hash_partition(topic, k) if p is None else p for k, p in zip(keys_b, parts, strict=True)]
    if placements.data_partitions(topic) == ledger_partitions:
        lps = parts  # a keyless record's random partition is as good as any
    else:
        get_lp = placements.known_ledger(topic).get
        lps = [-1 if k is None else get_lp(k) for k in keys_b]
        if None in lps:
            lps = [lp if lp is not None or k is None else placements.ledger_partition(topic, k, ledger_partitions, p)
                   for k, p, lp in zip(keys_b, parts, lps, strict=True)]
    pairs = draw_pairs(lps, ledger_partitions)
    on_persist = source._pending.on_persist
    window = source._backpressure.window
    transactional = source._transactional
    bounded = source.config.max_pending is not None
    # What every record of the batch shares, encoded once: its prefix after the ids, the
    # record's last fields (one clock reading per batch), the partitioner of the topic.
    shared = first_attempts(source._pending.created_ms(), timeout_field(timeout), max_attempts,
                            placements.partitioner(topic), source.config.retry)
    srids: list[int] = []  # the results, as columns (``first_results``)
    record_ids: list[int] = []
    partitions: list[int] = []
    waiting: list[Any] = []  # PendingData's entries, flat (broker.delivery.ENTRY_FIELDS)
    try:
        for record, key_b, partition, pair in zip(batch, keys_b, parts, pairs, strict=True):
            value = record[1]
            if bounded:
                # The records waiting for a slot may be this batch's own: theirs must be out.
                source._pending.extend(waiting)
                waiting = []
                source._backpressure.await_slot(len(source._transaction_srids))
                window = source._backpressure.window
            value_b = value if value is None or type(value) is bytes else serde.serialize(value)
            own = user_headers(record[2]) if len(record) > 2 and record[2] else ()
            srid, record_id, srid_b, ids_key, ids_avro, tracking = pair
            value_p = encode_first_persisted(
                ids_key, ids_avro, placed[partition], key_b, value_b, avro_headers(own) if own else _NO_HEADERS, shared,
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
                raise DeliveryError(
                    f"persist record not produced: {exc}; the {len(srids)} records before it were sent",
                    failures=[failure], sent=first_results(srids, record_ids, partitions),
                ) from exc
            if transactional:
                source._produce(topic, key=key_b, value=value_b, partition=partition, headers=[*own, tracking])
            else:  # without headers of its own, its tracking header alone: no list kept per record
                waiting += (srid_b, topic, key_b, value_b, partition, [*own, tracking] if own else tracking)
            if window is not None:
                window.sent(srid, srid)
                if transactional:
                    source._transaction_srids.append(srid)
            srids.append(srid)
            record_ids.append(record_id)
            partitions.append(partition)
    finally:
        source._pending.extend(waiting)
        source.sent += len(srids)
        if transactional:
            source._in_transaction_sent += len(srids)
    return first_results(srids, record_ids, partitions)

