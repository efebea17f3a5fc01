"""Serdes: bytes by default, JSON and Avro; the same two rules for all (bytes pass, None stays)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.errors import SerializationError
from broker.serde import BYTES, AvroSerde, JsonSerde, Serde
from broker.task import TaskRecord

ORDER_SCHEMA = {
    "type": "record", "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
}


@pytest.fixture
def avro(tmp_path: Path) -> AvroSerde:
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(ORDER_SCHEMA))
    return AvroSerde(path)


@pytest.mark.parametrize(
    ("serde", "value"),
    [(BYTES, b"raw"), (JsonSerde(), {"id": 7, "tags": ["a", "b"], "amount": 1.5}), (JsonSerde(), [1, "x", None])],
)
def test_a_value_comes_back_as_it_was_sent(serde: Serde, value: object) -> None:
    assert serde.deserialize(serde.serialize(value)) == value


def test_avro_from_a_schema_file_round_trips(avro: AvroSerde) -> None:
    data = avro.serialize({"id": 3, "amount": 2.5})
    assert isinstance(data, bytes) and len(data) < 16  # schemaless: no header, no field names
    assert avro.deserialize(data) == {"id": 3, "amount": 2.5}


@pytest.mark.parametrize("serde", [BYTES, JsonSerde(), AvroSerde(ORDER_SCHEMA)])
def test_bytes_pass_unchanged_and_none_stays_none(serde: Serde) -> None:
    assert serde.serialize(b"\x00already") == b"\x00already"
    assert serde.serialize(bytearray(b"ab")) == b"ab"
    assert serde.serialize(None) is None
    assert serde.deserialize(None) is None


def test_the_default_sends_str_as_utf8_and_refuses_objects() -> None:
    assert BYTES.serialize("é") == "é".encode()
    with pytest.raises(SerializationError, match="needs a serde"):
        BYTES.serialize({"id": 1})


@pytest.mark.parametrize(
    ("serde", "value"),
    [(JsonSerde(), {1, 2}), (AvroSerde(ORDER_SCHEMA), {"id": "seven", "amount": 1.0}),
     (AvroSerde(ORDER_SCHEMA), {"id": 1})],
)
def test_a_value_that_does_not_fit_raises_a_serialization_error(serde: Serde, value: object) -> None:
    with pytest.raises(SerializationError) as caught:
        serde.serialize(value)
    assert caught.value.value == value


@pytest.mark.parametrize(("serde", "data"), [(JsonSerde(), b"{not json"), (AvroSerde(ORDER_SCHEMA), b"\x02"),
                                             (AvroSerde(ORDER_SCHEMA), b"\x02" + b"\x00" * 8 + b"extra")])
def test_bad_bytes_raise_a_serialization_error(serde: Serde, data: bytes) -> None:
    with pytest.raises(SerializationError) as caught:
        serde.deserialize(data)
    assert caught.value.value == data


def test_a_schema_that_cannot_be_read_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="cannot read"):
        AvroSerde(tmp_path / "missing.avsc")
    with pytest.raises(SerializationError, match="not an Avro schema"):
        AvroSerde({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})


def test_a_task_record_decodes_its_value_with_the_tasks_serde() -> None:
    raw = TaskRecord("t", 0, 0, b"k", b'{"id": 1}', (), None)
    assert raw.decoded() == b'{"id": 1}'  # bytes by default
    assert raw._replace(serde=JsonSerde()).decoded() == {"id": 1}
    assert raw._replace(serde=JsonSerde(), value=None).decoded() is None
