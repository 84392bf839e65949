"""Per-rollout classification of a published checkpoint (``docs/protocol.md``, "Recovery
classification"), decided from manifests and member indexes alone, never from payloads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import JsonValue

from ..archive import MemberRef
from ..errors import CheckpointError, CheckpointRejectedError
from ..format.manifests import ComponentRef
from ..format.record_reader import ArchiveReader
from ..format.records import DispatchState
from ..ids import ExecutionId
from ..registry import REGISTRY_INSTANCE, REGISTRY_KIND
from ._cut_checks import cut_lineage_problem, cut_receipt_conflicts
from ._reconcile import RESOURCE_KINDS, lineage_past_boundary, resources_disagree

__all__ = [
    "DISPOSITIONS",
    "ComponentSummary",
    "Disposition",
    "RolloutPlan",
    "TokenSnapshotView",
    "classify",
    "reject",
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


def _pairs(raw: Any) -> list[Execution]:
    out: list[Execution] = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, list | tuple) and len(item) == 2:
                out.append((str(item[0]), int(item[1])))
            elif isinstance(item, dict) and "rollout_id" in item:
                out.append((str(item["rollout_id"]), int(item.get("attempt", 0))))
    return out


def reject(checkpoint_id: str, reason: str, **details: Any) -> CheckpointRejectedError:
    return CheckpointRejectedError(
        f"checkpoint {checkpoint_id!r} rejected: {reason}",
        checkpoint_id=checkpoint_id,
        reason=reason,
        **details,
    )


def _members(reader: ArchiveReader, cid: str) -> Iterator[MemberRef]:
    try:
        yield from reader.members()
    except CheckpointError as exc:
        raise reject(cid, f"member index unreadable: {exc.message}", code=exc.code) from exc


def classify(
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
            raise reject(
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
                raise reject(cid, f"registry lists rollout {m.rollout_id!r} twice")
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
            raise reject(cid, f"{ex[0]}#{ex[1]}: {conflicts[0]}")

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
        raise reject(cid, f"{where}: a token receipt exists but the checkpoint has no token-store snapshot")
    # The receipt's ``store`` name is not compared: it embeds the store URL, and a checkpoint
    # copied to another bucket or directory must stay loadable. Digest and length decide.
    entry = snapshot.entries.get(key)
    if entry is None:
        raise reject(cid, f"{where}: receipt is missing from token-store snapshot {snapshot.snapshot_id!r}")
    if refs.get("digest") != entry[0] or refs.get("length") != entry[1]:
        raise reject(
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
