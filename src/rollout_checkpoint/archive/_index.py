"""The member index: one Parquet object per archive mapping each member to (shard, row group, row).

Besides one row per member, the index's key-value metadata carries, per shard, every row group's
byte range and SHA-256 and the shard's raw Parquet footer. A reader that holds the (digest-checked)
index can therefore fetch one member with exactly one ranged GET of one row group, check that
range's own digest, and decode it without touching the shard's footer on the store.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import InvalidRecordError
from ._schema import (
    INDEX_FORMAT_VERSION,
    INDEX_MEMBER_COLUMNS,
    INDEX_META_KEY,
    INDEX_SCHEMA,
    footer_meta_key,
)

__all__ = ["IndexBuilder", "MemberIndex", "MemberRef", "RowGroupSpan"]


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
    return pq.read_metadata(pa.BufferReader(framed))


class IndexBuilder:
    """Writer side: collects one compact Arrow table per finished shard (never Python objects per
    member), so a writer's memory for the index grows by tens of bytes per member only."""

    def __init__(self) -> None:
        self._tables: list[pa.Table] = []
        self._spans: list[list[RowGroupSpan]] = []
        self._footers: list[bytes] = []
        self.rows = 0

    @property
    def shard_count(self) -> int:
        return len(self._spans)

    def add_shard(self, row_groups: list[pa.Table], spans: list[RowGroupSpan], footer: bytes) -> None:
        """Add the next shard: ``row_groups[i]`` holds the member columns of row group ``i``."""
        shard = len(self._spans)
        if len(row_groups) != len(spans):
            raise AssertionError("one span per row group expected")
        parts: list[pa.Table] = []
        for rg, (table, span) in enumerate(zip(row_groups, spans, strict=True)):
            n = table.num_rows
            cols = [table.column(name) for name in INDEX_MEMBER_COLUMNS]
            cols += [
                pa.repeat(pa.scalar(shard, pa.int32()), n),
                pa.repeat(pa.scalar(rg, pa.int32()), n),
                pa.array(range(n), pa.int32()),
                pa.repeat(pa.scalar(span.offset, pa.int64()), n),
                pa.repeat(pa.scalar(span.length, pa.int64()), n),
            ]
            parts.append(pa.Table.from_arrays(cols, schema=INDEX_SCHEMA))
        if parts:
            self._tables.append(pa.concat_tables(parts).combine_chunks())
        self._spans.append(spans)
        self._footers.append(footer)
        self.rows += sum(t.num_rows for t in parts)

    def contains(self, kind: str, rollout_id: str, attempt: int, key: str) -> bool:
        """Exact membership test (a vectorised scan: used only when a cheap hash says "maybe")."""
        for table in self._tables:
            mask = pc.and_(
                pc.and_(pc.equal(table["kind"], kind), pc.equal(table["rollout_id"], rollout_id)),
                pc.and_(pc.equal(table["attempt"], attempt), pc.equal(table["key"], key)),
            )
            if pc.any(mask).as_py():
                return True
        return False

    def to_bytes(self, zstd_level: int) -> bytes:
        table = pa.concat_tables(self._tables) if self._tables else INDEX_SCHEMA.empty_table()
        meta: dict[bytes, bytes] = {
            INDEX_META_KEY: json.dumps(
                {
                    "format": INDEX_FORMAT_VERSION,
                    "shards": [
                        {"row_groups": [[s.offset, s.length, s.sha256] for s in spans]}
                        for spans in self._spans
                    ],
                },
                separators=(",", ":"),
            ).encode()
        }
        for shard, footer in enumerate(self._footers):
            meta[footer_meta_key(shard)] = footer
        table = table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        pq.write_table(
            table,
            sink,
            compression="zstd",
            compression_level=zstd_level,
            row_group_size=1 << 16,
            write_statistics=["kind", "rollout_id", "attempt", "key", "shard"],
        )
        return bytes(sink.getvalue().to_pybytes())


class MemberIndex:
    """Reader side: the parsed index of one archive (built from digest-checked bytes)."""

    def __init__(self, table: pa.Table, spans: list[list[RowGroupSpan]], footers: list[bytes]) -> None:
        self.table = table
        self.spans = spans
        self._footers = footers
        self._metadata: dict[int, pq.FileMetaData] = {}
        self._positions: dict[tuple[str, str, int, str], int] | None = None

    @classmethod
    def from_bytes(cls, data: bytes, shard_count: int) -> MemberIndex:
        """Parse index bytes; ``InvalidRecordError`` when they do not describe ``shard_count`` shards."""
        try:
            pf = pq.ParquetFile(pa.BufferReader(data))
            table = pf.read()
            meta = pf.schema_arrow.metadata or {}
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
        if not table.schema.remove_metadata().equals(INDEX_SCHEMA):
            raise InvalidRecordError("member index columns do not match the index schema")
        return cls(table, spans, footers)

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    def footer_metadata(self, shard: int) -> pq.FileMetaData:
        """Parsed footer of ``shard`` (cached: parsing costs ~0.1 ms per row group)."""
        md = self._metadata.get(shard)
        if md is None:
            md = metadata_from_footer(self._footers[shard])
            self._metadata[shard] = md
        return md

    def counts(self) -> dict[str, int]:
        """Members per kind."""
        out: dict[str, int] = {}
        for row in self.table["kind"].value_counts().to_pylist():
            out[str(row["values"])] = int(row["counts"])
        return out

    def shards_with(self, kind: str | None) -> set[int]:
        """Shards that hold at least one member of ``kind`` (all shards that hold any when None)."""
        col = (
            self.table["shard"]
            if kind is None
            else self.table.filter(pc.equal(self.table["kind"], kind))["shard"]
        )
        return {int(v) for v in pc.unique(col).to_pylist()}

    def position(self, kind: str, rollout_id: str, attempt: int, key: str) -> int | None:
        """Row of the member in :attr:`table` (a dict built on first use, then O(1))."""
        if self._positions is None:
            cols = [self.table[name].to_pylist() for name in ("kind", "rollout_id", "attempt", "key")]
            self._positions = {ident: i for i, ident in enumerate(zip(*cols, strict=True))}
        return self._positions.get((kind, rollout_id, attempt, key))

    def member_at(self, position: int) -> MemberRef:
        row = self.table.slice(position, 1).to_pylist()[0]
        return _member(row)

    def members(self, kind: str | None = None, batch_rows: int = 4096) -> Iterator[MemberRef]:
        table = self.table if kind is None else self.table.filter(pc.equal(self.table["kind"], kind))
        for batch in table.to_batches(max_chunksize=batch_rows):
            for row in batch.to_pylist():
                yield _member(row)


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
