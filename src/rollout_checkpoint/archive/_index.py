"""The member index: one Parquet object per archive mapping each member to (shard, row group, row).

The writer streams it (:class:`IndexWriter`) into one store object while the shards are written,
so its rows never accumulate in memory.

Besides one row per member, the index's key-value metadata carries, per shard, every row group's
byte range and SHA-256 and the shard's raw Parquet footer. A reader that holds the (digest-checked)
index can therefore fetch one member with exactly one ranged GET of one row group, check that
range's own digest, and decode it without touching the shard's footer on the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa

from ..errors import InvalidRecordError
from ._parquet_io import open_parquet_file, open_parquet_writer, read_footer_metadata
from ._schema import (
    INDEX_FORMAT_VERSION,
    INDEX_MEMBER_COLUMNS,
    INDEX_META_KEY,
    INDEX_SCHEMA,
    footer_meta_key,
)

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = ["IndexWriter", "MemberIndex", "MemberRef", "RowGroupSpan", "compute", "index_metadata"]


@dataclass(frozen=True, slots=True)
class MemberRef:
    """One member as the index describes it (no payload). ``refs`` is the parsed
    ``Record.index_refs()`` JSON, ``revision`` is ``Record.index_revision()``."""

    kind: str
    rollout_id: str
    attempt: int
    key: str
    revision: int | None
    refs: dict[str, Any] | None
    shard: int
    row_group: int
    row: int
    base: int | None = None
    """Version 2: the position in the manifest's ``bases`` of the archive that stores this member
    (``shard``, ``row_group``, ``row`` are then its location there); ``None``: stored here."""


@dataclass(frozen=True, slots=True)
class RowGroupSpan:
    """Byte range ``[offset, offset + length)`` of one row group inside its shard, and its digest."""

    offset: int
    length: int
    sha256: str


def row_group_spans(metadata: pq.FileMetaData) -> list[tuple[int, int]]:
    """(offset, length) of every row group: from its first column chunk's first page to the end
    of its last column chunk (dictionary pages included)."""
    spans: list[tuple[int, int]] = []
    for i in range(metadata.num_row_groups):
        rg = metadata.row_group(i)
        start: int | None = None
        end = 0
        for c in range(rg.num_columns):
            col = rg.column(c)
            first = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            start = first if start is None else min(start, first)
            end = max(end, first + col.total_compressed_size)
        spans.append((start or 0, end - (start or 0)))
    return spans


def metadata_from_footer(footer: bytes) -> pq.FileMetaData:
    """Parse a raw Parquet footer (thrift FileMetaData without the trailing length and magic)."""
    framed = b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"
    return read_footer_metadata(pa.BufferReader(framed))


INDEX_ROW_GROUP_ROWS = 1 << 16
"""Largest row group of the member index."""
INDEX_FLUSH_ROWS = 1 << 13
"""The writer buffers index rows until it has at least this many, then writes them as one row
group: about 1.5 MB of index rows in memory. Building and encoding that row group shows as a
short +5-10 MB spike in the writer's RSS; 2,048 rows removed it, but made a cold lookup (which
decodes the index's key columns) about 30% slower, so the index keeps the larger row groups."""

_INDEX_BUFFER_BYTES = 1 << 20
INDEX_DICTIONARY_COLUMNS = [
    "kind",
    "attempt",
    "key",
    "revision",
    "shard",
    "row_group",
    "rg_offset",
    "rg_length",
]
"""Columns whose values repeat (per archive, or per row group of a shard); rollout ids, refs and
row numbers are (nearly) unique per member, so a dictionary there costs hashing and saves nothing."""
INDEX_STATISTICS_COLUMNS = ["kind", "rollout_id", "attempt", "key", "shard"]
_SCAN_LOOKUPS = 16
_LOOKUP_COLUMNS = ("kind", "rollout_id", "attempt", "key", "shard", "row_group", "row")
"""Lookups answered by an Arrow scan of the index before a dict of every member is built."""


