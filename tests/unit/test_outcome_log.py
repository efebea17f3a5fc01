"""``OutcomeLog``: what the persist topic says happened to each origin - here, that replays are
counted for the origins asked about, not for everything the namespace ever replayed (the
examples' summary, run twice in one namespace)."""

from __future__ import annotations

from typing import Any

from broker import ids
from broker.completions import OutcomeLog
from broker.headers import H_OUTCOME
from broker.schemas import PersistedRecord


class Msg:
    def __init__(self, srid: int, value: bytes | None, outcome: bytes | None = None) -> None:
        self._key, self._value = ids.encode_id(srid), value
        self._headers = [(H_OUTCOME, outcome)] if outcome else None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)


def _persisted(srid: int, origin: int, attempt: int) -> bytes:
    return PersistedRecord(srid=srid, origin=origin, attempt=attempt, root_xor=1, record_id=1, topic="t",
                           key_hash_partition=0, key=None, value=None, created_ms=1).encode()


def test_replays_are_counted_for_the_origins_asked_about() -> None:
    log = OutcomeLog()
    for origin in (11, 22):  # each replayed once, then completed
        replay = origin + 1
        for msg in (Msg(origin, _persisted(origin, origin, 1)), Msg(origin, None, b"replay"),
                    Msg(replay, _persisted(replay, origin, 2)), Msg(replay, None)):
            log.add(msg)  # type: ignore[arg-type]
    assert log.replays() == 2 and log.replays([11]) == 1 and log.replays([33]) == 0
    assert log.completed_origins() == {11: 1, 22: 1}
