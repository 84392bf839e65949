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

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import JsonValue

from . import layout
from ._cut_checks import cut_lineage_problem, cut_receipt_conflicts, verify_cut_tokens
from ._reconcile import RESOURCE_KINDS, lineage_past_boundary, resources_disagree
from .archive import ArchiveReader, MemberRef
from .errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointRejectedError,
    InvalidRecordError,
)
from .ids import ExecutionId, validate_id
from .manifests import (
    AggregateManifest,
    ComponentRef,
    GlobalCheckpointRecord,
    ObjectRef,
    PublishedCheckpoint,
    list_published,
    read_aggregate,
    read_latest,
    read_record,
)
from .records import CompletedResultRecord, DispatchRecord, DispatchState, Record
from .registry import REGISTRY_INSTANCE, REGISTRY_KIND, RegistryEntry
from .store import ObjectStore, open_store
from .store._counting import CountingStore

__all__ = [
    "ComponentSummary",
    "Disposition",
    "LoadedCheckpoint",
    "RecoveryPlan",
    "RolloutPlan",
    "TokenSnapshotLoader",
    "TokenSnapshotView",
    "VerifyReport",
    "default_token_snapshot_loader",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_checkpoint_id",
    "verify_checkpoint",
]

Disposition = Literal["completed", "continue", "fresh_dispatch"]
DISPOSITIONS: tuple[Disposition, ...] = ("completed", "continue", "fresh_dispatch")

_COMPLETED_STATES = frozenset({"handed_off", "consumed"})

Execution = tuple[str, int]


@dataclass(frozen=True)
class TokenSnapshotView:
    """What classification needs of a token-store snapshot: ``key -> (digest, length)``."""

    snapshot_id: str
    store: str | None
    entries: Mapping[str, tuple[str, int]]


TokenSnapshotLoader = Callable[[ObjectStore, Mapping[str, JsonValue]], TokenSnapshotView]


@dataclass(frozen=True)
class RolloutPlan:
    """The disposition of one dispatched execution (``attempt`` is the checkpointed attempt N)."""

    rollout_id: str
    attempt: int
    disposition: Disposition
    reason: str
    state: DispatchState
    restart_only: bool = False

    @property
    def execution(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt)

    @property
    def next_attempt(self) -> int:
        """The attempt that runs after a restore: N for ``completed`` (nothing runs), else N+1."""
        return self.attempt if self.disposition == "completed" else self.attempt + 1

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "disposition": self.disposition,
            "reason": self.reason,
            "state": self.state,
            "restart_only": self.restart_only,
            "next_attempt": self.next_attempt,
        }


