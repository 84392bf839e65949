"""A participant's component archive: written once by commit, read and checked by restore.

Commit writes the manifest last; a retry after a lost answer adopts a manifest that the lost
try already wrote, if (and only if) it commits exactly the same content. Restore reads the whole
source component and checks it against its manifest before anything is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from ..errors import InvalidRecordError, ManifestConflictError, ObjectExistsError
from ..format import layout
from ..format.chunks import assemble_boundaries
from ..format.fencing import AttemptFence
from ..format.records import Record, decode_record
from ..ids import ExecutionId
from ..store import ObjectStore, open_store
from ._hooks import ExportRecords, RecordBatch, execution_key
from ._increments import BaseCatalog, IncrementalPlan, split_export

__all__ = [
    "SourceComponent",
    "adopt_manifest",
    "archive_bytes",
    "parse_executions",
    "read_component",
    "write_component",
]

ManifestTriple = tuple[str, str, int]
"""A written manifest's key, sha256 and byte length."""


def write_component(
    store: str | ObjectStore,
    checkpoint_id: str,
    kind: str,
    instance: str,
    records: ExportRecords,
    extra: dict[str, JsonValue],
    *,
    lock: threading.Condition,
    check_active: Callable[[], None],
    written: Callable[[int, int], None] | None = None,
    catalog: BaseCatalog | None = None,
    part: str | None = None,
) -> ManifestTriple:
    """Write the records, then the manifest last, deciding the manifest write under ``lock``.

    ``check_active`` raises if the checkpoint ended meanwhile; it runs before every batch (or
    record) and, under the lock, right before the manifest, so a resume is either before it (no
    manifest, ever) or after it. :class:`RecordBatches` go through the archive's columnar path
    (``ArchiveWriter.write_columns``: one check per batch, payloads stored as encoded), record
    models one by one through ``ArchiveWriter.write``. ``written(records, bytes)`` is told
    what the archive holds once its manifest exists (telemetry). With a ``catalog`` of the
    component's last published archive, unchanged members are referred to instead of written
    (format version 2), and the catalog then describes the archive written here. With a
    ``part`` id the archive is that part of the component (``<component prefix>/parts/<part>``,
    a worker group's worker: the group's manifest refers to it).
    """
    from ..archive import ArchiveWriter

    target = open_store(store)
    prefix = (
        layout.component_prefix(checkpoint_id, kind, instance)
        if part is None
        else layout.component_part_prefix(checkpoint_id, kind, instance, part)
    )
    adopted = adopt_manifest(target, prefix, checkpoint_id, kind, instance, extra)
    if adopted is not None:
        return adopted
    writer = ArchiveWriter(
        target, prefix, checkpoint_id=checkpoint_id, participant_kind=kind, instance=instance
    )
    plan = catalog.plan(target) if catalog is not None else IncrementalPlan(None)
    try:
        for item in split_export(plan, records):
            check_active()
            if isinstance(item, RecordBatch):
                item.write_to(writer)
            else:
                writer.write(item)
        plan.apply(writer)
    except BaseException:
        writer.abort()  # no manifest: the uploaded shards stay unreferenced garbage
        raise
    with lock:
        check_active()
        try:
            manifest = writer.commit(extra=extra)
        except (ObjectExistsError, ManifestConflictError):
            adopted = adopt_manifest(target, prefix, checkpoint_id, kind, instance, extra)
            if adopted is None:
                raise
            if catalog is not None:
                catalog.forget()  # not our archive's rows: the next commit writes everything
            return adopted
        ref = writer.manifest_ref
        if written is not None:
            written(sum(manifest.record_counts.values()), archive_bytes(manifest) + ref.bytes)
        if catalog is not None:
            catalog.committed(target, prefix, checkpoint_id, plan)
        return (ref.key, ref.sha256, ref.bytes)


def archive_bytes(manifest: Any) -> int:
    """Bytes of a component archive's shards and member index (its manifest aside)."""
    return sum(int(shard.bytes) for shard in manifest.shards) + int(manifest.index.bytes)


