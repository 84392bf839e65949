"""The reference table of an archive that stores nothing and refers to every member of other
archives (a worker group's component over its workers' parts), built in Arrow.

Built as Python lists, a group of 100,000 rollouts made every member's identity, refs text and
location a Python object each, twice over with the duplicate check's set: the largest part of a
group supervisor's memory peak (+160-180 MB at 100,000 rollouts). Here the columns are the
parts' own index and reference-table columns (no copy), and the duplicate check counts distinct
identities in Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ._index import scalar
from ._references import REFERENCE_SCHEMA
from ._referring import ReferringArchive

__all__ = ["UnitedReferences"]

_SEPARATOR = "\x00"
"""Between the identity fields of the duplicate check's key: no identity field holds a control
character (ids and keys are checked when written), so equal keys mean equal identities; a
malformed field could only make two different identities look alike, which refuses the commit."""


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
        from pyarrow._compute import call_function  # not pyarrow.compute: see _index.compute

        columns = reader.reference_arrays()
        for i, column in enumerate(columns):
            if i == 6 and len(column):
                column = call_function("take", [pa.array(bases, type=pa.int32()), column])
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
        """How many rows repeat an identity (kind, rollout id, attempt, key) of an earlier row."""
        from pyarrow._compute import call_function

        kind, rollout_id, attempt, key = self.columns()[:4]
        if not len(kind):
            return 0
        joined = call_function(
            "binary_join_element_wise",
            [kind, rollout_id, call_function("cast", [attempt], _to_string()), key, scalar(_SEPARATOR)],
        )
        distinct = call_function("count_distinct", [joined]).as_py()
        return len(kind) - int(distinct)


def _to_string() -> object:
    from pyarrow._compute import CastOptions

    return CastOptions.safe(pa.string())