@dataclass(frozen=True)
class ComponentSummary:
    """One validated component: its ref, its manifest ``extra`` and member counts."""

    ref: ComponentRef
    record_counts: dict[str, int]
    extra: dict[str, JsonValue]

    @property
    def kind(self) -> str:
        return self.ref.kind

    @property
    def instance(self) -> str:
        return self.ref.instance

    @property
    def tombstones(self) -> dict[str, int]:
        raw = self.extra.get("tombstones")
        if not isinstance(raw, dict):
            return {}
        return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}

    @property
    def restarts(self) -> list[Execution]:
        return _pairs(self.extra.get("restarts"))

    @property
    def executions(self) -> list[Execution]:
        return _pairs(self.extra.get("executions"))

    @property
    def unsafe_effects(self) -> list[dict[str, JsonValue]]:
        raw = self.extra.get("unsafe_effects")
        return [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []


@dataclass
class RecoveryPlan:
    """A validated, classified published checkpoint (also called a *loaded checkpoint*).

    ``rollouts`` holds one :class:`RolloutPlan` per dispatched execution, by rollout id.
    ``bytes_read`` / ``keys_read`` say what loading it cost; no shard payload is among them.
    """

    store: ObjectStore
    checkpoint_id: str
    record: GlobalCheckpointRecord
    record_ref: ObjectRef
    aggregate: AggregateManifest
    components: list[ComponentSummary]
    rollouts: dict[str, RolloutPlan]
    token_snapshot: TokenSnapshotView | None
    bytes_read: int
    keys_read: int
    seconds: float
    readers: dict[tuple[str, str], ArchiveReader] = field(repr=False, default_factory=dict)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(DISPOSITIONS, 0)
        for plan in self.rollouts.values():
            out[plan.disposition] += 1
        return out

    def by_disposition(self, disposition: Disposition) -> list[RolloutPlan]:
        return [p for p in self.rollouts.values() if p.disposition == disposition]

    @property
    def completed(self) -> list[RolloutPlan]:
        return self.by_disposition("completed")

    @property
    def continued(self) -> list[RolloutPlan]:
        return self.by_disposition("continue")

    @property
    def fresh(self) -> list[RolloutPlan]:
        return self.by_disposition("fresh_dispatch")

    def component(self, kind: str, instance: str) -> ComponentSummary:
        for comp in self.components:
            if comp.kind == kind and comp.instance == instance:
                return comp
        raise KeyError((kind, instance))

    def participant_components(self) -> list[ComponentSummary]:
        return [c for c in self.components if c.ref.role == "participant"]

    def registry_records(self) -> Iterator[Record]:
        """The registry's own records with payloads (restore needs input digests and results).

        This is the one payload read recovery does, and only :meth:`registry_entries` calls it.
        """
        reader = self.readers[(REGISTRY_KIND, REGISTRY_INSTANCE)]
        yield from reader.iter_records()

    def registry_entries(self) -> tuple[list[RegistryEntry], dict[str, int]]:
        """The registry as restore rebuilds it, and the tombstones it carries forward.

        completed: kept as is (results retained until consumed); continue: attempt N+1
        ``running``; fresh_dispatch: attempt N+1 ``queued`` from the original input.
        """
        dispatch: dict[str, DispatchRecord] = {}
        results: dict[str, CompletedResultRecord] = {}
        for record in self.registry_records():
            if isinstance(record, DispatchRecord):
                dispatch[record.rollout_id] = record
            elif isinstance(record, CompletedResultRecord):
                results[record.rollout_id] = record
        retired: dict[str, int] = {}
        raw = self.component(REGISTRY_KIND, REGISTRY_INSTANCE).extra.get("retired")
        if isinstance(raw, dict):
            retired = {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}
        entries: list[RegistryEntry] = []
        for rollout_id, plan in self.rollouts.items():
            source = dispatch[rollout_id]
            if plan.disposition == "completed":
                result = results.get(rollout_id)
                state: DispatchState = "handed_off" if result is not None else "consumed"
                entries.append(
                    RegistryEntry(
                        rollout_id, plan.attempt, state, source.input_digest, source.restart_only, result
                    )
                )
                continue
            retired[rollout_id] = max(retired.get(rollout_id, -1), plan.attempt)
            state = "running" if plan.disposition == "continue" else "queued"
            entries.append(
                RegistryEntry(rollout_id, plan.attempt + 1, state, source.input_digest, source.restart_only)
            )
        return entries, retired

    def to_json(self, *, rollouts: bool = True) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {
            "checkpoint_id": self.checkpoint_id,
            "sequence": self.record.sequence,
            "created_at": self.record.created_at.isoformat(),
            "status": "ok",
            "counts": dict(self.counts().items()),
            "dispatched": len(self.rollouts),
            "components": [
                {
                    "kind": c.kind,
                    "instance": c.instance,
                    "role": c.ref.role,
                    "records": sum(c.record_counts.values()),
                }
                for c in self.components
            ],
            "token_snapshot": None if self.token_snapshot is None else self.token_snapshot.snapshot_id,
            "bytes_read": self.bytes_read,
            "keys_read": self.keys_read,
            "seconds": round(self.seconds, 6),
        }
        if rollouts:
            out["rollouts"] = [p.to_json() for p in self.rollouts.values()]
        return out


LoadedCheckpoint = RecoveryPlan


@dataclass(frozen=True)
class VerifyReport:
    """Result of :func:`verify_checkpoint`: every object's full digest was checked."""

    checkpoint_id: str
    components: int
    objects: int
    bytes_verified: int
    counts: dict[str, int]


def _pairs(raw: Any) -> list[Execution]:
    out: list[Execution] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, list | tuple) and len(item) == 2:
                out.append((str(item[0]), int(item[1])))
            elif isinstance(item, dict) and "rollout_id" in item:
                out.append((str(item["rollout_id"]), int(item.get("attempt", 0))))
    return out


