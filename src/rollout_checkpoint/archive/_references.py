"""Member references (format version 2): members an archive lists but does not store again.

A version-2 archive stores its new or changed members exactly as version 1 does, and lists the
others in a *reference table* (``refs-<writer_id>.parquet``): their identity, ``revision`` and
``refs`` (so the reader classifies from indexes alone, as before), and where the payload lies:
``(base, shard, row_group, row)`` in one *base* archive, which the manifest pins by the digest of
its ``manifest.json``. References are flattened: a location always names a row that the base
stores itself (never a reference of the base), so a reader follows at most one hop, however long
the run. Every referenced byte is checked: the row group against the base's digest-checked
index, and the row's identity, revision and refs against the reference row.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import pyarrow as pa

from ..errors import IntegrityError, InvalidRecordError, ObjectNotFoundError
from ..store import ObjectStore
from ._index import compute, value_counts
from ._names import is_part_of
from ._parquet_io import open_parquet_file, open_parquet_writer
from ._schema import join_key

if TYPE_CHECKING:
    from ._manifest import ComponentManifest, ReferencesEntry


class StoredArchive(Protocol):
    """What the resolver needs of an archive reader (``RawArchiveReader`` offers it)."""

    store: ObjectStore
    prefix: str
    manifest: ComponentManifest

    def read_rows(self, shard_no: int, row_group: int, rows: list[int]) -> list[Any]: ...

    def check_stored(self) -> list[IntegrityError]: ...

    def locations(self) -> dict[tuple[int, int, int], tuple[Any, ...]]: ...


Opener = Callable[[ObjectStore, str, str], StoredArchive]
"""Opens the archive at a prefix, its manifest checked against a SHA-256 (``RawArchiveReader.open``)."""

__all__ = [
    "REFERENCE_SCHEMA",
    "Reference",
    "ReferenceResolver",
    "parse_reference_table",
    "reference_table_bytes",
    "references_name",
]

REFERENCE_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("revision", pa.int64(), nullable=True),
        pa.field("refs", pa.string(), nullable=True),
        pa.field("base", pa.int32(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("row_group", pa.int32(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
    ]
)


class Reference(NamedTuple):
    """One referenced member: its index fields and its row in base archive ``base`` (a tuple:
    an archive lists tens of thousands, built and parsed in bulk)."""

    kind: str
    rollout_id: str
    attempt: int
    key: str
    revision: int | None
    refs: str | None
    base: int
    shard: int
    row_group: int
    row: int

    @property
    def identity(self) -> tuple[str, str, int, str]:
        return (self.kind, self.rollout_id, self.attempt, self.key)


def references_name(writer_id: str) -> str:
    return f"refs-{writer_id}.parquet"


def reference_table_bytes(columns: Sequence[Sequence[Any]], zstd_level: int = 1) -> bytes:
    """The reference table as zstd Parquet: ``columns`` in ``REFERENCE_SCHEMA`` order (one entry
    per referenced member each, in the given order)."""
    if len(columns) != len(REFERENCE_SCHEMA) or len({len(c) for c in columns}) > 1:
        raise InvalidRecordError("reference columns must be the reference schema's, of equal length")
    table = pa.Table.from_arrays(
        [_arrow_column(col, field.type) for col, field in zip(columns, REFERENCE_SCHEMA, strict=True)],
        schema=REFERENCE_SCHEMA,
    )
    sink = io.BytesIO()
    writer = open_parquet_writer(
        sink, REFERENCE_SCHEMA, compression="zstd", compression_level=zstd_level, use_dictionary=True
    )
    writer.write_table(table)
    writer.close()
    return sink.getvalue()


def _read_reference_table(data: bytes) -> pa.Table:
    """A digest-checked reference table's bytes as a table of ``REFERENCE_SCHEMA``
    (``InvalidRecordError`` when they are not one)."""
    try:
        table = open_parquet_file(pa.BufferReader(data)).read(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise InvalidRecordError(f"reference table is not readable: {exc}") from None
    if not table.schema.remove_metadata().equals(REFERENCE_SCHEMA):
        raise InvalidRecordError("reference table columns do not match the reference schema")
    return table


def parse_reference_table(data: bytes, base_count: int) -> list[Reference]:
    """Rows of a digest-checked reference table; ``InvalidRecordError`` when they are not valid."""
    table = _read_reference_table(data)
    rows = [
        Reference(*row)
        for row in zip(*(table.column(n).to_pylist() for n in REFERENCE_SCHEMA.names), strict=True)
    ]
    for r in rows:
        if not 0 <= r.base < base_count or min(r.shard, r.row_group, r.row) < 0:
            raise InvalidRecordError(f"reference {r.identity} names no valid base location")
    return rows


def reference_columns(data: bytes, base_count: int) -> list[list[Any]]:
    """The columns (``REFERENCE_SCHEMA`` order) of a digest-checked reference table, each row's
    base and location checked like :func:`parse_reference_table`'s, without an object per row
    (``InvalidRecordError`` when they are not valid)."""
    return [column.to_pylist() for column in reference_arrays(data, base_count)]


def reference_arrays(data: bytes, base_count: int) -> list[pa.ChunkedArray]:
    """:func:`reference_columns` as Arrow columns (no Python object per row)."""
    table = _read_reference_table(data)
    if table.num_rows:
        bases = compute("min_max", table.column("base")).as_py()
        lowest = min(compute("min", table.column(n)).as_py() for n in ("shard", "row_group", "row"))
        if bases["min"] < 0 or bases["max"] >= base_count or lowest < 0:
            raise InvalidRecordError("a reference names no valid base location")
    return [table.column(n) for n in REFERENCE_SCHEMA.names]


def _arrow_column(values: Any, type_: pa.DataType) -> Any:
    """``values`` (a sequence, or an Arrow array already) as an Arrow array of ``type_``."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values if values.type == type_ else values.cast(type_)
    return pa.array(values, type=type_)


