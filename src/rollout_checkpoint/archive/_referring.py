"""The format-2 side of an archive reader: the members it refers to in earlier archives.

Kept apart from the reader's version-1 core (``_reader``): the reference table read and checked
once, the resolver over the bases it names, and the cheap and full checks of those pins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, InvalidRecordError
from ..store import ObjectStore
from ._references import (
    REFERENCE_SCHEMA,
    Reference,
    ReferenceResolver,
    StoredArchive,
    checked_reference_rows,
    reference_columns,
)

if TYPE_CHECKING:
    from ._index import MemberIndex
    from ._manifest import ComponentManifest

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
        entry = self.manifest.references
        if entry is None:
            return [[] for _ in REFERENCE_SCHEMA.names]
        data = self._checked_object(entry.key, entry.bytes, entry.sha256, "reference table")
        key = self.key_of(entry.key)
        try:
            columns = reference_columns(data, len(self.manifest.bases or []))
        except InvalidRecordError as exc:
            raise IntegrityError(f"{key}: {exc.message}", key=key, problem="invalid") from None
        counts: dict[str, int] = {}
        for kind in columns[0]:
            counts[kind] = counts.get(kind, 0) + 1
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
        entry = self.manifest.references
        if entry is None:
            return
        self._checked_object(entry.key, entry.bytes, entry.sha256, "reference table")
        pins = ReferenceResolver(self, [], self._open_pinned)
        for i in range(len(self.manifest.bases or [])):
            pins.base(i)

    def base_prefixes(self) -> list[str]:
        """Prefixes of the archives this one refers to (what retention must keep with it)."""
        return [b.prefix for b in self.manifest.bases or []]

    def stored_columns(self) -> list[list[Any]]:
        """The members this archive stores, as columns ``kind, rollout_id, attempt, key, revision,
        refs, shard, row_group, row`` (from the digest-checked index; ``refs`` as stored JSON):
        what a reference table lists for them, ``base`` aside."""
        table = self._member_index().table
        return [table.column(n).to_pylist() for n in (*_MEMBER_FIELDS, "shard", "row_group", "row")]

    def locations(self) -> dict[tuple[int, int, int], tuple[Any, ...]]:
        """(shard, row group, row) -> (kind, rollout_id, attempt, key, revision, refs) of every
        member stored here (the digest-checked index)."""
        table = self._member_index().table
        cols = [table.column(n).to_pylist() for n in ("shard", "row_group", "row", *_MEMBER_FIELDS)]
        return {(a, b, c): tuple(rest) for a, b, c, *rest in zip(*cols, strict=True)}