def _reject(checkpoint_id: str, reason: str, **details: Any) -> CheckpointRejectedError:
    return CheckpointRejectedError(
        f"checkpoint {checkpoint_id!r} rejected: {reason}",
        checkpoint_id=checkpoint_id,
        reason=reason,
        **details,
    )


def default_token_snapshot_loader(store: ObjectStore, receipt: Mapping[str, JsonValue]) -> TokenSnapshotView:
    """Load a :class:`~rollout_checkpoint.tokens.TokenSnapshotReceipt` of the reference token
    store (which lives in the checkpoint's own store) and check its length and digest."""
    from pydantic import ValidationError

    from .tokens import TokenSnapshotReceipt, load_snapshot

    try:
        parsed = TokenSnapshotReceipt.model_validate(dict(receipt))
    except ValidationError as exc:
        raise InvalidRecordError(f"token snapshot receipt is not valid: {exc}") from None
    entries = load_snapshot(store, parsed)
    return TokenSnapshotView(
        snapshot_id=parsed.snapshot_id,
        store=parsed.store,
        entries={key: (entry.digest, entry.length) for key, entry in entries.items()},
    )


def resolve_checkpoint_id(store: ObjectStore, checkpoint_id: str | None = None) -> str:
    """``checkpoint_id`` itself, else the ``latest`` pointer's target, else the newest published.

    The pointer is preferred; a pointer that is missing or names an unpublished record falls
    back to the newest listed record (a crash between the commit point and the pointer move
    leaves exactly that state). An explicit id that is not a valid id is ``invalid_id`` (a
    typo is not a rejected checkpoint).
    """
    if checkpoint_id is not None:
        return validate_id(checkpoint_id, "checkpoint_id")
    pointer = read_latest(store)
    if pointer is not None and store.exists(layout.published_key(pointer[0].checkpoint_id)):
        return pointer[0].checkpoint_id
    listed = [p for p in list_published(store) if p.record is not None]
    if not listed:
        raise CheckpointNotFoundError(f"{store.url}: no published checkpoint", url=store.url)
    return listed[0].checkpoint_id


def list_checkpoints(url_or_store: str | ObjectStore, **storage_options: Any) -> list[PublishedCheckpoint]:
    """Published checkpoints, newest first (the ``latest`` pointer's target marked)."""
    return list_published(open_store(url_or_store, **storage_options))


