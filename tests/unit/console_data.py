"""Dead-letter entries for the console's unit tests, hostile ones among them."""

from __future__ import annotations

from broker.dlq import QUARANTINE, RECORD, DlqEntry
from broker.schemas import Failure

BASE_MS = 1_700_000_000_000
XSS = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&'


def record(offset: int, *, partition: int = 0, key: bytes | None = None, value: bytes | None = b'{"a": 1}',
           topic: str = "ns.orders", reason: str = "handler: cannot parse", at_ms: int | None = None,
           headers: tuple[tuple[str, bytes | None], ...] = (), origin: int | None = None) -> DlqEntry:
    at = BASE_MS + offset * 1000 if at_ms is None else at_ms
    srid = 1_000_000 + offset * 10 + partition
    return DlqEntry(
        partition=partition, offset=offset, timestamp_ms=at, kind=RECORD, reason=reason,
        key=key if key is not None else f"k{offset}".encode(), value=value, headers=headers,
        origin=origin if origin is not None else 5_000_000 + offset * 10 + partition, attempts=3, topic=topic,
        key_hash_partition=0, partitioner="kafka",
        history=tuple(Failure(srid + a, a, reason, at - (3 - a) * 100) for a in (1, 2, 3)),
    )


def quarantined(offset: int, partition: int = 0) -> DlqEntry:
    return DlqEntry(partition=partition, offset=offset, timestamp_ms=BASE_MS + offset, kind=QUARANTINE,
                    reason="quarantine: undecodable", key=None, value=b"\x00\xff", source="ns.acks/1/7")


def hostile(offset: int) -> DlqEntry:
    return record(offset, key=XSS.encode(), value=XSS.encode(), reason=f"handler: {XSS}",
                  headers=((XSS, XSS.encode()), ("trace", b"\x00\x01<b>")))