class _DigestSink(io.RawIOBase):
    """Write-through file that counts and SHA-256-hashes every byte on its way to ``inner``."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self._sha = hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)
        self._inner.write(view)
        self.bytes += len(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class IndexWriter:
    """Writer side: streams the member index into ``sink`` (a store ``open_write`` file) row group
    by row group, hashing and counting the bytes as they pass. It buffers at most
    ``INDEX_FLUSH_ROWS`` rows plus one row group: nothing per member outlives that. The key-value
    metadata (row-group spans and footers: per shard and row group, not per member) is handed to
    :meth:`finish` and written into the Parquet footer.
    """

    def __init__(self, sink: BinaryIO, zstd_level: int, memory_pool: pa.MemoryPool | None = None) -> None:
        self._sink = _DigestSink(sink)
        # a native buffer in front of the Python sink: the Parquet writer calls Python (and so
        # takes the GIL) once per MiB rather than once per page
        self._out = pa.BufferedOutputStream(
            pa.PythonFile(self._sink, mode="w"), _INDEX_BUFFER_BYTES, memory_pool=memory_pool
        )
        self._pq = open_parquet_writer(
            self._out,
            INDEX_SCHEMA,
            compression="zstd",
            compression_level=zstd_level,
            write_statistics=INDEX_STATISTICS_COLUMNS,
            use_dictionary=INDEX_DICTIONARY_COLUMNS,
            memory_pool=memory_pool,
        )
        self._pool = memory_pool
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self.shards = 0
        self.rows = 0

    def add_row_group(self, shard: int, row_group: int, table: pa.Table, offset: int, length: int) -> None:
        """Add the rows of one row group (``table`` holds its member columns) at byte range
        ``[offset, offset + length)`` of its shard, in write order."""
        n = table.num_rows
        cols = [table.column(name) for name in INDEX_MEMBER_COLUMNS]
        pool = self._pool
        cols += [
            pa.repeat(pa.scalar(shard, pa.int32()), n, memory_pool=pool),
            pa.repeat(pa.scalar(row_group, pa.int32()), n, memory_pool=pool),
            pa.array(range(n), pa.int32(), memory_pool=pool),
            pa.repeat(pa.scalar(offset, pa.int64()), n, memory_pool=pool),
            pa.repeat(pa.scalar(length, pa.int64()), n, memory_pool=pool),
        ]
        self._buffer.append(pa.Table.from_arrays(cols, schema=INDEX_SCHEMA))
        self._buffered += n
        self.rows += n
        self.shards = max(self.shards, shard + 1)
        if self._buffered >= INDEX_FLUSH_ROWS:
            self._flush()

    def add_shard(self, row_groups: list[pa.Table], spans: list[RowGroupSpan]) -> None:
        """Add the next shard whole: ``row_groups[i]`` holds the member columns of row group ``i``."""
        shard = self.shards
        if len(row_groups) != len(spans):
            raise AssertionError("one span per row group expected")
        for rg, (table, span) in enumerate(zip(row_groups, spans, strict=True)):
            self.add_row_group(shard, rg, table, span.offset, span.length)
        self.shards = shard + 1

    def _flush(self) -> None:
        """Write the buffered rows (row groups of at most ``INDEX_ROW_GROUP_ROWS``)."""
        if self._buffered:
            self._pq.write_table(
                pa.concat_tables(self._buffer, memory_pool=self._pool), row_group_size=INDEX_ROW_GROUP_ROWS
            )
        self._buffer = []
        self._buffered = 0

    def finish(self, spans: list[list[RowGroupSpan]], footers: list[bytes]) -> tuple[int, str]:
        """Write the remaining rows and the footer (with the spans and shard footers as key-value
        metadata); return the index's byte length and SHA-256. The caller closes the sink."""
        if len(spans) != self.shards or len(footers) != self.shards:
            raise AssertionError("spans and footers of every added shard expected")
        self._flush()
        self._pq.add_key_value_metadata(index_metadata(spans, footers))
        self._pq.close()
        self._out.close()  # flushes; closes the digest sink, never the store stream under it
        return self._sink.bytes, self._sink.hexdigest()

    def close(self) -> None:
        """Stop without finishing (the caller discards the sink)."""
        with contextlib.suppress(Exception):
            self._pq.close()
        with contextlib.suppress(Exception):
            self._out.close()
        self._buffer = []


