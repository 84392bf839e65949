"""Binary record payloads (a record's one ``bytes`` field stored raw, not as base64 in JSON).

The framing lives in the archive layer (``archive._binary``) so that a bulk reader of raw
payloads (``ArchiveReader.iter_dicts``) can read both forms; this module is its public name.
See ``docs/format.md``, "Binary payloads".
"""

from __future__ import annotations

from ..archive._binary import (
    BINARY_FIELDS,
    MAGIC,
    binary_payload,
    binary_payload_dict,
    is_binary_payload,
    split_binary_payload,
)

__all__ = [
    "BINARY_FIELDS",
    "MAGIC",
    "binary_payload",
    "binary_payload_dict",
    "is_binary_payload",
    "split_binary_payload",
]
