"""The format-2 side of an archive reader: the members it refers to in earlier archives.

Kept apart from the reader's version-1 core (``_reader``): the reference table read and checked
once, the resolver over the bases it names, and the cheap and full checks of those pins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import IntegrityError, InvalidRecordError, ObjectNotFoundError
from ..store import ObjectStore
from ._index import value_counts
from ._parquet_io import open_parquet_file
from ._references import (
    REFERENCE_SCHEMA,
    Reference,
    ReferenceResolver,
    StoredArchive,
    checked_reference_rows,
    reference_arrays,
)

if TYPE_CHECKING:
    from ._index import MemberIndex
    from ._manifest import ComponentManifest
    from ._rows import RawRecord

__all__ = ["ReferringArchive"]

_IDENTITY = ("kind", "rollout_id", "attempt", "key")
_MEMBER_FIELDS = ("kind", "rollout_id", "attempt", "key", "revision", "refs")


class ReferringArchive:
    """Mixin of ``RawArchiveReader``: what format 2 adds to reading one archive."""

    store: ObjectStore
    prefix: str
    manifest: ComponentManifest
    _resolver_cache: ReferenceResolver | None

    if TYPE_CHECKING:  # provided by RawArchiveReader, which this mixes into

        def key_of(self, relative: str) -> str: ...

        def _member_index(self) -> MemberIndex: ...

        def _checked_object(self, relative: str, size: int, sha256: str, what: str) -> bytes: ...

        def _open_pinned(self, store: ObjectStore, prefix: str, sha256: str) -> StoredArchive: ...

        def check_stored(self) -> list[IntegrityError]: ...

        def read_rows(self, shard_no: int, row_group: int, rows: list[int]) -> list[Any]: ...

    def _resolver(self) -> ReferenceResolver:
        """Version 2: the digest-checked reference table and the bases it points into (empty for
        version 1). A referenced identity that is also stored here is an ``IntegrityError``."""
        if self._resolver_cache is None:
            entry = self.manifest.references
            rows: list[Reference] = []
            if entry is not None:
                data = self._checked_object(entry.key, entry.bytes, entry.sha256, "reference table")
                index = self._member_index()
                stored = zip(*(index.column(n).to_pylist() for n in _IDENTITY), strict=True)
                rows = checked_reference_rows(data, self.key_of(entry.key), self.manifest, set(stored))
            self._resolver_cache = ReferenceResolver(self, rows, self._open_pinned)
        return self._resolver_cache

    def references(self, kind: str | None = None) -> list[Reference]:
        """The members this archive refers to in its bases (version 2; empty for version 1)."""
        rows = self._resolver().rows
        return rows if kind is None else [r for r in rows if r.kind == kind]

    def reference_columns(self) -> list[list[Any]]:
        """Version 2: the reference table as columns (``REFERENCE_SCHEMA`` order; empty lists for
        version 1), its bytes, rows, per-kind counts and base locations checked against the
        manifest. Unlike :meth:`references`, identities are not checked against the stored
        members or each other here: the caller that unites archives checks them all at once."""
        return [column.to_pylist() for column in self.reference_arrays()]

    def reference_arrays(self) -> list[pa.ChunkedArray]:
        """:meth:`reference_columns` as Arrow columns (no Python object per row)."""
        entry = self.manifest.references
        if entry is None:
            return [pa.chunked_array([], type=field.type) for field in REFERENCE_SCHEMA]
        data = self._checked_object(entry.key, entry.bytes, entry.sha256, "reference table")
        key = self.key_of(entry.key)
        try:
            columns = reference_arrays(data, len(self.manifest.bases or []))
        except InvalidRecordError as exc:
            raise IntegrityError(f"{key}: {exc.message}", key=key, problem="invalid") from None
        counts = value_counts(columns[0])
        if len(columns[0]) != entry.rows or counts != {k: n for k, n in entry.counts.items() if n}:
            problem = "reference table does not match the manifest's counts"
            raise IntegrityError(f"{key}: {problem}", key=key, problem="inconsistent")
        return columns

    def open_bases(self) -> None:
        """Version 2: read the reference table and every base's manifest, each checked against its
        pin (what a load without ``verify`` checks of the bases; ``IntegrityError`` when one is
        missing or altered)."""
        resolver = self._resolver()
        for i in range(len(self.manifest.bases or [])):
            resolver.base(i)

    def check_pins(self) -> None:
        """Format 2, without parsing a row: the reference table's bytes and every base's
        ``manifest.json`` against their pins, and each base of the same kind and instance (what
        a publisher checks of the archive a participant just wrote; ``IntegrityError`` else)."""
        for check in self.pin_checks():
            check()

    def pin_checks(self) -> list[Callable[[], None]]:
        """:meth:`check_pins` as independent calls (none for version 1): the reference table's
        bytes, then one per base (its ``manifest.json`` fetched and checked against its pin).
        They share nothing, so a caller may run them concurrently (one request each)."""
        entry = self.manifest.references
        if entry is None:
            return []
        pins = ReferenceResolver(self, [], self._open_pinned)

        def table() -> None:
            self._checked_object(entry.key, entry.bytes, entry.sha256, "reference table")

        def base(i: int) -> Callable[[], None]:
            def check() -> None:
                pins.base(i)

            return check

        return [table, *(base(i) for i in range(len(self.manifest.bases or [])))]

    def base_prefixes(self) -> list[str]:
        """Prefixes of the archives this one refers to (what retention must keep with it)."""
        return [b.prefix for b in self.manifest.bases or []]

    def stored_columns(self) -> list[list[Any]]:
        """The members this archive stores, as columns ``kind, rollout_id, attempt, key, revision,
        refs, shard, row_group, row`` (from the digest-checked index; ``refs`` as stored JSON):
        what a reference table lists for them, ``base`` aside."""
        return [column.to_pylist() for column in self.stored_arrays()]

    def stored_arrays(self) -> list[pa.ChunkedArray]:
        """:meth:`stored_columns` as Arrow columns: the index's own, no copy."""
        index = self._member_index()
        names = (*_MEMBER_FIELDS, "shard", "row_group", "row")
        index.load(*names)  # the columns a reference lists (not the row groups' byte ranges)
        return [index.column(n) for n in names]

    def locations(self) -> dict[tuple[int, int, int], tuple[Any, ...]]:
        """(shard, row group, row) -> (kind, rollout_id, attempt, key, revision, refs) of every
        member stored here (the digest-checked index)."""
        table = self._member_index().table
        cols = [table.column(n).to_pylist() for n in ("shard", "row_group", "row", *_MEMBER_FIELDS)]
        return {(a, b, c): tuple(rest) for a, b, c, *rest in zip(*cols, strict=True)}

    def read_digested(self, wanted: Sequence[tuple[Reference, str]]) -> list[RawRecord]:
        """Referenced members whose payload SHA-256 the caller already trusts (an agent boundary
        names each of its output chunks by it), read **without the bases' member indexes**: per
        member its base's ``manifest.json`` (checked against its pin, once per base), the shard's
        Parquet footer and the row group (two ranged GETs). The row's identity,
        ``revision`` and ``refs`` are checked against the reference row (``IntegrityError``,
        ``inconsistent``) and its payload against the trusted digest (``altered``); the footer
        and the row group carry no digest of their own, the payload digest stands for them (the
        ``schema_version`` column is not checked: the payload carries its own)."""
        resolver = self._resolver()
        out: list[RawRecord] = []
        for r, sha256 in wanted:
            base = resolver.base(r.base)
            raw = _row_by_footer(base, r.shard, r.row_group, r.row)
            resolver._match(base, r, raw)
            found = hashlib.sha256(raw.payload).hexdigest()
            if found != sha256:
                key = base.prefix + "/" + base.manifest.shards[r.shard].key
                raise IntegrityError(
                    f"{key}: member {r.kind}/{r.rollout_id}#{r.attempt}/{r.key} is altered: payload "
                    f"sha256 {found}, expected {sha256}",
                    key=key,
                    problem="altered",
                )
            out.append(raw)
        return out