def load_checkpoint(
    url_or_store: str | ObjectStore,
    checkpoint_id: str | None = None,
    *,
    token_snapshot_loader: TokenSnapshotLoader | None = None,
    **storage_options: Any,
) -> RecoveryPlan:
    """Validate the published checkpoint (latest by default) and classify every execution.

    Raises :class:`CheckpointNotFoundError` when nothing is published and
    :class:`CheckpointRejectedError` (with ``details["reason"]``) when the checkpoint must not
    be used. Reads the record, the aggregate, the component manifests, their member indexes and
    the token snapshot manifest; never a shard payload.
    """
    started = time.perf_counter()
    base = open_store(url_or_store, **storage_options)
    store = CountingStore(base)
    cid = resolve_checkpoint_id(store, checkpoint_id)
    try:
        record, record_ref = read_record(store, cid)
    except CheckpointNotFoundError:
        raise
    except CheckpointError as exc:
        raise _reject(cid, f"global checkpoint record unreadable: {exc.message}", code=exc.code) from exc
    try:
        aggregate = read_aggregate(store, record.aggregate)
    except CheckpointError as exc:
        raise _reject(cid, f"aggregate manifest missing or corrupt: {exc.message}", code=exc.code) from exc
    if aggregate.checkpoint_id != cid or aggregate.commit_token != record.commit_token:
        raise _reject(cid, "aggregate manifest belongs to another checkpoint or commit")
    if sorted(aggregate.components, key=_ref_key) != sorted(record.components, key=_ref_key):
        raise _reject(cid, "aggregate manifest and global record name different components")

    readers: dict[tuple[str, str], ArchiveReader] = {}
    summaries: list[ComponentSummary] = []
    for ref in record.components:
        reader = _open_component(store, cid, ref)
        readers[(ref.kind, ref.instance)] = reader
        manifest = reader.manifest
        summaries.append(ComponentSummary(ref, dict(manifest.record_counts), dict(manifest.extra)))
    if (REGISTRY_KIND, REGISTRY_INSTANCE) not in readers:
        raise _reject(cid, "the checkpoint has no framework/registry component")

    snapshot: TokenSnapshotView | None = None
    if record.token_snapshot is not None:
        loader = token_snapshot_loader or default_token_snapshot_loader
        try:
            snapshot = loader(store, record.token_snapshot)
        except CheckpointError as exc:
            raise _reject(cid, f"token-store snapshot unusable: {exc.message}", code=exc.code) from exc

    rollouts = _classify(cid, readers, summaries, snapshot)
    return RecoveryPlan(
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


def _ref_key(ref: ComponentRef) -> tuple[str, str]:
    return (ref.kind, ref.instance)


def _open_component(store: ObjectStore, cid: str, ref: ComponentRef) -> ArchiveReader:
    expected_prefix = layout.component_prefix(cid, ref.kind, ref.instance)
    if ref.prefix != expected_prefix or ref.manifest.key != f"{expected_prefix}/{layout.MANIFEST_NAME}":
        raise _reject(cid, f"component {ref.kind}/{ref.instance} is not at its layout prefix")
    try:
        reader = ArchiveReader.open(store, ref.prefix, expected_sha256=ref.manifest.sha256)
        manifest = reader.manifest
        if reader.manifest_ref.bytes != ref.manifest.bytes:
            raise _reject(
                cid, f"component {ref.kind}/{ref.instance}: manifest length differs from the record"
            )
        if (manifest.checkpoint_id, manifest.participant_kind, manifest.instance) != (
            cid,
            ref.kind,
            ref.instance,
        ):
            raise _reject(cid, f"component {ref.kind}/{ref.instance}: manifest names another component")
    except CheckpointRejectedError:
        raise
    except CheckpointError as exc:
        raise _reject(
            cid, f"component {ref.kind}/{ref.instance} missing or corrupt: {exc.message}", code=exc.code
        ) from exc
    return reader


def _members(reader: ArchiveReader, cid: str) -> Iterator[MemberRef]:
    try:
        yield from reader.members()
    except CheckpointError as exc:
        raise _reject(cid, f"member index unreadable: {exc.message}", code=exc.code) from exc


def _classify(
    cid: str,
    readers: Mapping[tuple[str, str], ArchiveReader],
    summaries: Sequence[ComponentSummary],
    snapshot: TokenSnapshotView | None,
) -> dict[str, RolloutPlan]:
    # -- every participant's declarations first: unsafe effects reject everything -------------------
    restarts: dict[Execution, str] = {}
    tombstones: dict[str, int] = {}
    for comp in summaries:
        if comp.ref.role != "participant":
            continue
        effects = comp.unsafe_effects
        if effects:
            first = effects[0]
            raise _reject(
                cid,
                f"participant {comp.kind}/{comp.instance} declared an unsafe external effect for "
                f"{first.get('rollout_id')}#{first.get('attempt')}: {first.get('description')}",
                unsafe_effects=len(effects),
            )
        for ex in comp.restarts:
            restarts.setdefault(ex, f"{comp.kind}/{comp.instance}")
        for rollout_id, mark in comp.tombstones.items():
            tombstones[rollout_id] = max(tombstones.get(rollout_id, -1), mark)

    # -- the registry: dispatched executions and acknowledged results -----------------------------
    registry = readers[(REGISTRY_KIND, REGISTRY_INSTANCE)]
    dispatched: dict[str, tuple[int, str, bool]] = {}
    acknowledged: set[Execution] = set()
    for m in _members(registry, cid):
        if m.kind == "dispatch":
            refs = m.refs or {}
            if m.rollout_id in dispatched:
                raise _reject(cid, f"registry lists rollout {m.rollout_id!r} twice")
            dispatched[m.rollout_id] = (m.attempt, str(refs.get("state")), bool(refs.get("restart_only")))
        elif m.kind == "completed_result":
            acknowledged.add((m.rollout_id, m.attempt))

    # -- participant members, grouped by execution ------------------------------------------------
    boundaries: dict[Execution, tuple[int, dict[str, Any]]] = {}
    resources: dict[Execution, dict[str, dict[str, int]]] = {}  # instance -> session -> revision
    instances: dict[str, int] = {}  # resources instance -> how many components carry that name
    lineage: dict[Execution, dict[str, dict[str, Any]]] = {}
    receipts: dict[Execution, dict[str, dict[str, Any]]] = {}
    for comp in summaries:
        if comp.ref.role == "participant" and comp.kind in RESOURCE_KINDS:
            instances[comp.instance] = instances.get(comp.instance, 0) + 1
    for comp in summaries:
        if comp.ref.role != "participant":
            continue
        for m in _members(readers[(comp.kind, comp.instance)], cid):
            ex = (m.rollout_id, m.attempt)
            refs = m.refs or {}
            if m.kind == "agent_boundary":
                rev = m.revision if m.revision is not None else -1
                best = boundaries.get(ex)
                if best is None or rev > best[0]:
                    boundaries[ex] = (rev, refs)
            elif m.kind == "resource_snapshot":
                sessions = resources.setdefault(ex, {}).setdefault(comp.instance, {})
                sessions[m.key] = m.revision if m.revision is not None else -1
            elif m.kind == "model_lineage":
                lineage.setdefault(ex, {})[m.key] = refs
            elif m.kind == "token_receipt":
                receipts.setdefault(ex, {})[m.key] = refs

    # -- every receipt must agree with the token-store snapshot (else reject) ---------------------
    for ex, by_key in receipts.items():
        for key, refs in by_key.items():
            _check_receipt(cid, ex, key, refs, snapshot)
    # -- every generation cut must agree with the receipt of its own key (else reject) ------------
    for ex, by_call in lineage.items():
        conflicts = cut_receipt_conflicts(by_call, receipts.get(ex, {}))
        if conflicts:
            raise _reject(cid, f"{ex[0]}#{ex[1]}: {conflicts[0]}")

    # -- one disposition per dispatched execution -------------------------------------------------
    out: dict[str, RolloutPlan] = {}
    for rollout_id in sorted(dispatched):
        attempt, state, restart_only = dispatched[rollout_id]
        ex = (rollout_id, attempt)
        disposition, reason = _dispose(
            ex,
            state,
            restart_only,
            ex in acknowledged,
            restarts,
            tombstones,
            boundaries,
            resources,
            instances,
            lineage,
            receipts,
        )
        out[rollout_id] = RolloutPlan(
            rollout_id, attempt, disposition, reason, cast(DispatchState, state), restart_only
        )
    return out


def _check_receipt(
    cid: str, ex: Execution, key: str, refs: Mapping[str, Any], snapshot: TokenSnapshotView | None
) -> None:
    where = f"{ex[0]}#{ex[1]} token key {key!r}"
    if snapshot is None:
        raise _reject(cid, f"{where}: a token receipt exists but the checkpoint has no token-store snapshot")
    # The receipt's ``store`` name is not compared: it embeds the store URL, and a checkpoint
    # copied to another bucket or directory must stay loadable. Digest and length decide.
    entry = snapshot.entries.get(key)
    if entry is None:
        raise _reject(cid, f"{where}: receipt is missing from token-store snapshot {snapshot.snapshot_id!r}")
    if refs.get("digest") != entry[0] or refs.get("length") != entry[1]:
        raise _reject(
            cid,
            f"{where}: receipt (digest {refs.get('digest')}, length {refs.get('length')}) disagrees with "
            f"token-store snapshot {snapshot.snapshot_id!r} (digest {entry[0]}, length {entry[1]})",
        )


def _dispose(
    ex: Execution,
    state: str,
    restart_only: bool,
    acknowledged: bool,
    restarts: Mapping[Execution, str],
    tombstones: Mapping[str, int],
    boundaries: Mapping[Execution, tuple[int, dict[str, Any]]],
    resources: Mapping[Execution, Mapping[str, Mapping[str, int]]],
    instances: Mapping[str, int],
    lineage: Mapping[Execution, dict[str, dict[str, Any]]],
    receipts: Mapping[Execution, dict[str, dict[str, Any]]],
) -> tuple[Disposition, str]:
    if acknowledged or state in _COMPLETED_STATES:
        return "completed", "result durably acknowledged before the checkpoint"
    if restart_only:
        return "fresh_dispatch", "restart-only execution"
    if ex in restarts:
        return "fresh_dispatch", f"participant {restarts[ex]} reported it must restart"
    if state == "queued":
        return "fresh_dispatch", "never started"
    mark = tombstones.get(ex[0])
    if mark is not None and ex[1] <= mark:
        return "fresh_dispatch", f"attempt retired by a participant (tombstone {mark})"
    boundary = boundaries.get(ex)
    if boundary is None:
        return "fresh_dispatch", "no agent boundary"
    refs = boundary[1]
    mismatch = resources_disagree(refs.get("resources"), resources.get(ex, {}), instances)
    if mismatch is not None:
        return "fresh_dispatch", mismatch
    calls = lineage.get(ex, {})
    model_call = refs.get("model_call")
    if model_call is not None and model_call not in calls:
        return "fresh_dispatch", f"model call {model_call!r} missing from lineage"
    held = receipts.get(ex, {})
    for call_id, call_refs in sorted(calls.items()):
        parent = call_refs.get("parent")
        if parent is not None and parent not in calls:
            return "fresh_dispatch", f"lineage of call {call_id!r} misses its parent {parent!r}"
        token_key = call_refs.get("token_key")
        if token_key is not None and token_key not in held:
            return "fresh_dispatch", f"no token receipt for call {call_id!r}"
    cut_problem = cut_lineage_problem(calls)
    if cut_problem is not None:
        return "fresh_dispatch", cut_problem
    past = lineage_past_boundary(calls, model_call)
    if past:
        return (
            "fresh_dispatch",
            f"model lineage runs past the boundary's last committed call {model_call!r}: {past}",
        )
    return "continue", "agent boundary, resources, lineage and token receipts agree"


def verify_checkpoint(
    url_or_store: str | ObjectStore,
    checkpoint_id: str | None = None,
    *,
    token_snapshot_loader: TokenSnapshotLoader | None = None,
    **storage_options: Any,
) -> VerifyReport:
    """:func:`load_checkpoint` plus a full digest check of every shard and index.

    Raises :class:`CheckpointRejectedError` when any byte disagrees with its manifest.
    """
    plan = load_checkpoint(
        url_or_store, checkpoint_id, token_snapshot_loader=token_snapshot_loader, **storage_options
    )
    objects = 2
    total = plan.record_ref.bytes + plan.record.aggregate.bytes
    for (kind, instance), reader in plan.readers.items():
        try:
            reader.verify()
        except CheckpointError as exc:
            raise _reject(
                plan.checkpoint_id,
                f"component {kind}/{instance} failed verification: {exc.message}",
                code=exc.code,
            ) from exc
        manifest = reader.manifest
        objects += len(manifest.shards) + 2
        total += manifest.total_bytes + reader.manifest_ref.bytes
    receipt = plan.record.token_snapshot
    if receipt is not None and token_snapshot_loader is None:
        # The reference token store: check the token rows themselves, not only the snapshot
        # manifest that classification reads. A custom store brings its own loader and checks.
        from pydantic import ValidationError

        from .tokens import TokenSnapshotReceipt, load_snapshot, verify_snapshot_data

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
                raise _reject(
                    plan.checkpoint_id, f"token-store data failed verification: {exc.message}", code=exc.code
                ) from exc
    return VerifyReport(plan.checkpoint_id, len(plan.readers), objects, total, plan.counts())
