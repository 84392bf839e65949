"""The writer's open row group: Arrow record batches built in bulk, plus a short tail of members
appended one at a time.

A batch slice (``write_columns`` / ``write_records``) becomes one Arrow record batch at once: its
payloads are joined into one buffer (a single copy) and the offsets are computed from their
lengths, so no Arrow call and no Python object is made per member. Members appended one by one
(``write`` / ``write_raw``) are kept as column lists until the next batch slice or the end of the
row group, then converted the same way. The row group is the concatenation of those parts, in
write order.
"""

from __future__ import annotations

from array import array
from itertools import accumulate
from typing import Any

import pyarrow as pa

from ._bulk import Batch, PackedPayloads
from ._schema import SHARD_SCHEMA

__all__ = ["OpenRowGroup", "payload_array"]

Ident = tuple[str, str, int, str]
_MAX_BINARY = (1 << 31) - 1
"""Largest total of one ``pa.binary()`` array (32-bit offsets)."""


def payload_array(payloads: list[bytes], total: int) -> pa.Array:
    """A binary array of ``payloads`` (``total`` bytes together): one join, offsets from lengths."""
    n = len(payloads)
    if total > _MAX_BINARY:
        return pa.array(payloads, pa.binary())  # raises Arrow's own capacity error
    offsets = array("i", accumulate(map(len, payloads), initial=0))
    data = pa.py_buffer(b"".join(payloads))
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])


def _batch(
    kinds: Any,
    rollout_ids: list[str],
    attempts: list[int],
    keys: list[str],
    schema_versions: Any,
    revisions: list[int | None],
    refs: list[str | None],
    payloads: pa.Array,
    pool: pa.MemoryPool,
) -> pa.RecordBatch:
    n = len(payloads)
    arrays = [
        kinds if isinstance(kinds, pa.Array) else pa.array(kinds, pa.string(), memory_pool=pool),
        pa.array(rollout_ids, pa.string(), memory_pool=pool),
        pa.array(attempts, pa.int64(), memory_pool=pool),
        pa.array(keys, pa.string(), memory_pool=pool),
        schema_versions
        if isinstance(schema_versions, pa.Array)
        else pa.array(schema_versions, pa.int32(), memory_pool=pool),
        pa.array(revisions, pa.int64(), memory_pool=pool),
        pa.array(refs, pa.string(), memory_pool=pool),
        payloads,
    ]
    if any(len(a) != n for a in arrays):
        raise AssertionError("columns of one row-group part differ in length")
    return pa.RecordBatch.from_arrays(arrays, schema=SHARD_SCHEMA)


class OpenRowGroup:
    """Arrow parts plus a tail of column lists (shard-schema order), the payload bytes, and the
    members' identity hashes (for the exact duplicate check of :meth:`contains`)."""

    def __init__(self, pool: pa.MemoryPool) -> None:
        self._pool = pool
        self.parts: list[pa.RecordBatch] = []
        self._part_rows = 0
        self._new_tail()
        self.payload_bytes = 0
        self.seen: set[int] = set()

    def _new_tail(self) -> None:
        self.kinds: list[str] = []
        self.rollout_ids: list[str] = []
        self.attempts: list[int] = []
        self.keys: list[str] = []
        self.schema_versions: list[int] = []
        self.revisions: list[int | None] = []
        self.refs: list[str | None] = []
        self.payloads: list[bytes] = []
        self._tail_bytes = 0

    def __len__(self) -> int:
        return self._part_rows + len(self.payloads)

    def append(
        self,
        ident: Ident,
        ident_hash: int,
        schema_version: int,
        revision: int | None,
        refs: str | None,
        payload: bytes,
    ) -> None:
        kind, rollout_id, attempt, key = ident
        self.seen.add(ident_hash)
        self.kinds.append(kind)
        self.rollout_ids.append(rollout_id)
        self.attempts.append(attempt)
        self.keys.append(key)
        self.schema_versions.append(schema_version)
        self.revisions.append(revision)
        self.refs.append(refs)
        self.payloads.append(payload)
        self.payload_bytes += len(payload)
        self._tail_bytes += len(payload)

    def extend(self, batch: Batch, start: int, end: int, schema_version: int, payload_bytes: int) -> None:
        """Append members ``[start, end)`` of ``batch`` (their payloads total ``payload_bytes``)
        as one Arrow part."""
        n = end - start
        self._seal_tail()
        pool = self._pool
        payloads = batch.payloads
        part = _batch(
            pa.repeat(pa.scalar(batch.kind, pa.string()), n, memory_pool=pool),
            batch.rollout_ids[start:end],
            batch.attempts[start:end],
            batch.keys[start:end],
            pa.repeat(pa.scalar(schema_version, pa.int32()), n, memory_pool=pool),
            batch.revisions[start:end],
            batch.refs[start:end],
            payloads.arrow(start, end)
            if isinstance(payloads, PackedPayloads)
            else payload_array(payloads[start:end], payload_bytes),
            pool,
        )
        self.parts.append(part)
        self._part_rows += n
        self.seen.update(batch.hashes[start:end])
        self.payload_bytes += payload_bytes

    def _seal_tail(self) -> None:
        """Turn the members appended one by one into an Arrow part."""
        if not self.payloads:
            return
        part = _batch(
            self.kinds,
            self.rollout_ids,
            self.attempts,
            self.keys,
            self.schema_versions,
            self.revisions,
            self.refs,
            payload_array(self.payloads, self._tail_bytes),
            self._pool,
        )
        self.parts.append(part)
        self._part_rows += part.num_rows
        self._new_tail()

    def contains(self, ident: Ident) -> bool:
        """Exact membership (callers ask only when the identity's hash is in :attr:`seen`)."""
        kind, rollout_id, attempt, key = ident
        for i, k in enumerate(self.keys):
            if (
                k == key
                and self.kinds[i] == kind
                and self.rollout_ids[i] == rollout_id
                and self.attempts[i] == attempt
            ):
                return True
        for part in self.parts:
            columns = [part.column(name).to_pylist() for name in ("kind", "rollout_id", "attempt", "key")]
            if ident in zip(*columns, strict=True):
                return True
        return False

    def table(self) -> pa.Table:
        """The row group as one table (its parts are the table's chunks)."""
        self._seal_tail()
        return pa.Table.from_batches(self.parts, schema=SHARD_SCHEMA)
