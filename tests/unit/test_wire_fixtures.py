"""Every record written by f6b7ae1 (tests/unit/fixtures/codecs_f6b7ae1.json) still decodes,
to the value it was encoded from: what older writers left in the topics stays readable."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from broker import ids
from broker.dlq import Marker, _history
from broker.headers import unpack_tracking
from broker.schemas import LedgerCounters, LedgerEntry, OutageBeat, PersistedRecord, XorBatch
from tests.unit.fixtures.codec_fixtures import FIXTURES, as_json

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "XorBatch": XorBatch.decode,
    "LedgerEntry": LedgerEntry.decode,
    "LedgerCounters": LedgerCounters.decode,
    "PersistedRecord": PersistedRecord.decode,
    "OutageBeat": OutageBeat.decode,
    "Tracking": unpack_tracking,
    "DlqHistory": _history,
    "Marker": Marker.decode,
    "Id": ids.decode_id,
}
_DOC = json.loads(FIXTURES.read_text())
_CASES = _DOC["fixtures"]


def test_the_fixtures_are_the_old_writers_and_cover_every_old_layout() -> None:
    assert _DOC["commit"] == "f6b7ae1"
    names = {c["name"] for c in _CASES}
    for prefix, layouts in {"xor_batch_v": 5, "ledger_entry_v": 4, "ledger_counters_v": 3, "persisted_record_v": 2}.items():
        assert {n[len(prefix)] for n in names if n.startswith(prefix)} == {str(v) for v in range(1, layouts + 1)}


@pytest.mark.parametrize("case", _CASES, ids=[c["name"] for c in _CASES])
def test_a_record_written_by_f6b7ae1_decodes_to_what_was_encoded(case: dict[str, Any]) -> None:
    decoded = DECODERS[case["decoder"]](bytes.fromhex(case["hex"]))
    assert as_json(decoded) == case["expected"]
