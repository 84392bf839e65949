"""Incremental commits: a component archive refers to the members its previous archive holds.

A participant keeps a :class:`BaseCatalog` of the last component archive it committed: per
member identity, the payload bytes it wrote (the very objects the export handed over, so keeping
them costs no copy) and where they are stored. The next commit writes a member again only when
its payload, revision or refs changed; the others become references (format version 2). The
catalog is used only when its checkpoint is **published** when the next commit starts (the
coordinator runs one publication at a time, so that publication has ended): an aborted
checkpoint's archive is garbage retention will delete, and nothing may point into it.
References are flattened: a member the previous archive itself referred to keeps pointing at the
archive that stores it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from ..archive import ArchiveWriter, ManifestRef, RawArchiveReader
from ..archive._bulk import encode_refs, encode_refs_column
from ..errors import ObjectNotFoundError
from ..format import layout
from ..format.records import Record
from ..store import ObjectStore
from ._hooks import ExportRecords, RecordBatch, RecordBatches

__all__ = ["BaseCatalog", "IncrementalPlan"]

Identity = tuple[str, str, int, str]


_Stored = tuple[bytes, int | None, str | None, int, int, int, int]
"""One catalogued member: ``(payload, revision, refs, base, shard, row_group, row)``, ``base``
the position in the catalog's ``bases`` of the archive that stores the row. A tuple of atoms, so
Python's garbage collector stops tracking it: a catalog of tens of thousands of members adds
nothing to every later collection's work (an object per member did, inside the pause)."""

_PAYLOAD: Final = 0
_REVISION: Final = 1
_REFS: Final = 2
_BASE: Final = 3
_SHARD: Final = 4
_ROW_GROUP: Final = 5
_ROW: Final = 6

Base = tuple[str, ManifestRef]
"""An archive the catalog's rows are stored in: its prefix and manifest."""


class IncrementalPlan:
    """One commit's split of an export into members to write and members to refer to."""

    def __init__(self, catalog: Mapping[Identity, _Stored] | None, bases: Sequence[Base] = ()) -> None:
        self._catalog = catalog
        self._bases = bases
        # referred-to members as two parallel lists (no object per member: a plan of a long run
        # refers to tens of thousands of them, inside the checkpoint's pause)
        self._ref_idents: list[Identity] = []
        self._ref_stored: list[_Stored] = []
        self.written: dict[Identity, tuple[bytes, int | None, str | None]] = {}

    def _unchanged(self, ident: Identity, payload: bytes, revision: int | None, refs: str | None) -> bool:
        stored = None if self._catalog is None else self._catalog.get(ident)
        if stored is None or stored[_REVISION] != revision or stored[_REFS] != refs:
            return False
        return stored[_PAYLOAD] is payload or stored[_PAYLOAD] == payload

    def split_batch(self, batch: RecordBatch) -> RecordBatch | None:
        """The part of ``batch`` to write (``None`` when every member is unchanged)."""
        n = len(batch)
        kind = batch.kind
        idents = [
            (kind, r, a, k) for r, a, k in zip(batch.rollout_ids, batch.attempts, batch.keys, strict=True)
        ]
        revisions: Sequence[int | None] = [None] * n if batch.revisions is None else batch.revisions
        refs: list[str | None] = [None] * n if batch.refs is None else encode_refs_column(batch.refs)
        payloads = batch.payloads
        if self._catalog is None:  # a full commit: every member is written (one C-level update)
            self.written.update(zip(idents, zip(payloads, revisions, refs, strict=True), strict=True))
            return batch
        keep = [i for i in range(n) if not self._refer(idents[i], payloads[i], revisions[i], refs[i])]
        if len(keep) == n:
            return batch
        if not keep:
            return None

        def pick(col: Sequence[Any] | None) -> tuple[Any, ...] | None:
            return None if col is None else tuple(col[i] for i in keep)

        return RecordBatch(
            kind=batch.kind,
            rollout_ids=tuple(batch.rollout_ids[i] for i in keep),
            attempts=tuple(batch.attempts[i] for i in keep),
            keys=tuple(batch.keys[i] for i in keep),
            payloads=tuple(payloads[i] for i in keep),
            revisions=pick(batch.revisions),
            refs=pick(batch.refs),
            schema_version=batch.schema_version,
        )

    def split_record(self, record: Record) -> bool:
        """Whether ``record`` must be written (``False``: it is referred to)."""
        ident = (record.kind, record.rollout_id, record.attempt, record.record_key)
        return not self._refer(
            ident, record.to_payload(), record.index_revision(), encode_refs(record.index_refs())
        )

    def _refer(self, ident: Identity, payload: bytes, revision: int | None, refs: str | None) -> bool:
        if self._unchanged(ident, payload, revision, refs):
            assert self._catalog is not None
            self._ref_idents.append(ident)
            self._ref_stored.append(self._catalog[ident])
            return True
        self.written[ident] = (payload, revision, refs)
        return False

    def apply(self, writer: ArchiveWriter) -> None:
        """Hand the references to ``writer`` (version 2) when the catalog was usable."""
        if self._catalog is None:
            return
        positions: dict[int, int] = {}  # catalog base -> position in this archive's bases
        stored = self._ref_stored
        for s in stored:
            if s[_BASE] not in positions:
                positions[s[_BASE]] = len(positions)
        idents = self._ref_idents
        columns: list[list[Any]] = [
            [i[0] for i in idents],
            [i[1] for i in idents],
            [i[2] for i in idents],
            [i[3] for i in idents],
            [s[_REVISION] for s in stored],
            [s[_REFS] for s in stored],
            [positions[s[_BASE]] for s in stored],
            [s[_SHARD] for s in stored],
            [s[_ROW_GROUP] for s in stored],
            [s[_ROW] for s in stored],
        ]
        writer.refer([self._bases[b] for b in positions], columns)

    def references(self) -> tuple[dict[Identity, _Stored], list[Base]]:
        """The referred-to members and the archives that store them (their ``base`` renumbered
        into the returned list)."""
        renumber: dict[int, int] = {}
        bases: list[Base] = []
        members: dict[Identity, _Stored] = {}
        for ident, s in zip(self._ref_idents, self._ref_stored, strict=True):
            b = renumber.get(s[_BASE])
            if b is None:
                b = renumber[s[_BASE]] = len(bases)
                bases.append(self._bases[s[_BASE]])
            members[ident] = s if b == s[_BASE] else (s[0], s[1], s[2], b, s[4], s[5], s[6])
        return members, bases


