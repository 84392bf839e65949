"""Decoded records over a component archive.

The archive layer reads raw members (kind, identity, key, payload bytes) and knows nothing of
the record models; :class:`ArchiveReader` adds what this format defines on top: decoding each
payload into its record model (:func:`~rollout_checkpoint.format.records.decode_record`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..archive import RawArchiveReader
from .records import Record, decode_record

__all__ = ["MEMBER_COLUMNS", "ArchiveReader"]

MEMBER_COLUMNS = ("kind", "rollout_id", "attempt", "key", "revision", "refs")
"""What :meth:`ArchiveReader.member_columns` returns, in this order (``refs`` as stored: JSON text)."""


class ArchiveReader(RawArchiveReader):
    """A committed component archive whose members decode into record models."""

    def iter_records(self, kind: str | None = None) -> Iterator[Record]:
        """Decoded records (``records.decode_record``), shard by shard; see :meth:`iter_raw`."""
        for raw in self.iter_raw(kind):
            yield decode_record(raw.kind, raw.payload)

    def get(self, kind: str, rollout_id: str, attempt: int, key: str) -> Record:
        """One decoded record; ``MemberNotFoundError`` when the index has no such member."""
        raw = self.get_raw(kind, rollout_id, attempt, key)
        return decode_record(raw.kind, raw.payload)

    def member_columns(self) -> list[list[Any]]:
        """Every member's ``MEMBER_COLUMNS`` as Python lists, from the index only (no shard is
        read): the stored members in write order, then (version 2) the referenced ones, as
        :meth:`members` yields them, without a ``MemberRef`` per member and with ``refs`` left as
        the stored JSON text (the caller parses what it needs). A bulk reader's view: a million
        members cost a handful of column conversions, not a million objects."""
        index = self._member_index()
        index.load(*MEMBER_COLUMNS)
        columns: list[list[Any]] = [index.column(name).to_pylist() for name in MEMBER_COLUMNS]
        referenced = self.references()
        if referenced:
            for i, column in enumerate(columns):
                column.extend(r[i] for r in referenced)  # Reference: the same six fields first
        return columns
