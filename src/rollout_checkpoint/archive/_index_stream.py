"""The writer's member index: one store object streamed while the shards are written.

Rows go in row group by row group (``IndexWriter``), so the writer never holds the index. If the
stream fails it is dropped, not raised (the shards are still good), and commit writes it again
from the uploaded shards' member columns. At commit the duplicate check reads the closed index
back for the few members whose identity hashes collide.
"""

from __future__ import annotations

import contextlib
from array import array
from itertools import pairwise

import pyarrow as pa

from ..store import ObjectStore
from ._index import IndexWriter, RowGroupSpan, compute
from ._parquet_io import open_parquet_file
from ._schema import INDEX_MEMBER_COLUMNS
from ._shard import encoding_pool

__all__ = ["IndexStream", "colliding_positions"]

Ident = tuple[str, str, int, str]


class IndexStream:
    """The member index object ``key`` of one writer; not thread-safe (one thread at a time)."""

    def __init__(self, store: ObjectStore, key: str, zstd_level: int) -> None:
        self.store = store
        self.key = key
        self.zstd_level = zstd_level
        self.writer: IndexWriter | None = None
        self.stale = False  # the stream failed: close() rebuilds it from the shards
        self._stack: contextlib.ExitStack | None = None

    def _open(self) -> IndexWriter:
        stack = contextlib.ExitStack()
        sink = stack.enter_context(self.store.open_write(self.key))
        self._stack = stack
        self.writer = IndexWriter(sink, self.zstd_level, encoding_pool())
        return self.writer

    def drop(self, exc: BaseException) -> None:
        """Abandon the stream (the store discards the partial object)."""
        writer, stack = self.writer, self._stack
        self.writer = None
        self._stack = None
        if writer is not None:
            writer.close()
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.__exit__(type(exc), exc, exc.__traceback__)

    def add(self, shard: int, row_group: int, table: pa.Table, offset: int, length: int) -> None:
        """Stream one encoded row group's index rows. A failing stream is dropped, not raised."""
        if self.stale:
            return
        try:
            writer = self.writer or self._open()
            writer.add_row_group(shard, row_group, table, offset, length)
        except Exception as exc:
            self.stale = True
            self.drop(exc)

    def _rebuild(self, shard_keys: list[str], spans: list[list[RowGroupSpan]]) -> IndexWriter:
        """Stream the index again from the uploaded shards' member columns (after a failure)."""
        writer = self._open()
        for key, shard_spans in zip(shard_keys, spans, strict=True):
            with self.store.open_read(key) as fh:
                pf = open_parquet_file(fh)
                row_groups = [
                    pf.read_row_group(rg, columns=INDEX_MEMBER_COLUMNS, use_threads=False)
                    for rg in range(pf.num_row_groups)
                ]
            writer.add_shard(row_groups, shard_spans)
        return writer

    def close(
        self, shard_keys: list[str], spans: list[list[RowGroupSpan]], footers: list[bytes]
    ) -> tuple[int, str, int]:
        """Finish the object (it becomes visible); its byte length, SHA-256 and row count.

        A stream that failed (while the shards were written, or now, writing its last bytes) is
        rebuilt here from the uploaded shards (``shard_keys``). Any other failure now is raised;
        the next call rebuilds and tries again. Runs on the writer's encoder thread.
        """
        try:
            finished: tuple[int, str] | None = None
            if not self.stale:
                try:  # the stream's last bytes go out now (it buffers up to a MiB natively);
                    # an archive with no row groups opens its index only now
                    writer = self.writer or self._open()
                    finished = writer.finish(spans, footers)
                except Exception as exc:  # a failed stream is rebuilt, as during the writes
                    self.stale = True
                    self.drop(exc)
            if finished is None:
                writer = self._rebuild(shard_keys, spans)
                self.stale = False
                finished = writer.finish(spans, footers)
            rows = writer.rows
            size, digest = finished
            stack = self._stack
            self.writer = None
            self._stack = None
            if stack is not None:
                stack.close()  # the object becomes visible here
        except BaseException as exc:
            self.stale = True
            self.drop(exc)
            raise
        return size, digest, rows

    def first_duplicate(self, positions: list[int]) -> Ident | None:
        """The first identity that occurs twice among the members at ``positions`` (read back
        from the closed index), or None when their hashes only collide."""
        cols = ["kind", "rollout_id", "attempt", "key"]
        seen: set[Ident] = set()
        with self.store.open_read(self.key) as fh:
            pf = open_parquet_file(fh)
            start = 0
            for rg in range(pf.num_row_groups):
                n = pf.metadata.row_group(rg).num_rows
                local = [p - start for p in positions if start <= p < start + n]
                if local:
                    table = pf.read_row_group(rg, columns=cols, use_threads=False).take(local)
                    for row in zip(*(table[c].to_pylist() for c in cols), strict=True):
                        if row in seen:
                            return row
                        seen.add(row)
                start += n
        return None


SORT_IN_PYTHON = 1 << 18
"""Up to this many members the hashes are sorted in Python (about 40 bytes per member for the
moment of the check); above, in Arrow (16 bytes per member), whose compute kernels cost about
7 MB of resident memory to import, more than the Python sort of a small archive."""


def colliding_positions(hashes: array[int]) -> list[int]:
    """Positions of the members whose 64-bit hash equals another member's."""
    n = len(hashes)
    if n < 2:
        return []
    if n <= SORT_IN_PYTHON:
        ordered = sorted(hashes)
        colliding_hashes = {a for a, b in pairwise(ordered) if a == b}
        del ordered
        if not colliding_hashes:
            return []
        return [i for i, h in enumerate(hashes) if h in colliding_hashes]
    return _colliding_positions_arrow(hashes)


def _colliding_positions_arrow(hashes: array[int]) -> list[int]:
    """:func:`colliding_positions` sorted in Arrow."""
    n = len(hashes)
    values = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(hashes)])
    ordered = compute("take", values, compute("sort_indices", values))
    equal = compute("equal", ordered.slice(1), ordered.slice(0, n - 1))
    if not compute("any", equal).as_py():
        return []
    colliding = compute("unique", compute("filter", ordered.slice(1), equal))
    from pyarrow._compute import SetLookupOptions

    in_set = compute("is_in", values, options=SetLookupOptions(colliding))
    return [int(p) for p in compute("indices_nonzero", in_set).to_pylist()]
