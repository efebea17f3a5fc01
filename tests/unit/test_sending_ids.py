"""A source's ids (broker.source.sending): drawn in bulk with their encodings, never the same in two
processes - a forked child that reused its parent's pool would send the same srids and
record ids, and the same ids XORed twice cancel in the ledger."""

from __future__ import annotations

import os

import numpy as np

from broker import ids
from broker.headers import H_TRACKING, Tracking
from broker.schemas import avro_long
from broker.source import sending
from broker.source.sending import SendResult, first_results, new_id_pair


def test_a_source_id_comes_with_its_encodings() -> None:
    for _ in range(5000):
        srid, record_id, srid_key, ids_key, ids_avro, tracking = new_id_pair()
        assert srid != 0 and record_id != 0
        assert srid_key == ids.encode_id(srid) and ids_key == srid_key + ids.encode_id(record_id)
        assert ids_avro == avro_long(srid) * 2 + avro_long(1) + avro_long(record_id) * 2
        assert Tracking.unpack(ids_key) == Tracking(srid, record_id, srid, 1)
        assert tracking == (H_TRACKING, ids_key)


def test_a_forked_child_draws_none_of_its_parents_pooled_ids() -> None:
    new_id_pair()  # the pool is full now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first ids, to the parent
        try:
            os.write(write, b"".join(ids.encode_id(i) for _ in range(3) for i in new_id_pair()[:2]))
        finally:
            os._exit(0)
    os.close(write)
    pooled = {i for pair in sending._ID_POOL for i in pair[:2]}  # what the child would have drawn
    with os.fdopen(read, "rb") as pipe:
        drawn = pipe.read()
    os.waitpid(pid, 0)
    child = {ids.decode_id(drawn[i : i + 8]) for i in range(0, len(drawn), 8)}
    assert len(child) == 6 and not child & pooled


def test_results_built_in_bulk_are_the_send_results_of_first_attempts() -> None:
    srids, record_ids, partitions = [5, -7, 2**62], [9, 11, -(2**63)], [0, 3, 1]
    results = first_results(srids, record_ids, partitions)
    expected = [SendResult(s, r, p, s) for s, r, p in zip(srids, record_ids, partitions, strict=True)]
    assert results == expected and type(results) is list
    assert all(type(r) is SendResult for r in results)
    assert [(r.srid, r.record_id, r.key_hash_partition, r.origin) for r in results] == [tuple(e) for e in expected]
    assert first_results([], [], []) == []


def test_ids_moved_into_a_partition_keep_their_partition_and_range() -> None:
    edges = [1, -1, 2**63 - 1, -(2**63), 2**62, -(2**62) - 1, 12345, -987654321]
    for P in (1, 2, 7, 16, 1000, 2**31 - 1):
        for partition in {0, 1 % P, P - 1, P // 2}:
            moved = [ids.in_partition(x, partition, P) for x in edges]
            assert all(m % P == partition and m != 0 and -(2**63) <= m < 2**63 for m in moved)
            bulk = ids.in_partitions(np.array(edges, np.int64), partition, P)
            assert bulk.tolist() == moved
    # 0 is never an id: it stays in its partition as P itself
    assert ids.in_partition(0, 0, 8) == 8 and ids.in_partitions(np.zeros(2, np.int64), 0, 8).tolist() == [8, 8]
    drawn = {ids.new_id_in(3, 8) for _ in range(1000)}
    assert len(drawn) == 1000 and {d % 8 for d in drawn} == {3}


def test_a_keyed_source_id_is_drawn_in_its_ledger_partition_with_its_encodings() -> None:
    pools = sending.residue_pools(5)
    assert sending.residue_pools(5) is pools and len(pools) == 5
    seen = set()
    for i in range(3000):
        partition = i % 5
        srid, record_id, srid_key, ids_key, ids_avro, tracking = sending.new_id_pair_in(pools, partition)
        assert srid % 5 == partition and srid != 0 and record_id != 0
        assert srid_key == ids.encode_id(srid) and ids_key == srid_key + ids.encode_id(record_id)
        assert ids_avro == avro_long(srid) * 2 + avro_long(1) + avro_long(record_id) * 2
        assert tracking == (H_TRACKING, ids_key)
        seen.add(srid)
    assert len(seen) == 3000


def test_a_batchs_ids_are_drawn_in_each_records_ledger_partition() -> None:
    """``draw_pairs``: per record from the pools (few records, or a small P), or the whole
    batch in one numpy pass (a large P); either way each srid in its record's partition (-1:
    any), with its encodings."""
    for P, n in ((4, 10), (4, 500), (1000, 10), (1000, 500)):
        wanted = [(-1 if i % 7 == 0 else (i * 31) % P) for i in range(n)]
        pairs = list(sending.draw_pairs(wanted, P))
        assert len(pairs) == n and len({p[0] for p in pairs}) == n
        for lp, (srid, record_id, srid_key, ids_key, ids_avro, tracking) in zip(wanted, pairs, strict=True):
            assert lp < 0 or srid % P == lp
            assert srid != 0 and record_id != 0 and srid_key == ids.encode_id(srid)
            assert ids_key == srid_key + ids.encode_id(record_id) and tracking == (H_TRACKING, ids_key)
            assert ids_avro == avro_long(srid) * 2 + avro_long(1) + avro_long(record_id) * 2
