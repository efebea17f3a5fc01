"""Serializers for record values: bytes (the default), JSON (orjson) and Avro (fastavro).

A serde is set once per service - ``SourceConfig(serde=...)`` for ``Source.send``,
``TaskConfig(serde=...)`` for ``TaskRecord.decoded()`` and the values of ``ctx.emit`` /
``ctx.output``. Two rules hold for every serde, so records can be forwarded as they came:

- ``bytes`` are sent unchanged (already serialized), and ``None`` stays ``None`` (a tombstone);
- a value that cannot be (de)serialized raises ``SerializationError`` - in a task's handler
  that fails the input (replay, then the DLQ), it never stops the task.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastavro
import orjson

from broker.errors import SerializationError

__all__ = ["BYTES", "AvroSerde", "BytesSerde", "JsonSerde", "Serde"]


class Serde:
    """Turns values into bytes and back. Subclasses implement ``dumps`` and ``loads``."""

    def serialize(self, value: Any) -> bytes | None:
        if value is None or type(value) is bytes:
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        try:
            return self.dumps(value)
        except SerializationError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise SerializationError(f"{type(self).__name__} cannot serialize {type(value).__name__}: {exc}",
                                     value=value) from exc

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return self.loads(data)
        except SerializationError:
            raise
        except (TypeError, ValueError, EOFError, IndexError, KeyError, UnicodeDecodeError) as exc:
            raise SerializationError(f"{type(self).__name__} cannot deserialize {len(data)} bytes: {exc}",
                                     value=data) from exc

    def dumps(self, value: Any) -> bytes:
        raise NotImplementedError

    def loads(self, data: bytes) -> Any:
        raise NotImplementedError


class BytesSerde(Serde):
    """The default: values are bytes; ``str`` is sent as UTF-8. Anything else is refused."""

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        raise SerializationError(
            f"a value of type {type(value).__name__} needs a serde (JsonSerde, AvroSerde): "
            "the default sends bytes or str", value=value)

    def loads(self, data: bytes) -> bytes:
        return data


BYTES = BytesSerde()


class JsonSerde(Serde):
    """JSON with orjson: dicts, lists, numbers, strings, dataclasses, datetimes."""

    def dumps(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def loads(self, data: bytes) -> Any:
        return orjson.loads(data)


class AvroSerde(Serde):
    """Avro without a header (schemaless), one schema for every value: from an ``.avsc``
    file's path or a parsed schema. Both sides must use the same schema (no registry)."""

    def __init__(self, schema: str | Path | Mapping[str, Any]) -> None:
        if isinstance(schema, str | Path):
            try:
                parsed = json.loads(Path(schema).read_text())
            except (OSError, ValueError) as exc:
                raise SerializationError(f"cannot read the Avro schema {schema}: {exc}") from exc
        else:
            parsed = dict(schema)
        try:
            self.schema = fastavro.parse_schema(parsed)
        except (fastavro.schema.SchemaParseException, TypeError, ValueError) as exc:
            raise SerializationError(f"not an Avro schema: {exc}") from exc

    def dumps(self, value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, self.schema, value, strict=True)
        return out.getvalue()

    def loads(self, data: bytes) -> Any:
        buffer = io.BytesIO(data)
        value = fastavro.schemaless_reader(buffer, self.schema, None)
        if buffer.tell() != len(data):
            raise SerializationError(f"{len(data) - buffer.tell()} bytes left after an Avro value", value=data)
        return value