def _row_by_footer(base: StoredArchive, shard_no: int, row_group: int, row: int) -> RawRecord:
    """Row ``row`` of row group ``row_group`` of a shard of ``base``: its footer (position from the
    pinned manifest) and the row group's byte range, two ranged GETs; nothing digest-checked."""
    import pyarrow as pa

    from ._index import metadata_from_footer
    from ._rows import WindowFile, raw_rows

    shards = base.manifest.shards
    if not 0 <= shard_no < len(shards):
        raise IntegrityError(f"{base.prefix}: no shard {shard_no}", key=base.prefix, problem="inconsistent")
    shard = shards[shard_no]
    key = base.prefix + "/" + shard.key
    if shard.footer_offset is None or shard.footer_bytes is None:  # a manifest without footer spans
        (found,) = base.read_rows(shard_no, row_group, [row])
        return found  # type: ignore[no-any-return]
    try:
        footer = base.store.get_range(key, shard.footer_offset, shard.footer_offset + shard.footer_bytes)
        metadata = metadata_from_footer(footer)
        if not 0 <= row_group < metadata.num_row_groups:
            raise IntegrityError(f"{key}: no row group {row_group}", key=key, problem="inconsistent")
        group = metadata.row_group(row_group)
        starts, ends = [], []
        for c in range(group.num_columns):
            column = group.column(c)
            start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
            starts.append(start)
            ends.append(start + column.total_compressed_size)
        offset = min(starts)
        data = base.store.get_range(key, offset, max(ends))
        table = open_parquet_file(WindowFile(shard.bytes, offset, data), metadata=metadata).read_row_group(
            row_group, use_threads=False
        )
    except ObjectNotFoundError:
        raise IntegrityError(f"{key}: shard {shard_no} is missing", key=key, problem="missing") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise IntegrityError(
            f"{key}: row group {row_group} cannot be read: {exc}", key=key, problem="invalid"
        ) from None
    if not 0 <= row < table.num_rows:
        raise IntegrityError(
            f"{key}: row group {row_group} has no row {row}", key=key, problem="inconsistent"
        )
    (found,) = raw_rows(table.slice(row, 1), key)
    return found
