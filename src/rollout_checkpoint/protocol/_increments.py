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
from dataclasses import dataclass
from typing import Any

from ..archive import ArchiveWriter, ManifestRef, RawArchiveReader
from ..archive._bulk import encode_refs
from ..errors import ObjectNotFoundError
from ..format import layout
from ..format.records import Record
from ..store import ObjectStore
from ._hooks import ExportRecords, RecordBatch, RecordBatches

__all__ = ["BaseCatalog", "IncrementalPlan"]

Identity = tuple[str, str, int, str]


@dataclass(frozen=True, slots=True)
class _Stored:
    payload: bytes
    revision: int | None
    refs: str | None
    prefix: str  # the archive that stores the row
    manifest: ManifestRef
    shard: int
    row_group: int
    row: int


class IncrementalPlan:
    """One commit's split of an export into members to write and members to refer to."""

    def __init__(self, catalog: Mapping[Identity, _Stored] | None) -> None:
        self._catalog = catalog
        # referred-to members as two parallel lists (no object per member: a plan of a long run
        # refers to tens of thousands of them, inside the checkpoint's pause)
        self._ref_idents: list[Identity] = []
        self._ref_stored: list[_Stored] = []
        self.written: dict[Identity, tuple[bytes, int | None, str | None]] = {}

    def _unchanged(self, ident: Identity, payload: bytes, revision: int | None, refs: str | None) -> bool:
        stored = None if self._catalog is None else self._catalog.get(ident)
        if stored is None or stored.revision != revision or stored.refs != refs:
            return False
        return stored.payload is payload or stored.payload == payload

    def split_batch(self, batch: RecordBatch) -> RecordBatch | None:
        """The part of ``batch`` to write (``None`` when every member is unchanged)."""
        keep: list[int] = []
        for i in range(len(batch)):
            ident = (batch.kind, batch.rollout_ids[i], batch.attempts[i], batch.keys[i])
            revision = None if batch.revisions is None else batch.revisions[i]
            refs = None if batch.refs is None else encode_refs(batch.refs[i])
            payload = batch.payloads[i]
            if self._refer(ident, payload, revision, refs):
                continue
            keep.append(i)
        if len(keep) == len(batch):
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
            payloads=tuple(batch.payloads[i] for i in keep),
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
        bases: dict[str, int] = {}
        refs: dict[str, ManifestRef] = {}
        stored = self._ref_stored
        for s in stored:
            if s.prefix not in bases:
                bases[s.prefix] = len(bases)
                refs[s.prefix] = s.manifest
        idents = self._ref_idents
        columns: list[list[Any]] = [
            [i[0] for i in idents],
            [i[1] for i in idents],
            [i[2] for i in idents],
            [i[3] for i in idents],
            [s.revision for s in stored],
            [s.refs for s in stored],
            [bases[s.prefix] for s in stored],
            [s.shard for s in stored],
            [s.row_group for s in stored],
            [s.row for s in stored],
        ]
        writer.refer([(prefix, refs[prefix]) for prefix in bases], columns)

    def references(self) -> dict[Identity, _Stored]:
        """The referred-to members and where they are stored."""
        return dict(zip(self._ref_idents, self._ref_stored, strict=True))


class BaseCatalog:
    """What the last committed archive of one component holds (see the module docstring)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        """``False``: plans write everything (format 1) but the catalog still follows the commits,
        so turning it on later refers into the archives written before (a store upgraded in place)."""
        self._lock = threading.Lock()
        self._checkpoint_id: str | None = None
        self._members: dict[Identity, _Stored] = {}

    def plan(self, store: ObjectStore) -> IncrementalPlan:
        """A plan against the catalog if its checkpoint is published in ``store``, else a full one."""
        with self._lock:
            cid, members = self._checkpoint_id, self._members
        if not self.enabled or cid is None or not _published(store, cid):
            return IncrementalPlan(None)
        return IncrementalPlan(members)

    def committed(self, store: ObjectStore, prefix: str, checkpoint_id: str, plan: IncrementalPlan) -> None:
        """Remember the archive just committed at ``prefix``: locations of the rows it stores come
        from its own (digest-checked) member index, the referenced ones carry over."""
        reader = RawArchiveReader.open(store, prefix)
        members = plan.references()
        manifest = reader.manifest_ref
        written_members = plan.written
        for ident, shard, row_group, row in reader.stored_locations():
            written = written_members.get(ident)
            if written is None:
                continue  # not from this export (cannot happen): never referred to
            payload, revision, refs = written
            members[ident] = _Stored(payload, revision, refs, prefix, manifest, shard, row_group, row)
        with self._lock:
            self._checkpoint_id, self._members = checkpoint_id, members

    def forget(self) -> None:
        """Drop the catalog (the next commit writes everything)."""
        with self._lock:
            self._checkpoint_id, self._members = None, {}


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
