"""What the reader returns: the recovery plan of one checkpoint (a disposition per rollout, the
components read, the verification report) and the checkpoints a fallback skipped."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from pydantic import JsonValue

from ..errors import (
    InvalidRecordError,
)
from ..format.manifests import AggregateManifest, GlobalCheckpointRecord, ObjectRef
from ..format.record_reader import ArchiveReader
from ..format.records import CompletedResultRecord, DispatchRecord, DispatchState, Record
from ..registry import REGISTRY_INSTANCE, REGISTRY_KIND, RegistryEntry
from ..store import ObjectStore
from ._classify import ComponentSummary, TokenSnapshotView
from ._rollouts import DISPOSITIONS, Disposition, RolloutPlan, RolloutPlans

__all__ = [
    "LoadedCheckpoint",
    "RecoveryPlan",
    "SkippedCheckpoint",
    "TokenSnapshotLoader",
    "VerifyReport",
    "default_token_snapshot_loader",
]

TokenSnapshotLoader = Callable[[ObjectStore, Mapping[str, JsonValue]], TokenSnapshotView]


@dataclass(frozen=True)
class VerifyReport:
    """Result of :func:`verify_checkpoint`: every object's full digest was checked."""

    checkpoint_id: str
    components: int
    objects: int
    bytes_verified: int
    counts: dict[str, int]


@dataclass(frozen=True)
class SkippedCheckpoint:
    """A newer checkpoint that ``fallback=True`` passed over, and why."""

    checkpoint_id: str
    code: str
    reason: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"checkpoint_id": self.checkpoint_id, "code": self.code, "reason": self.reason}


@dataclass
class RecoveryPlan:
    """A validated, classified published checkpoint (also called a *loaded checkpoint*).

    ``rollouts`` holds one :class:`RolloutPlan` per dispatched execution, by rollout id, in
    rollout-id order: a read-only mapping (:class:`RolloutPlans`, which builds each plan when it
    is read, so a million rollouts do not cost a million objects up front).
    ``bytes_read`` / ``keys_read`` say what loading it cost; no shard payload is among them.
    """

    store: ObjectStore
    checkpoint_id: str
    record: GlobalCheckpointRecord
    record_ref: ObjectRef
    aggregate: AggregateManifest
    components: list[ComponentSummary]
    rollouts: Mapping[str, RolloutPlan]
    token_snapshot: TokenSnapshotView | None
    bytes_read: int
    keys_read: int
    seconds: float
    readers: dict[tuple[str, str], ArchiveReader] = field(repr=False, default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What the reader noticed on the way (a missing or stale ``latest.json``, passed claims)."""
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    """Newer checkpoints ``fallback=True`` passed over because they failed verification."""
    verified: VerifyReport | None = None
    """Set by ``verify=True`` (the default): every object the plan depends on was digest-checked."""

    @property
    def unverified(self) -> bool:
        """Loaded with ``verify=False``: only manifests and indexes were checked, no payload."""
        return self.verified is None

    def counts(self) -> dict[str, int]:
        if isinstance(self.rollouts, RolloutPlans):
            return self.rollouts.counts()
        out: dict[str, int] = dict.fromkeys(DISPOSITIONS, 0)
        for plan in self.rollouts.values():
            out[plan.disposition] += 1
        return out

    def by_disposition(self, disposition: Disposition) -> list[RolloutPlan]:
        if isinstance(self.rollouts, RolloutPlans):
            return self.rollouts.with_disposition(disposition)
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
            "run_id": self.record.run_id,
            "epoch": self.record.epoch,
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
            "verified": self.verified is not None,
            "notes": list(self.notes),
            "skipped": [s.to_json() for s in self.skipped],
        }
        if rollouts:
            out["rollouts"] = [p.to_json() for p in self.rollouts.values()]
        return out


LoadedCheckpoint = RecoveryPlan


def default_token_snapshot_loader(store: ObjectStore, receipt: Mapping[str, JsonValue]) -> TokenSnapshotView:
    """Load a :class:`~rollout_checkpoint.tokens.TokenSnapshotReceipt` of the reference token
    store (which lives in the checkpoint's own store) and check its length and digest."""
    from pydantic import ValidationError

    from ..tokens import TokenSnapshotReceipt, load_snapshot

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
