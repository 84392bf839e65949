"""The recovery reader: validate a published checkpoint and classify every dispatched execution.

:func:`load_checkpoint` trusts nothing it has not checked against a digest named by the
global checkpoint record, and decides every disposition from manifests and member indexes
alone (``MemberRef.revision`` / ``MemberRef.refs``), never from shard payloads, so reading the
plan of a checkpoint with 100k rollouts costs index bytes, not payload bytes.

Each execution the registry component lists gets exactly one disposition:

* ``completed`` - the framework durably accepted its result before the checkpoint;
* ``continue`` - agent boundary, resources revisions, model lineage and token receipts are all
  present and agree: restore it as attempt N+1;
* ``fresh_dispatch`` - partial state is discarded: run attempt N+1 from the original input;

or the whole checkpoint is rejected (:class:`~rollout_checkpoint.errors.CheckpointRejectedError`).
The rules are specified in ``docs/protocol.md`` ("Recovery classification").
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from .._runtime import gc_paused
from ..errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRejectedError,
    ObjectNotFoundError,
    StaleCoordinatorError,
    StoreError,
)
from ..format import layout
from ..format.chunks import component_records
from ..format.commit_log import (
    PublishedCheckpoint,
    iter_candidates,
    list_published,
    pointer_note,
    read_aggregate,
    read_pointer_hint,
    read_record,
)
from ..format.manifests import ComponentRef
from ..format.ownership import read_epochs, stale_reason
from ..format.record_reader import ArchiveReader
from ..format.records import OutputChunkRecord
from ..ids import validate_id
from ..registry import REGISTRY_INSTANCE, REGISTRY_KIND
from ..store import ObjectStore, open_store
from ..store._counting import CountingStore
from ._classify import (
    ComponentSummary,
    TokenSnapshotView,
    classify,
    reject,
)
from ._cut_checks import verify_cut_tokens
from ._plan import (
    RecoveryPlan,
    SkippedCheckpoint,
    TokenSnapshotLoader,
    VerifyReport,
    default_token_snapshot_loader,
)

__all__ = ["list_checkpoints", "load_checkpoint", "resolve_checkpoint_id", "verify_checkpoint"]


def resolve_checkpoint_id(store: ObjectStore, checkpoint_id: str | None = None) -> str:
    """``checkpoint_id`` itself, else the newest published checkpoint of the log.

    The order comes from the sequence claims (:mod:`~rollout_checkpoint.format.commit_log`), never from
    ``latest.json``. An explicit id that is not a valid id is ``invalid_id`` (a typo is not a
    rejected checkpoint).
    """
    if checkpoint_id is not None:
        return validate_id(checkpoint_id, "checkpoint_id")
    newest = next(iter_candidates(store), None)
    if newest is None:
        raise CheckpointNotFoundError(f"{store.url}: no published checkpoint", url=store.url)
    return newest.checkpoint_id


def list_checkpoints(url_or_store: str | ObjectStore, **storage_options: Any) -> list[PublishedCheckpoint]:
    """Published checkpoints, newest first (the ``latest`` pointer's target marked)."""
    return list_published(open_store(url_or_store, **storage_options))


def _skippable(exc: CheckpointError) -> bool:
    """Fallback passes over damage only: a checkpoint rejected for a declared unsafe external
    effect must stop the reader, since older state predates that effect."""
    return isinstance(exc, CheckpointRejectedError) and "unsafe_effects" not in exc.details


UNVERIFIED_NOTE = (
    "unverified: loaded with verify=False, so no shard, index or token row was digest-checked; "
    "a damaged payload shows only when a restore reads it"
)


def load_checkpoint(
    url_or_store: str | ObjectStore,
    checkpoint_id: str | None = None,
    *,
    verify: bool = True,
    fallback: bool = False,
    token_snapshot_loader: TokenSnapshotLoader | None = None,
    **storage_options: Any,
) -> RecoveryPlan:
    """Validate the published checkpoint (the newest by default) and classify every execution.

    Raises :class:`CheckpointNotFoundError` when nothing is published and
    :class:`CheckpointRejectedError` (with ``details["reason"]``) when the checkpoint must not
    be used. Reads the record (checked against its digest and sequence claim), the aggregate,
    the component manifests, their member indexes and the token snapshot manifest, and by
    default (``verify=True``: fail closed) digest-checks every shard, index and token row the
    plan depends on. ``verify=False`` is the cheap plan (no shard payload read); it says so
    (:attr:`RecoveryPlan.unverified`, a note). ``fallback=True``: when that checkpoint is
    rejected as damaged, use the newest older one that loads (and verifies), listing what was passed over in
    :attr:`RecoveryPlan.skipped`. Without ``fallback`` a damaged newest checkpoint is an error,
    never a silent step back.
    """
    started = time.perf_counter()
    base = open_store(url_or_store, **storage_options)
    notes: list[str] = []
    if checkpoint_id is not None and not fallback:
        plan = _load_one(base, validate_id(checkpoint_id, "checkpoint_id"), verify, token_snapshot_loader)
        if not verify:
            plan.notes.append(UNVERIFIED_NOTE)
        plan.seconds = time.perf_counter() - started
        return plan
    hint = read_pointer_hint(base) if checkpoint_id is None else None
    candidates = iter_candidates(base, trailing=notes)
    if checkpoint_id is not None:
        wanted = validate_id(checkpoint_id, "checkpoint_id")
        candidates = itertools.dropwhile(lambda c: c.checkpoint_id != wanted, candidates)
    skipped: list[SkippedCheckpoint] = []
    for index, candidate in enumerate(candidates):
        notes.extend(candidate.passed)
        if index == 0 and hint is not None:
            note = pointer_note(hint, candidate)
            if note is not None:
                notes.append(note)
        try:
            plan = _load_one(base, candidate.checkpoint_id, verify, token_snapshot_loader)
        except CheckpointNotFoundError:
            notes.append(f"{candidate.checkpoint_id}: unpublished while loading")
            continue
        except CheckpointError as exc:
            if exc.details.get("code") == StaleCoordinatorError.code:
                # a fenced coordinator's late record: never published, as far as readers go
                notes.append(f"passed over: {exc.details['reason']}")
                continue
            if not (fallback and _skippable(exc)):
                if notes:
                    exc.details.setdefault("notes", list(notes))
                raise
            skipped.append(SkippedCheckpoint(candidate.checkpoint_id, exc.code, exc.message))
            continue
        plan.notes, plan.skipped = notes, skipped
        if not verify:
            plan.notes.append(UNVERIFIED_NOTE)
        plan.seconds = time.perf_counter() - started
        return plan
    if skipped:
        raise CheckpointRejectedError(
            f"{base.url}: no published checkpoint "
            + ("verifies: " if verify else "loads: ")
            + "; ".join(f"{s.checkpoint_id} ({s.reason})" for s in skipped),
            reason="every published checkpoint was rejected",
            skipped=[s.to_json() for s in skipped],
            notes=notes,
        )
    if checkpoint_id is not None:
        raise CheckpointNotFoundError(
            f"{base.url}: no published checkpoint {checkpoint_id!r}", checkpoint_id=checkpoint_id
        )
    # a sequence claim without its record (a publish interrupted before its commit point, or a
    # removed record: the store cannot tell them apart) publishes nothing; the message says so
    raise CheckpointNotFoundError(
        f"{base.url}: no published checkpoint" + (f" ({'; '.join(notes)})" if notes else ""),
        url=base.url,
        notes=notes,
    )


def _load_one(
    base: ObjectStore, cid: str, verify: bool, token_snapshot_loader: TokenSnapshotLoader | None
) -> RecoveryPlan:
    """One checkpoint, loaded with the cycle collector paused: the plan is millions of acyclic
    objects at a million rollouts, and the collector's full passes over them found nothing and
    took a third of the load (``_runtime.gc_paused``)."""
    with gc_paused():
        return _load_checked(base, cid, verify, token_snapshot_loader)


def _load_checked(
    base: ObjectStore, cid: str, verify: bool, token_snapshot_loader: TokenSnapshotLoader | None
) -> RecoveryPlan:
    started = time.perf_counter()
    store = CountingStore(base)
    try:
        record, record_ref = read_record(store, cid)
    except CheckpointNotFoundError:
        raise
    except CheckpointError as exc:
        if _store_failure(exc):
            raise  # the store failed: no answer about the checkpoint was received
        raise reject(cid, f"global checkpoint record unreadable: {exc.message}", code=exc.code) from exc
    stale = stale_reason(record, read_epochs(store))
    if stale is not None:
        raise reject(cid, stale, code=StaleCoordinatorError.code, run_id=record.run_id, epoch=record.epoch)
    try:
        aggregate = read_aggregate(store, record.aggregate)
    except CheckpointError as exc:
        if _store_failure(exc):
            raise
        raise reject(cid, f"aggregate manifest missing or corrupt: {exc.message}", code=exc.code) from exc
    if aggregate.checkpoint_id != cid or aggregate.commit_token != record.commit_token:
        raise reject(cid, "aggregate manifest belongs to another checkpoint or commit")
    if sorted(aggregate.components, key=_ref_key) != sorted(record.components, key=_ref_key):
        raise reject(cid, "aggregate manifest and global record name different components")

    readers: dict[tuple[str, str], ArchiveReader] = {}
    summaries: list[ComponentSummary] = []
    for ref in record.components:
        reader = _open_component(store, cid, ref)
        readers[(ref.kind, ref.instance)] = reader
        manifest = reader.manifest
        summaries.append(ComponentSummary(ref, dict(manifest.record_counts), dict(manifest.extra)))
    if (REGISTRY_KIND, REGISTRY_INSTANCE) not in readers:
        raise reject(cid, "the checkpoint has no framework/registry component")

    snapshot: TokenSnapshotView | None = None
    if record.token_snapshot is not None:
        loader = token_snapshot_loader or default_token_snapshot_loader
        try:
            snapshot = loader(store, record.token_snapshot)
        except CheckpointError as exc:
            if _store_failure(exc):
                raise
            raise reject(cid, f"token-store snapshot unusable: {exc.message}", code=exc.code) from exc

    rollouts = classify(cid, readers, summaries, snapshot)
    plan = RecoveryPlan(
        store=base,
        checkpoint_id=cid,
        record=record,
        record_ref=record_ref,
        aggregate=aggregate,
        components=summaries,
        rollouts=rollouts,
        token_snapshot=snapshot,
        bytes_read=store.bytes_read,
        keys_read=len(store.keys_read),
        seconds=time.perf_counter() - started,
        readers=readers,
    )
    if verify:
        plan.verified = _verify_plan(plan, token_snapshot_loader)
    return plan


def _store_failure(exc: CheckpointError) -> bool:
    """A failed request (unreachable, denied, throttled) rather than missing or altered bytes."""
    return isinstance(exc, StoreError) and not isinstance(exc, ObjectNotFoundError)


def _ref_key(ref: ComponentRef) -> tuple[str, str]:
    return (ref.kind, ref.instance)


def _open_component(store: ObjectStore, cid: str, ref: ComponentRef) -> ArchiveReader:
    expected_prefix = layout.component_prefix(cid, ref.kind, ref.instance)
    if ref.prefix != expected_prefix or ref.manifest.key != f"{expected_prefix}/{layout.MANIFEST_NAME}":
        raise reject(cid, f"component {ref.kind}/{ref.instance} is not at its layout prefix")
    try:
        reader = ArchiveReader.open(store, ref.prefix, expected_sha256=ref.manifest.sha256)
        manifest = reader.manifest
        if reader.manifest_ref.bytes != ref.manifest.bytes:
            raise reject(cid, f"component {ref.kind}/{ref.instance}: manifest length differs from the record")
        if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (
            cid,
            ref.kind,
            ref.instance,
        ):
            raise reject(cid, f"component {ref.kind}/{ref.instance}: manifest names another component")
        reader.open_bases()  # format 2: the reference table and every base manifest, pinned
    except CheckpointRejectedError:
        raise
    except CheckpointError as exc:
        raise reject(
            cid, f"component {ref.kind}/{ref.instance} missing or corrupt: {exc.message}", code=exc.code
        ) from exc
    return reader


def _verify_plan(plan: RecoveryPlan, token_snapshot_loader: TokenSnapshotLoader | None) -> VerifyReport:
    """Stream every shard and index of every component (length + sha256) and, for the reference
    token store, every token row the snapshot lists; reject on the first mismatch."""
    objects = 2
    total = plan.record_ref.bytes + plan.record.aggregate.bytes
    for (kind, instance), reader in plan.readers.items():
        try:
            reader.verify()
            if _chunked(reader):
                component_records(reader)  # format 2: every boundary's chunks listed, intact, in order
        except CheckpointError as exc:
            if _store_failure(exc):
                raise
            raise reject(
                plan.checkpoint_id,
                f"component {kind}/{instance} failed verification: {exc.message}",
                code=exc.code,
            ) from exc
        manifest = reader.manifest
        objects += len(manifest.shards) + 2
        total += manifest.total_bytes + reader.manifest_ref.bytes
        if manifest.references is not None:
            objects += 1 + len(manifest.bases or [])
            total += manifest.references.bytes
    receipt = plan.record.token_snapshot
    if receipt is not None and token_snapshot_loader is None:
        # The reference token store: check the token rows themselves, not only the snapshot
        # manifest that classification reads. A custom store brings its own loader and checks.
        from pydantic import ValidationError

        from ..tokens import TokenSnapshotReceipt, load_snapshot, verify_snapshot_data

        try:
            parsed = TokenSnapshotReceipt.model_validate(dict(receipt))
        except ValidationError:
            parsed = None
        if parsed is not None:
            try:
                verify_snapshot_data(plan.store, parsed)
                objects += 1
                entries = load_snapshot(plan.store, parsed)
                for (kind, _), reader in plan.readers.items():
                    if kind == "model":
                        verify_cut_tokens(plan.store, entries, reader.members(kind="model_lineage"))
            except CheckpointError as exc:
                if _store_failure(exc):
                    raise
                raise reject(
                    plan.checkpoint_id, f"token-store data failed verification: {exc.message}", code=exc.code
                ) from exc
    return VerifyReport(plan.checkpoint_id, len(plan.readers), objects, total, plan.counts())


def _chunked(reader: ArchiveReader) -> bool:
    """Whether the component holds ``output_chunk`` members (stored or referenced)."""
    manifest = reader.manifest
    stored = manifest.record_counts.get(OutputChunkRecord.kind, 0)
    referenced = (
        0 if manifest.references is None else manifest.references.counts.get(OutputChunkRecord.kind, 0)
    )
    return bool(stored or referenced)


def verify_checkpoint(
    url_or_store: str | ObjectStore,
    checkpoint_id: str | None = None,
    *,
    token_snapshot_loader: TokenSnapshotLoader | None = None,
    **storage_options: Any,
) -> VerifyReport:
    """:func:`load_checkpoint` with ``verify=True``: a full digest check of every object.

    Raises :class:`CheckpointRejectedError` when any byte disagrees with its manifest.
    """
    plan = load_checkpoint(
        url_or_store,
        checkpoint_id,
        verify=True,
        token_snapshot_loader=token_snapshot_loader,
        **storage_options,
    )
    assert plan.verified is not None
    return plan.verified