def checked_reference_rows(
    data: bytes, key: str, manifest: ComponentManifest, stored: set[tuple[str, str, int, str]]
) -> list[Reference]:
    """The rows of a digest-checked reference table (``key``), checked against the manifest's
    counts and against the identities the archive stores (``stored``): an identity stored and
    referenced, or referenced twice, is an ``IntegrityError``."""
    entry = manifest.references
    assert entry is not None
    try:
        rows = parse_reference_table(data, len(manifest.bases or []))
    except InvalidRecordError as exc:
        raise IntegrityError(f"{key}: {exc.message}", key=key, problem="invalid") from None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    if len(rows) != entry.rows or counts != {k: n for k, n in entry.counts.items() if n}:
        raise IntegrityError(
            f"{key}: reference table does not match the manifest's counts", key=key, problem="inconsistent"
        )
    seen: set[tuple[str, str, int, str]] = set()
    for r in rows:
        if r.identity in stored or r.identity in seen:
            raise IntegrityError(
                f"{key}: member {r.kind}/{r.rollout_id}#{r.attempt}/{r.key} is listed twice",
                key=key,
                problem="inconsistent",
            )
        seen.add(r.identity)
    return rows


def reference_entry(data: bytes, name: str, kinds: Sequence[str]) -> ReferencesEntry:
    """The manifest's description of reference table bytes ``data`` stored as ``name``."""
    from ._manifest import ReferencesEntry

    counts: dict[str, int] = {}
    if isinstance(kinds, pa.Array | pa.ChunkedArray):
        counts = value_counts(kinds)
    else:
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + 1
    return ReferencesEntry(
        key=name,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        rows=len(kinds),
        counts=dict(sorted(counts.items())),
    )


def _same_refs(a: str | None, b: str | None) -> bool:
    if a == b:
        return True
    if a is None or b is None:
        return False
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


