"""One shard being encoded: Parquet row groups streamed through SHA-256 into a sink.

The sink is either an in-memory buffer (uploaded with one ``put`` when the shard is closed) or a
store's streaming writer (``ObjectStore.open_write``: a temp file on local disk, a multipart
upload on S3), so that the writer's memory does not grow with the shard size. Either way every
byte is hashed once, on its way out: the whole shard's SHA-256, and per row group the SHA-256 of
exactly the bytes ``ParquetWriter.write_table`` produced for it (a row group's byte range, which
the member index records for one-GET lookups). The footer bytes are captured as they pass, so
nothing is read back.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import io
from dataclasses import dataclass
from typing import Any, BinaryIO

import pyarrow as pa

from ._index import RowGroupSpan, metadata_from_footer, row_group_spans
from ._parquet_io import open_parquet_writer
from ._schema import (
    SHARD_DICTIONARY_COLUMNS,
    SHARD_SCHEMA,
    SHARD_STATISTICS_COLUMNS,
)

__all__ = ["ClosedShard", "ShardStream", "encoding_pool"]

_PARQUET_MAGIC = b"PAR1"
_BUFFER_BYTES = 1 << 20
"""Native buffer of encoded bytes: a row group (at most ``row_group_bytes`` of payload, 1 MiB by
default) normally fits, compressed, so it reaches Python in one piece."""


@functools.cache
def encoding_pool() -> pa.MemoryPool:
    """The Arrow memory pool the writer encodes with: jemalloc where pyarrow has it.

    Arrow's default pool (mimalloc) keeps pages it got back for reuse; for the writer's pattern
    (a row group allocated, encoded and freed, over and over) that left about 30 MiB more
    resident than jemalloc in ``benchmarks/peer_store.py``. A pool of its own leaves the
    process's default untouched.
    """
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


class _HashingSink(io.RawIOBase):
    """Write-through file: counts and hashes every byte (whole object and current segment)."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._sha = hashlib.sha256()
        self._segment: Any = None
        self._tail: bytearray | None = None
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._inner.write(view)
        self._sha.update(view)
        if self._segment is not None:
            self._segment.update(view)
        if self._tail is not None:
            self._tail += view
        self.bytes += len(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes

    def begin_segment(self) -> int:
        self._segment = hashlib.sha256()
        return self.bytes

    def end_segment(self, start: int) -> RowGroupSpan:
        digest = self._segment.hexdigest()
        self._segment = None
        return RowGroupSpan(start, self.bytes - start, digest)

    def capture_tail(self) -> None:
        self._tail = bytearray()

    def tail(self) -> bytes:
        return bytes(self._tail or b"")

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


@dataclass
class ClosedShard:
    """What the manifest and the index need of a closed shard."""

    size: int
    sha256: str
    records: int
    spans: list[RowGroupSpan]
    footer: builtins.bytes
    footer_offset: int


class ShardStream:
    """Encodes row groups into ``sink`` as they come; :meth:`close` writes the footer."""

    def __init__(self, sink: BinaryIO, zstd_level: int) -> None:
        self._sink = _HashingSink(sink)
        # Arrow encodes into a native buffer; the bytes reach Python (hash, store stream) only in
        # :meth:`finish_row_group`, which the writer calls on its own thread. The encoder thread
        # thus runs ``write_table`` without touching Python objects: a Python write per page
        # would take the GIL ~25 times per row group, each time waiting for the caller's thread.
        self._out = pa.BufferedOutputStream(
            pa.PythonFile(self._sink, mode="w"), _BUFFER_BYTES, memory_pool=encoding_pool()
        )
        self._pq = open_parquet_writer(
            self._out,
            SHARD_SCHEMA,
            compression="zstd",
            compression_level=zstd_level,
            use_dictionary=SHARD_DICTIONARY_COLUMNS,
            write_statistics=SHARD_STATISTICS_COLUMNS,
            write_page_index=False,
            memory_pool=encoding_pool(),
        )
        self._out.flush()  # the leading magic, so that row group 0 starts a segment of its own
        self._start = self._sink.begin_segment()
        self._encoded: list[tuple[int, int, int]] = []  # (offset, length, rows) awaiting finish
        self.encoded_row_groups = 0
        self.spans: list[RowGroupSpan] = []
        self.records = 0

    @property
    def bytes(self) -> int:
        """Bytes encoded so far (handed to the sink or still in the native buffer)."""
        return int(self._out.tell())

    def encode_row_group(self, table: pa.Table) -> tuple[int, int]:
        """Encode one row group (any thread; the GIL is released while Arrow works); its byte
        range. Bytes that do not fit the native buffer go to the sink now, so only one thread
        may use this stream at a time; :meth:`finish_row_group` must follow before the next."""
        start = int(self._out.tell())
        self._pq.write_table(table, row_group_size=max(1, table.num_rows))
        length = int(self._out.tell()) - start
        self._encoded.append((start, length, table.num_rows))
        self.encoded_row_groups += 1
        return start, length

    def finish_row_group(self) -> RowGroupSpan:
        """Hand the encoded row group to the sink; its byte range and SHA-256 (segments run
        from one row-group boundary to the next, so bytes passed on early are covered too)."""
        self._out.flush()
        span = self._sink.end_segment(self._start)
        self._start = self._sink.begin_segment()
        offset, length, rows = self._encoded.pop(0)
        if (span.offset, span.length) != (offset, length):
            raise AssertionError("the bytes handed on differ from the row group's encoded range")
        self.spans.append(span)
        self.records += rows
        return span

    def write_row_group(self, table: pa.Table) -> RowGroupSpan:
        """:meth:`encode_row_group` then :meth:`finish_row_group`, on one thread."""
        self.encode_row_group(table)
        return self.finish_row_group()

    def close(self) -> ClosedShard:
        """Write the footer; check that the footer's row groups are the spans hashed."""
        self._sink.end_segment(self._start)
        self._sink.capture_tail()
        self._pq.close()
        self._out.close()  # flushes; closes the hashing sink, never the store stream under it
        tail = self._sink.tail()
        footer_len = int.from_bytes(tail[-8:-4], "little") if len(tail) >= 8 else -1
        if tail[-4:] != _PARQUET_MAGIC or footer_len != len(tail) - 8:
            raise AssertionError("the Parquet writer's footer did not arrive as one tail")
        footer = tail[:-8]
        metadata = metadata_from_footer(footer)
        if [(s.offset, s.length) for s in self.spans] != row_group_spans(metadata) or (
            metadata.num_rows != self.records
        ):
            raise AssertionError("row-group byte ranges differ from the ones hashed while writing")
        size = self._sink.bytes
        return ClosedShard(
            size=size,
            sha256=self._sink.hexdigest(),
            records=self.records,
            spans=self.spans,
            footer=footer,
            footer_offset=size - 8 - len(footer),
        )

    def abandon(self) -> None:
        """Stop without a footer (the caller discards the sink)."""
        with contextlib.suppress(Exception):
            self._pq.close()
        with contextlib.suppress(Exception):
            self._out.close()
