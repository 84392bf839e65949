"""Binary record payloads: a record whose one ``bytes`` field is stored raw, not as base64 in JSON.

A shard's ``payload`` column is Parquet ``BINARY``. A JSON payload (``Record.to_payload()``)
carries a ``bytes`` field as base64 text, a third larger and opaque to the shard's zstd
(compressed or columnar bytes, such as a Parquet file of a session's DataFrames, base64 no
longer compresses). For the kinds in :data:`BINARY_FIELDS` a payload may instead be::

    MAGIC (5 bytes: 0x89 'R' 'C' 'B' 0x01) | header length (4 bytes, big-endian) | header | raw

where ``header`` is the record's compact UTF-8 JSON **without** the binary field and ``raw`` is
that field's bytes as they are. ``0x89`` never starts a JSON text, so a reader tells the two
forms apart by the first byte; both decode to the same record (``decode_record``). Everything
else (member identity, ``revision``, ``refs``, digests) is the same for both forms.
"""

from __future__ import annotations

import json
import struct
from typing import Any

__all__ = ["BINARY_FIELDS", "MAGIC", "binary_payload", "is_binary_payload", "split_binary_payload"]

MAGIC = b"\x89RCB\x01"
BINARY_FIELDS: dict[str, str] = {"resource_snapshot": "state"}
"""Record kinds that may be stored in binary form, and the ``bytes`` field stored raw."""

_LENGTH = struct.Struct(">I")


def is_binary_payload(payload: bytes | str) -> bool:
    return isinstance(payload, bytes | bytearray | memoryview) and bytes(payload[: len(MAGIC)]) == MAGIC


def binary_payload(kind: str, header: dict[str, Any], raw: bytes) -> bytes:
    """The binary payload of a ``kind`` record whose fields other than its binary one are
    ``header`` (JSON values) and whose binary field holds ``raw``."""
    field = BINARY_FIELDS.get(kind)
    if field is None:
        raise ValueError(f"{kind} records have no binary form")
    if field in header:
        raise ValueError(f"the header of a binary {kind} payload must not hold {field!r}")
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(head)), head, raw])


def split_binary_payload(kind: str, payload: bytes) -> dict[str, Any]:
    """The record fields of a binary payload (the binary field as ``bytes``); ``ValueError`` if
    it is malformed or ``kind`` has no binary form."""
    field = BINARY_FIELDS.get(kind)
    if field is None:
        raise ValueError(f"{kind} records have no binary form")
    data = bytes(payload)
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or data[: len(MAGIC)] != MAGIC:
        raise ValueError("not a binary payload")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if start + length > len(data):
        raise ValueError("a binary payload's header runs past its end")
    header = json.loads(data[start : start + length])
    if not isinstance(header, dict) or field in header:
        raise ValueError(f"a binary {kind} payload's header must be an object without {field!r}")
    header[field] = data[start + length :]
    return header
