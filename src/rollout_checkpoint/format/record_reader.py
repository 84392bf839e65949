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

MEMBER_COLUMNS = ("rollout_id", "attempt", "key", "revision", "refs")
"""What :meth:`ArchiveReader.member_columns` gives per kind, in this order (``refs``: JSON text)."""


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

    def member_columns(self) -> dict[str, list[list[Any]]]:
        """Every member, by kind, as the Python lists of its ``MEMBER_COLUMNS``, from the index
        only (no shard is read): per kind the stored members in write order, then (version 2)
        the referenced ones, as :meth:`members` yields them, without a ``MemberRef`` per member
        and with ``refs`` left as the stored JSON text (the caller parses what it needs). A bulk
        reader's view: a million members cost a few column conversions, not a million objects."""
        from pyarrow._compute import call_function  # not pyarrow.compute: see archive's compute()

        index = self._member_index()
        index.load("kind", *MEMBER_COLUMNS)
        kinds = index.column("kind")
        out: dict[str, list[list[Any]]] = {}
        unique = call_function("unique", [kinds])
        for i, kind in enumerate(unique.to_pylist()):
            # the Arrow scalar of the column itself: building one from a Python str would make
            # pyarrow import pandas (seconds) to check the value's type
            mask = call_function("equal", [kinds, unique[i]])
            out[kind] = [
                call_function("filter", [index.column(name), mask]).to_pylist() for name in MEMBER_COLUMNS
            ]
        for r in self.references():
            columns = out.get(r.kind)
            if columns is None:
                columns = out[r.kind] = [[] for _ in MEMBER_COLUMNS]
            for column, value in zip(columns, r[1:6], strict=True):  # Reference: kind, then these
                column.append(value)
        return out