def index_metadata(spans: list[list[RowGroupSpan]], footers: list[bytes]) -> dict[bytes, bytes]:
    """The index's key-value metadata: row-group spans of every shard and every shard's footer."""
    meta: dict[bytes, bytes] = {
        INDEX_META_KEY: json.dumps(
            {
                "format": INDEX_FORMAT_VERSION,
                "shards": [{"row_groups": [[s.offset, s.length, s.sha256] for s in rgs]} for rgs in spans],
            },
            separators=(",", ":"),
        ).encode()
    }
    for shard, footer in enumerate(footers):
        meta[footer_meta_key(shard)] = footer
    return meta


def compute(name: str, *args: Any, options: Any = None) -> Any:
    """Call an Arrow compute kernel by name. ``pyarrow.compute`` re-exports ``call_function``
    from ``pyarrow._compute``; importing only the latter skips generating a Python wrapper for
    every kernel (about 30-80 ms and 2 MiB), which a cold lookup would otherwise pay."""
    from pyarrow._compute import call_function

    return call_function(name, list(args), options)


def value_counts(column: Any) -> dict[str, int]:
    """How many times each string of an Arrow column occurs (a kind column's per-kind counts)."""
    return {str(row["values"]): int(row["counts"]) for row in compute("value_counts", column).to_pylist()}


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def scalar(value: str | int) -> pa.Scalar:
    """An Arrow ``string`` / ``int64`` scalar of ``value``, built from its bytes.

    ``pa.scalar`` (and a compute kernel given a Python value) converts through code that first
    asks whether the value is a pandas object, which imports pandas when it is installed: about
    70 ms, once per process, that a cold lookup of one member would otherwise pay."""
    if isinstance(value, str):
        data = value.encode()
        offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
        return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(struct.pack("<q", value))])[0]