class ReferenceResolver:
    """The bases of one version-2 archive, opened on first use and checked against their pins."""

    def __init__(self, reader: StoredArchive, rows: list[Reference], opener: Opener) -> None:
        self._reader = reader
        self._rows = rows
        self._open = opener
        self._bases: dict[int, StoredArchive] = {}

    @property
    def rows(self) -> list[Reference]:
        return self._rows

    def base(self, i: int) -> StoredArchive:
        """Base ``i``: its manifest read and checked against the pin, kind and instance."""
        opened = self._bases.get(i)
        if opened is not None:
            return opened
        own = self._reader.manifest
        entry = (own.bases or [])[i]
        key = entry.manifest.key
        try:
            base = self._open(self._reader.store, entry.prefix, entry.manifest.sha256)
        except ObjectNotFoundError:
            referrer = join_key(self._reader.prefix, "manifest.json")
            raise IntegrityError(
                f"{key}: base archive manifest is missing ({referrer} refers into it)",
                key=key,
                problem="missing",
                referenced_by=referrer,
            ) from None
        m = base.manifest
        # an earlier archive of this component (another checkpoint, another prefix), or one of
        # this archive's parts (this checkpoint, at ``<prefix>/parts/<id>``: a worker's share)
        part = is_part_of(entry.prefix, self._reader.prefix)
        if (m.participant_kind, m.instance) != (own.participant_kind, own.instance) or (
            entry.prefix == self._reader.prefix or (m.checkpoint_id == own.checkpoint_id) != part
        ):
            raise IntegrityError(
                f"{key}: base archive is {m.participant_kind}/{m.instance} of checkpoint "
                f"{m.checkpoint_id}, neither an earlier archive nor a part of "
                f"{own.participant_kind}/{own.instance} of {own.checkpoint_id}",
                key=key,
                problem="inconsistent",
            )
        self._bases[i] = base
        return base

    def read(self, refs: Iterable[Reference]) -> Iterator[Any]:
        """Payloads of ``refs``: one ranged GET per referenced row group, each checked against its
        base's index digest, each row checked against its reference row."""
        groups: dict[tuple[int, int, int], list[Reference]] = {}
        for r in refs:
            groups.setdefault((r.base, r.shard, r.row_group), []).append(r)
        for (b, shard, rg), wanted in groups.items():
            base = self.base(b)
            rows = base.read_rows(shard, rg, [r.row for r in wanted])
            for r, raw in zip(wanted, rows, strict=True):
                self._match(base, r, raw)
                yield raw

    def _match(self, base: StoredArchive, r: Reference, raw: Any) -> None:
        if (
            (raw.kind, raw.rollout_id, raw.attempt, raw.key) != r.identity
            or raw.revision != r.revision
            or not (_same_refs(raw.refs, r.refs))
        ):
            key = join_key(base.prefix, "manifest.json")
            raise IntegrityError(
                f"{key}: row {r.shard}/{r.row_group}/{r.row} is not the referenced member "
                f"{r.kind}/{r.rollout_id}#{r.attempt}/{r.key}",
                key=key,
                problem="inconsistent",
            )

    def check(self) -> list[IntegrityError]:
        """Every base verified whole (shards and index streamed, digests checked), then every
        reference row matched with the base index row at its location."""
        problems: list[IntegrityError] = []
        by_base: dict[int, list[Reference]] = {}
        for r in self._rows:
            by_base.setdefault(r.base, []).append(r)
        for b in range(len(self._reader.manifest.bases or [])):
            try:
                base = self.base(b)
            except IntegrityError as exc:
                problems.append(exc)
                continue
            found = base.check_stored()  # flattened: nothing of the base's own bases is needed
            if found:
                problems.extend(found)
                continue
            located = base.locations()
            for r in by_base.get(b, []):
                row = located.get((r.shard, r.row_group, r.row))
                if (
                    row is None
                    or row[:4] != r.identity
                    or row[4] != r.revision
                    or not _same_refs(row[5], r.refs)
                ):
                    key = join_key(base.prefix, "manifest.json")
                    problems.append(
                        IntegrityError(
                            f"{key}: no member {r.kind}/{r.rollout_id}#{r.attempt}/{r.key} at "
                            f"{r.shard}/{r.row_group}/{r.row}",
                            key=key,
                            problem="inconsistent",
                        )
                    )
                    break
        return problems