def adopt_manifest(
    store: ObjectStore, prefix: str, checkpoint_id: str, kind: str, instance: str, extra: dict[str, JsonValue]
) -> ManifestTriple | None:
    """A manifest a lost try already wrote is ours iff it commits exactly this content."""
    from ..format.record_reader import ArchiveReader

    if not store.exists(f"{prefix}/{layout.MANIFEST_NAME}"):
        return None
    reader = ArchiveReader.open(store, prefix)
    manifest = reader.manifest
    if manifest.checkpoint_id != checkpoint_id or dict(manifest.extra) != extra:
        raise ManifestConflictError(
            f"{store.url}/{prefix} already holds a different commit of {kind}/{instance}",
            key=f"{prefix}/{layout.MANIFEST_NAME}",
        )
    ref = reader.manifest_ref
    return (ref.key, ref.sha256, ref.bytes)


@dataclass(frozen=True)
class SourceComponent:
    """A restore's source component, read and checked against its manifest."""

    prefix: str
    records: list[Record]
    fenced: list[ExecutionId]
    """The in-scope executions it committed or restarts, sorted: restore tombstones them."""
    tombstones: AttemptFence
    bytes: int = 0
    """What the archive holds (shards, index, manifest): what reading it whole costs."""


def read_component(
    store: str | ObjectStore,
    source_checkpoint_id: str,
    kind: str,
    instance: str,
    scope: frozenset[ExecutionId] | None,
    check_active: Callable[[], None],
) -> SourceComponent:
    """Read every in-scope record of a component, verifying each shard before its rows."""
    from ..format.record_reader import ArchiveReader

    def in_scope(execution: ExecutionId) -> bool:
        return scope is None or execution in scope

    source = open_store(store)
    prefix = layout.component_prefix(source_checkpoint_id, kind, instance)
    reader = ArchiveReader.open(source, prefix)
    manifest = reader.manifest
    if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (
        source_checkpoint_id,
        kind,
        instance,
    ):
        raise InvalidRecordError(
            f"{prefix}: manifest is {manifest.participant_kind}/{manifest.instance} of checkpoint "
            f"{manifest.checkpoint_id}, not {kind}/{instance} of {source_checkpoint_id}"
        )
    # Digest-checks the member index; iter_records below checks every shard before its rows.
    indexed = sum(1 for _ in reader.members())
    extra = dict(manifest.extra)
    tombstones = AttemptFence()
    raw_tombstones = extra.get("tombstones", {})
    if not isinstance(raw_tombstones, dict):
        raise InvalidRecordError(f"{prefix}: manifest extra 'tombstones' must be an object")
    tombstones.load(raw_tombstones)  # type: ignore[arg-type]  # validated inside
    committed = parse_executions(extra.get("executions", []), "executions")
    restarts = parse_executions(extra.get("restarts", []), "restarts")
    wanted = {e for e in committed if in_scope(e)}
    records: list[tuple[Record, bytes]] = []
    for raw in reader.iter_raw():  # format 2: referenced members too, each row group checked
        check_active()
        record = decode_record(raw.kind, raw.payload)
        execution = record.execution
        if not in_scope(execution):
            continue
        if execution not in wanted:
            raise InvalidRecordError(
                f"{prefix}: record {record.kind}/{record.record_key} of {execution} is not one of the "
                "manifest's executions"
            )
        if tombstones.is_retired(execution):
            raise InvalidRecordError(f"{prefix}: {execution} is committed but also tombstoned")
        records.append((record, raw.payload))
    if scope is None and len(records) != indexed:
        raise InvalidRecordError(f"{prefix}: read {len(records)} records, the index lists {indexed}")
    try:
        assembled = assemble_boundaries(records)  # format 2: histories back from their chunks
    except InvalidRecordError as exc:
        raise InvalidRecordError(f"{prefix}: {exc.message}") from None
    fenced = sorted(wanted | {e for e in restarts if in_scope(e)}, key=execution_key)
    return SourceComponent(
        prefix=prefix,
        records=assembled,
        fenced=fenced,
        tombstones=tombstones,
        bytes=archive_bytes(manifest) + reader.manifest_ref.bytes,
    )


def parse_executions(value: Any, what: str) -> list[ExecutionId]:
    """``[[rollout_id, attempt], ...]`` from a manifest's extra, validated."""
    if not isinstance(value, list):
        raise InvalidRecordError(f"manifest extra {what!r} must be a list")
    out: list[ExecutionId] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or isinstance(item[1], bool)
            or not isinstance(item[1], int)
        ):
            raise InvalidRecordError(f"manifest extra {what!r} entries must be [rollout_id, attempt]")
        try:
            out.append(ExecutionId(rollout_id=item[0], attempt=item[1]))
        except ValueError as exc:
            raise InvalidRecordError(f"manifest extra {what!r}: {exc}") from None
    return out