class BaseCatalog:
    """What the last committed archive of one component holds (see the module docstring)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        """``False``: plans write everything (format 1) but the catalog still follows the commits,
        so turning it on later refers into the archives written before (a store upgraded in place)."""
        self._lock = threading.Lock()
        self._checkpoint_id: str | None = None
        self._members: dict[Identity, _Stored] = {}
        self._bases: list[Base] = []

    def plan(self, store: ObjectStore) -> IncrementalPlan:
        """A plan against the catalog if its checkpoint is published in ``store``, else a full one."""
        with self._lock:
            cid, members, bases = self._checkpoint_id, self._members, self._bases
        if not self.enabled or cid is None or not _published(store, cid):
            return IncrementalPlan(None)
        return IncrementalPlan(members, bases)

    def committed(self, store: ObjectStore, prefix: str, checkpoint_id: str, plan: IncrementalPlan) -> None:
        """Remember the archive just committed at ``prefix``: locations of the rows it stores come
        from its own (digest-checked) member index, the referenced ones carry over."""
        reader = RawArchiveReader.open(store, prefix)
        members, bases = plan.references()
        here = len(bases)
        bases.append((prefix, reader.manifest_ref))
        written_members = plan.written
        for ident, shard, row_group, row in reader.stored_locations():
            written = written_members.get(ident)
            if written is None:
                continue  # not from this export (cannot happen): never referred to
            payload, revision, refs = written
            members[ident] = (payload, revision, refs, here, shard, row_group, row)
        with self._lock:
            self._checkpoint_id, self._members, self._bases = checkpoint_id, members, bases

    def forget(self) -> None:
        """Drop the catalog (the next commit writes everything)."""
        with self._lock:
            self._checkpoint_id, self._members, self._bases = None, {}, []


def _published(store: ObjectStore, checkpoint_id: str) -> bool:
    try:
        return store.exists(layout.published_key(checkpoint_id))
    except ObjectNotFoundError:
        return False


def split_export(plan: IncrementalPlan, records: ExportRecords) -> Iterator[RecordBatch | Record]:
    """The export's members to write, batches trimmed to their changed members."""
    if isinstance(records, RecordBatches):
        for batch in records.batches:
            part = plan.split_batch(batch)
            if part is not None:
                yield part
    else:
        for record in records:
            if plan.split_record(record):
                yield record
