"""Decoded records over a component archive.

The archive layer reads raw members (kind, identity, key, payload bytes) and knows nothing of
the record models; :class:`ArchiveReader` adds what this format defines on top: decoding each
payload into its record model (:func:`~rollout_checkpoint.format.records.decode_record`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..archive import RawArchiveReader
from .records import Record, decode_record

__all__ = ["ArchiveReader"]


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
