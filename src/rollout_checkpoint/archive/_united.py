"""The reference table of an archive that stores nothing and refers to every member of other
archives (a worker group's component over its workers' parts), built in Arrow.

Built as Python lists, a group of 100,000 rollouts made every member's identity, refs text and
location a Python object each, twice over with the duplicate check's set: the largest part of a
group supervisor's memory peak (+160-180 MB at 100,000 rollouts). Here the columns are the
parts' own index and reference-table columns (no copy), and the duplicate check counts distinct
identities in Arrow (sorted, each row compared with the one before).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ._index import compute
from ._references import REFERENCE_SCHEMA
from ._referring import ReferringArchive

__all__ = ["UnitedReferences"]


class UnitedReferences:
    """Reference-table columns over several archives, in ``REFERENCE_SCHEMA`` order."""

    def __init__(self) -> None:
        self._chunks: list[list[pa.Array | pa.ChunkedArray]] = [[] for _ in REFERENCE_SCHEMA]

    def add_stored(self, reader: ReferringArchive, base: int) -> None:
        """Every member ``reader`` stores, referred to in it (``base``: its position)."""
        stored = reader.stored_arrays()  # kind .. refs, shard, row_group, row
        rows = len(stored[0])
        for i in range(6):
            self._chunks[i].append(stored[i])
        self._chunks[6].append(pa.repeat(pa.array([base], type=pa.int32())[0], rows))
        for i in range(3):
            self._chunks[7 + i].append(stored[6 + i])

    def add_references(self, reader: ReferringArchive, bases: Sequence[int]) -> None:
        """Every member ``reader`` refers to, referred to in the same archive: its base ``b``
        becomes ``bases[b]``."""
        columns = reader.reference_arrays()
        for i, column in enumerate(columns):
            if i == 6 and len(column):
                column = compute("take", pa.array(bases, type=pa.int32()), column)
            self._chunks[i].append(column)

    def columns(self) -> list[pa.ChunkedArray]:
        """The united columns (for :meth:`ArchiveWriter.refer`)."""
        out = []
        for chunks, field in zip(self._chunks, REFERENCE_SCHEMA, strict=True):
            pieces: list[pa.Array] = []
            for chunk in chunks:
                chunk = chunk if chunk.type == field.type else chunk.cast(field.type)
                pieces.extend(chunk.chunks if isinstance(chunk, pa.ChunkedArray) else [chunk])
            out.append(pa.chunked_array(pieces, type=field.type))
        return out

    def repeated(self) -> int:
        """How many rows repeat an identity (kind, rollout id, attempt, key) of another row: the
        identities sorted, then each row compared with the one before it, in Arrow. (Counting
        distinct identities joined into strings took 130 MB more at 400,000 rows, and a second.)"""
        from pyarrow._compute import SortOptions  # not pyarrow.compute: see _index.compute

        kind, rollout_id, attempt, key = self.columns()[:4]
        rows = len(kind)
        if rows < 2:
            return 0
        names = ("rollout_id", "kind", "key", "attempt")
        table = pa.table({"kind": kind, "rollout_id": rollout_id, "attempt": attempt, "key": key})
        order = compute("sort_indices", table, options=SortOptions([(n, "ascending") for n in names]))
        ordered = compute("take", table, order)
        same: pa.ChunkedArray | None = None
        for name in names:
            column = ordered.column(name)
            equal = compute("equal", column.slice(1), column.slice(0, rows - 1))
            same = equal if same is None else compute("and", same, equal)
        return int(compute("sum", same).as_py() or 0)