def int64_array(values: list[int]) -> pa.Array:
    """An Arrow ``int64`` array of ``values`` built from their bytes (see :func:`scalar`: ``pa.array``
    of a Python list imports pandas too)."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(array("q", values))])


class MemberIndex:
    """Reader side: the parsed index of one archive (built from digest-checked bytes).

    Columns are decoded on first use: a cold lookup decodes the identity columns only, never
    ``refs`` (the largest)."""

    def __init__(self, pf: pq.ParquetFile, spans: list[list[RowGroupSpan]], footers: list[bytes]) -> None:
        self._pf = pf
        self._columns: dict[str, pa.ChunkedArray] = {}
        self._table: pa.Table | None = None
        self.spans = spans
        self._footers = footers
        self._metadata: dict[int, pq.FileMetaData] = {}
        self._positions: dict[tuple[str, str, int, str], int] | None = None
        self._lookups = 0
        self._located: dict[int, tuple[int, int, int]] = {}  # position -> (shard, row group, row)

    @classmethod
    def from_bytes(cls, data: bytes, shard_count: int) -> MemberIndex:
        """Parse index bytes; ``InvalidRecordError`` when they do not describe ``shard_count`` shards."""
        try:
            pf = open_parquet_file(pa.BufferReader(data))
            schema = pf.schema_arrow
            # file key-value metadata: the writer adds it when it closes the index (it is not in
            # the Arrow schema stored at the start of the stream)
            meta = pf.metadata.metadata or {}
            info = json.loads(meta[INDEX_META_KEY])
            if info.get("format") != INDEX_FORMAT_VERSION:
                raise InvalidRecordError(f"unsupported member index format {info.get('format')!r}")
            spans = [
                [RowGroupSpan(int(o), int(n), str(h)) for o, n, h in s["row_groups"]] for s in info["shards"]
            ]
            footers = [bytes(meta[footer_meta_key(i)]) for i in range(len(spans))]
        except InvalidRecordError:
            raise
        except (pa.ArrowException, KeyError, ValueError, TypeError) as exc:
            raise InvalidRecordError(f"member index is not readable: {exc}") from None
        if len(spans) != shard_count:
            raise InvalidRecordError(
                f"member index describes {len(spans)} shards, the manifest {shard_count}"
            )
        if not schema.remove_metadata().equals(INDEX_SCHEMA):
            raise InvalidRecordError("member index columns do not match the index schema")
        return cls(pf, spans, footers)

    def column(self, name: str) -> pa.ChunkedArray:
        """One index column, decoded once."""
        col = self._columns.get(name)
        if col is None:
            self.load(name)
            col = self._columns[name]
        return col

    def load(self, *names: str) -> None:
        """Decode the columns ``names`` not decoded yet, in one read."""
        missing = [name for name in names if name not in self._columns]
        if not missing:
            return
        try:
            table = self._pf.read(columns=missing, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise InvalidRecordError(f"member index columns {missing} are not readable: {exc}") from None
        for name in missing:
            self._columns[name] = table.column(name)

    @property
    def table(self) -> pa.Table:
        """Every column (decoded on first use)."""
        if self._table is None:
            self._table = pa.Table.from_arrays(
                [self.column(name) for name in INDEX_SCHEMA.names], schema=INDEX_SCHEMA
            )
        return self._table

    @property
    def rows(self) -> int:
        return int(self._pf.metadata.num_rows)

    def footer_metadata(self, shard: int) -> pq.FileMetaData:
        """Parsed footer of ``shard`` (cached: parsing costs ~0.1 ms per row group)."""
        md = self._metadata.get(shard)
        if md is None:
            md = metadata_from_footer(self._footers[shard])
            self._metadata[shard] = md
        return md

    def counts(self) -> dict[str, int]:
        """Members per kind: from the row groups' statistics when each group holds one kind (the
        writer stores them for ``kind``: a cold lookup then decodes no column to check the
        manifest's counts), else by counting the decoded column."""
        from_stats = self._counts_from_statistics()
        if from_stats is not None:
            return from_stats
        return value_counts(self.column("kind"))

    def _counts_from_statistics(self) -> dict[str, int] | None:
        metadata = self._pf.metadata
        column = self._pf.schema_arrow.get_field_index("kind")
        out: dict[str, int] = {}
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            stats = group.column(column).statistics
            if (
                stats is None
                or not stats.has_min_max
                or not stats.has_null_count
                or stats.null_count != 0
                or stats.min != stats.max
                or not isinstance(stats.min, str)
            ):
                return None  # a group of several kinds (or no statistics): count the column
            out[stats.min] = out.get(stats.min, 0) + group.num_rows
        return out

    def shards_with(self, kind: str | None) -> set[int]:
        """Shards that hold at least one member of ``kind`` (all shards that hold any when None)."""
        col = self.column("shard")
        if kind is not None:
            col = compute("filter", col, compute("equal", self.column("kind"), scalar(kind)))
        return {int(v) for v in compute("unique", col).to_pylist()}

    def position(self, kind: str, rollout_id: str, attempt: int, key: str) -> int | None:
        """Row of the member: the first lookups scan the identity columns in Arrow (no Python
        object per member, so a cold lookup stays cheap); after ``_SCAN_LOOKUPS`` of them a
        dict of every member is built, then each lookup is O(1)."""
        if self._positions is None and self._lookups < _SCAN_LOOKUPS:
            self._lookups += 1
            groups = self._row_groups_with(rollout_id)
            if len(groups) < self._pf.metadata.num_row_groups and any(
                name not in self._columns for name in _LOOKUP_COLUMNS
            ):
                return self._scan_row_groups(groups, kind, rollout_id, attempt, key)
            self.load(*_LOOKUP_COLUMNS)
            return _first_match(self.column, kind, rollout_id, attempt, key)
        if self._positions is None:
            cols = [self.column(name).to_pylist() for name in ("kind", "rollout_id", "attempt", "key")]
            self._positions = {ident: i for i, ident in enumerate(zip(*cols, strict=True))}
        return self._positions.get((kind, rollout_id, attempt, key))

    def _row_groups_with(self, rollout_id: str) -> list[int]:
        """Index row groups whose ``rollout_id`` statistics (min/max, which the writer records)
        may hold ``rollout_id``: all of them unless the ids were written roughly in order."""
        metadata = self._pf.metadata
        column = INDEX_SCHEMA.get_field_index("rollout_id")
        groups = []
        for rg in range(metadata.num_row_groups):
            stats = metadata.row_group(rg).column(column).statistics
            # UTF-8 byte order (Parquet's order for strings) is code-point order, as str compares
            if stats is None or not stats.has_min_max or stats.min <= rollout_id <= stats.max:
                groups.append(rg)
        return groups

    def _scan_row_groups(
        self, groups: list[int], kind: str, rollout_id: str, attempt: int, key: str
    ) -> int | None:
        """A cold lookup that decodes only the index row groups ``groups`` (the others cannot
        hold the member); remembers where the member is for :meth:`locate`."""
        metadata = self._pf.metadata
        starts = list(
            accumulate((metadata.row_group(rg).num_rows for rg in range(metadata.num_row_groups)), initial=0)
        )
        try:
            table = self._pf.read_row_groups(groups, columns=list(_LOOKUP_COLUMNS), use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise InvalidRecordError(f"member index row groups {groups} are not readable: {exc}") from None
        found_at = _first_match(table.column, kind, rollout_id, attempt, key)
        if found_at is None:
            return None
        local = found_at
        for rg in groups:  # the table's rows are the groups' rows, in order
            n = starts[rg + 1] - starts[rg]
            if local < n:
                break
            local -= n
        position = int(starts[rg]) + local
        found = table.slice(found_at, 1)
        self._located[position] = (
            int(found["shard"][0].as_py()),
            int(found["row_group"][0].as_py()),
            int(found["row"][0].as_py()),
        )
        return position

    def locate(self, position: int) -> tuple[int, int, int]:
        """(shard, row group, row) of the member at ``position``."""
        if position in self._located:
            return self._located[position]
        return tuple(int(self.column(name)[position].as_py()) for name in ("shard", "row_group", "row"))  # type: ignore[return-value]

    def member_at(self, position: int) -> MemberRef:
        row = {name: self.column(name)[position].as_py() for name in INDEX_SCHEMA.names}
        return _member(row)

    def locations(self, batch_rows: int = 4096) -> Iterator[tuple[tuple[str, str, int, str], int, int, int]]:
        """``((kind, rollout_id, attempt, key), shard, row_group, row)`` of every member, in write
        order: the identity and location columns only, batch by batch, with no object per member
        (``refs`` is neither decoded nor parsed)."""
        self.load(*_LOOKUP_COLUMNS)
        table = pa.Table.from_arrays(
            [self.column(name) for name in _LOOKUP_COLUMNS], names=list(_LOOKUP_COLUMNS)
        )
        for batch in table.to_batches(max_chunksize=batch_rows):
            kinds, rollout_ids, attempts, keys, shards, row_groups, rows = (
                col.to_pylist() for col in batch.columns
            )
            idents = zip(kinds, rollout_ids, attempts, keys, strict=True)
            yield from zip(idents, shards, row_groups, rows, strict=True)

    def members(self, kind: str | None = None, batch_rows: int = 4096) -> Iterator[MemberRef]:
        table = self.table
        if kind is not None:
            table = compute("filter", table, compute("equal", table["kind"], scalar(kind)))
        for batch in table.to_batches(max_chunksize=batch_rows):
            for row in batch.to_pylist():
                yield _member(row)


def _first_match(
    column: Callable[[str], Any], kind: str, rollout_id: str, attempt: int, key: str
) -> int | None:
    """Row of the first member with this identity, scanning the identity columns in Arrow
    (``column(name)`` gives one); None when there is none."""
    if not _INT64_MIN <= attempt <= _INT64_MAX:
        return None  # no member has it (the column is int64)
    mask = compute("equal", column("rollout_id"), scalar(rollout_id))
    for name, value in (("key", key), ("attempt", attempt), ("kind", kind)):
        mask = compute("and", mask, compute("equal", column(name), scalar(value)))
    rows = compute("indices_nonzero", mask)
    return int(rows[0].as_py()) if len(rows) else None


def _member(row: dict[str, Any]) -> MemberRef:
    refs = row["refs"]
    return MemberRef(
        kind=row["kind"],
        rollout_id=row["rollout_id"],
        attempt=row["attempt"],
        key=row["key"],
        revision=row["revision"],
        refs=json.loads(refs) if refs is not None else None,
        shard=row["shard"],
        row_group=row["row_group"],
        row=row["row"],
    )
