"""Rows of a shard's row group: the fetched byte window pyarrow decodes, and the rows it yields.

Shared by the reader (``_reader``: row groups located by the member index, digest-checked) and
the format-2 side (``_referring``: a referenced row read through its shard's footer).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import IntegrityError
from ._schema import SHARD_SCHEMA

__all__ = ["RawRecord", "WindowFile", "check_schema", "raw_rows"]


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One stored member with its payload bytes undecoded (for bulk readers and other tools)."""

    kind: str
    rollout_id: str
    attempt: int
    key: str
    schema_version: int
    revision: int | None
    refs: str | None
    payload: bytes


class WindowFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``[offset, offset + len(data))`` is known.

    pyarrow gets the shard's footer metadata separately (``ParquetFile(metadata=...)``), so when
    it reads one row group it touches only that row group's byte range: this object serves that
    range from memory and refuses anything else instead of guessing.
    """

    def __init__(self, size: int, offset: int, data: bytes) -> None:
        super().__init__()
        self._size = size
        self._offset = offset
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = pos
        elif whence == io.SEEK_CUR:
            self._pos += pos
        else:
            self._pos = self._size + pos
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start = self._pos
        end = min(self._size, start + len(view))
        if end <= start:
            return 0
        lo = start - self._offset
        hi = end - self._offset
        if lo < 0 or hi > len(self._data):
            raise OSError(f"read of [{start}, {end}) outside the fetched row group")
        view[: end - start] = self._data[lo:hi]
        self._pos = end
        return end - start


def check_schema(schema: pa.Schema, key: str) -> None:
    if not schema.remove_metadata().equals(SHARD_SCHEMA.remove_metadata()):
        raise IntegrityError(
            f"{key}: shard columns do not match the shard schema", key=key, problem="invalid"
        )


def raw_rows(table: pa.Table, key: str) -> Iterator[RawRecord]:
    check_schema(table.schema, key)
    columns = [table.column(name).to_pylist() for name in SHARD_SCHEMA.names]
    for row in zip(*columns, strict=True):
        yield RawRecord(*row)
