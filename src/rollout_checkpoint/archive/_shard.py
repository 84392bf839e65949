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
from collections import deque
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
"""Native buffer of encoded bytes: several row groups (at most ``row_group_bytes`` of payload,
1 MiB by default, each) reach Python in one write."""


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
    """Write-through file: counts and hashes every byte (whole object, and per row group).

    The native buffer in front of it passes bytes on when it is full, so one write may hold the
    end of one row group and the start of the next, and a row group's last bytes may arrive
    long after it was encoded. Row-group ends are therefore registered with :meth:`mark` right
    after each row group is encoded (before the next one starts, so no byte past a boundary can
    arrive before the boundary is known), and each write is split at them: bytes before a
    boundary close that row group's segment, bytes after it start the next. Bytes after the
    last row group (the footer) belong to no segment.
    """

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._sha = hashlib.sha256()
        self._segment: Any = None
        self._segment_start = 0
        self._bounds: deque[int] = deque()  # ends of encoded row groups whose bytes are not all here
        self._tail: bytearray | None = None
        self.spans: list[RowGroupSpan] = []
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        self._inner.write(view)
        self._sha.update(view)
        if self._segment is not None:
            pos, bounds, rest = self.bytes, self._bounds, view
            while bounds and bounds[0] <= pos + len(rest):
                end = bounds.popleft()
                cut = end - pos
                if cut < 0:
                    raise AssertionError("bytes of a row group arrived before its start was marked")
                self._segment.update(rest[:cut])
                self._close_segment(end)
                rest, pos = rest[cut:], end
            self._segment.update(rest)
        if self._tail is not None:
            self._tail += view
        self.bytes += size
        return size

    def _close_segment(self, end: int) -> None:
        start = self._segment_start
        self.spans.append(RowGroupSpan(start, end - start, self._segment.hexdigest()))
        self._segment = hashlib.sha256()
        self._segment_start = end

    def tell(self) -> int:
        return self.bytes

    def begin_segments(self) -> None:
        """Row groups start here (after the leading magic)."""
        self._segment = hashlib.sha256()
        self._segment_start = self.bytes

    def mark(self, end: int) -> None:
        """The row group just encoded ends at byte ``end`` (the encoder thread calls this before
        it encodes the next one, so no byte after ``end`` can reach :meth:`write` earlier)."""
        self._bounds.append(end)

    def end_segments(self) -> None:
        """After the last row group's bytes were handed on: close the segments still open (their
        bytes all arrived before their mark); the footer that follows is no segment."""
        bounds = self._bounds
        while bounds and bounds[0] == self.bytes:
            self._close_segment(bounds.popleft())
        if bounds:
            raise AssertionError("row groups were marked beyond the bytes handed on")
        self._segment = None

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
    """Encodes row groups into ``sink`` as they come; :meth:`close` writes the footer.

    Only the writer's encoder thread may call it once the first row group was handed over:
    pyarrow's stream methods take the stream's lock while holding the GIL, so a second thread
    using the stream while the encoder writes through it to Python could deadlock.
    """

    def __init__(self, sink: BinaryIO, zstd_level: int) -> None:
        self._sink = _HashingSink(sink)
        # Arrow encodes into a native buffer; the bytes reach Python (hash, store stream) only
        # when it is full and at close, so ``write_table`` on the encoder thread takes the GIL
        # about once per buffer, not once per page (a Python write per page would take it ~25
        # times per row group, each time waiting up to 5 ms for the caller's thread).
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
        self._sink.begin_segments()
        self._end = self._sink.bytes
        self._ranges: list[tuple[int, int]] = []  # (offset, length) of each encoded row group
        self.records = 0

    @property
    def spans(self) -> list[RowGroupSpan]:
        """Row groups whose bytes were all handed on (offset, length, SHA-256), in order."""
        return self._sink.spans

    def encode_row_group(self, table: pa.Table) -> tuple[int, int]:
        """Encode one row group (the GIL is released while Arrow works); its byte range."""
        start = self._end
        self._pq.write_table(table, row_group_size=max(1, table.num_rows))
        self._end = end = int(self._out.tell())
        self._sink.mark(end)
        self._ranges.append((start, end - start))
        self.records += table.num_rows
        return start, end - start

    def close(self) -> ClosedShard:
        """Write the footer; check that the footer's row groups are the spans hashed."""
        self._out.flush()
        self._sink.end_segments()
        self._sink.capture_tail()
        self._pq.close()
        self._out.close()  # flushes; closes the hashing sink, never the store stream under it
        tail = self._sink.tail()
        footer_len = int.from_bytes(tail[-8:-4], "little") if len(tail) >= 8 else -1
        if tail[-4:] != _PARQUET_MAGIC or footer_len != len(tail) - 8:
            raise AssertionError("the Parquet writer's footer did not arrive as one tail")
        footer = tail[:-8]
        metadata = metadata_from_footer(footer)
        spans = self.spans
        hashed = [(s.offset, s.length) for s in spans]
        if hashed != self._ranges or hashed != row_group_spans(metadata) or metadata.num_rows != self.records:
            raise AssertionError("row-group byte ranges differ from the ones hashed while writing")
        size = self._sink.bytes
        return ClosedShard(
            size=size,
            sha256=self._sink.hexdigest(),
            records=self.records,
            spans=spans,
            footer=footer,
            footer_offset=size - 8 - len(footer),
        )

    def abandon(self) -> None:
        """Stop without a footer (the caller discards the sink)."""
        with contextlib.suppress(Exception):
            self._pq.close()
        with contextlib.suppress(Exception):
            self._out.close()
