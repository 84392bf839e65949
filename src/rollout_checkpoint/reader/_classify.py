"""Per-rollout classification of a published checkpoint (``docs/protocol.md``, "Recovery
classification"), decided from manifests and member indexes alone, never from payloads."""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from typing import Any, cast

import orjson
from pydantic import JsonValue

from ..errors import CheckpointError, CheckpointRejectedError
from ..format.manifests import ComponentRef
from ..format.record_reader import ArchiveReader
from ..registry import REGISTRY_INSTANCE, REGISTRY_KIND
from ._cut_checks import cut_lineage_problem, cut_receipt_conflicts
from ._prefetch import IndexPrefetch
from ._reconcile import RESOURCE_KINDS, lineage_past_boundary, resources_disagree
from ._rollouts import DISPOSITIONS, Disposition, RolloutPlan, RolloutPlans

__all__ = [
    "DISPOSITIONS",
    "ComponentSummary",
    "Disposition",
    "RolloutPlan",
    "RolloutPlans",
    "TokenSnapshotView",
    "classify",
    "reject",
]

_COMPLETED_STATES = frozenset({"handed_off", "consumed"})

Execution = tuple[str, int]


@dataclass(frozen=True)
class TokenSnapshotView:
    """What classification needs of a token-store snapshot: ``key -> (digest, length)``."""

    snapshot_id: str
    store: str | None
    entries: Mapping[str, tuple[str, int]]


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


def _columns(
    reader: ArchiveReader, cid: str, wanted: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, list[Any]]]:
    """The component's members by kind as index columns, never an object each."""
    try:
        return reader.member_columns(wanted)
    except CheckpointError as exc:
        raise reject(cid, f"member index unreadable: {exc.message}", code=exc.code) from exc


_REGISTRY_COLUMNS: dict[str, tuple[str, ...]] = {
    "dispatch": ("rollout_id", "attempt", "refs"),
    "completed_result": ("rollout_id", "attempt", "refs"),
}
_PARTICIPANT_COLUMNS: dict[str, tuple[str, ...]] = {
    "agent_boundary": ("rollout_id", "attempt", "revision", "refs"),
    "resource_snapshot": ("rollout_id", "attempt", "key", "revision", "refs"),
    "model_lineage": ("rollout_id", "attempt", "key", "refs"),
    "token_receipt": ("rollout_id", "attempt", "key", "refs"),
}
"""The index columns classification reads of each kind; of any other kind, its refs texts only."""


def _loads(raw: str | None) -> Any:
    """``refs`` JSON text as ``MemberRef.refs`` holds it (orjson; what it refuses, ``json``)."""
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)  # integers beyond 64 bits; invalid text raises as before


def _parse_all(texts: list[str | None]) -> None:
    """Parse refs that classification does not use, as every member's refs always were (a
    malformed text fails the load as before); a column of nulls costs one scan."""
    for text in texts:
        if text is not None:
            _loads(text)


_CACHE_LIMIT = 4096
"""Distinct refs texts of dispatch records parsed once each (they are few: a state and a flag),
so a million dispatch records parse a handful of JSON texts; past it, each is parsed."""


def classify(
    cid: str,
    readers: Mapping[tuple[str, str], ArchiveReader],
    summaries: Sequence[ComponentSummary],
    snapshot: TokenSnapshotView | None,
) -> RolloutPlans:
    """One disposition per execution the registry dispatched, over the member indexes' columns."""
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

    participants = [comp for comp in summaries if comp.ref.role == "participant"]
    order = [readers[(REGISTRY_KIND, REGISTRY_INSTANCE)]] + [
        readers[(c.kind, c.instance)] for c in participants
    ]
    with IndexPrefetch(order) as ahead:
        return _classify(cid, order, ahead, participants, restarts, tombstones, snapshot)


def _classify(
    cid: str,
    order: Sequence[ArchiveReader],
    ahead: IndexPrefetch,
    participants: Sequence[ComponentSummary],
    restarts: dict[Execution, str],
    tombstones: dict[str, int],
    snapshot: TokenSnapshotView | None,
) -> RolloutPlans:
    """:func:`classify` once the declarations passed: ``order`` is the registry's reader, then
    each of ``participants``' in turn, prepared ahead by ``ahead``."""
    # -- the registry: dispatched executions and acknowledged results -----------------------------
    ahead.ready(0)
    by_kind = _columns(order[0], cid, _REGISTRY_COLUMNS)
    none: dict[str, list[Any]] = {"rollout_id": [], "attempt": [], "refs": []}
    dispatch = by_kind.pop("dispatch", none)
    ids, attempts, texts = dispatch["rollout_id"], dispatch["attempt"], dispatch["refs"]
    # strictly increasing (as the registry writes them): unique and already in order
    ascending = all(map(operator.lt, ids, islice(ids, 1, None)))
    if not ascending and len(set(ids)) != len(ids):
        seen: set[str] = set()
        for rollout_id in ids:
            if rollout_id in seen:
                raise reject(cid, f"registry lists rollout {rollout_id!r} twice")
            seen.add(rollout_id)
    done = by_kind.pop("completed_result", none)
    acknowledged: set[Execution] = set(zip(done["rollout_id"], done["attempt"], strict=True))
    _parse_all(done["refs"])
    for columns in by_kind.values():
        _parse_all(columns["refs"])
    del by_kind, dispatch, done

    # -- participant members, grouped by execution ------------------------------------------------
    # An agent boundary's refs are kept as their JSON text and parsed once, when its execution is
    # disposed (or, for one no dispatch names, at the end): every text is still parsed.
    boundaries: dict[Execution, tuple[int, str | None]] = {}
    resources: dict[tuple[str, int, str, str], int] = {}  # (rollout, attempt, instance, session)
    instances: dict[str, int] = {}  # resources instance -> how many components carry that name
    lineage: dict[Execution, dict[str, dict[str, Any]]] = {}
    receipts: dict[Execution, dict[str, dict[str, Any]]] = {}
    for comp in participants:
        if comp.kind in RESOURCE_KINDS:
            instances[comp.instance] = instances.get(comp.instance, 0) + 1
    for position, comp in enumerate(participants, start=1):
        instance = comp.instance
        ahead.ready(position)
        by_kind = _columns(order[position], cid, _PARTICIPANT_COLUMNS)
        for kind, c in by_kind.items():
            if kind == "agent_boundary":
                _add_boundaries(boundaries, c)
            elif kind == "resource_snapshot":
                _parse_all(c["refs"])
                keys = zip(c["rollout_id"], c["attempt"], repeat(instance), c["key"], strict=False)
                resources.update(zip(keys, _revisions(c["revision"]), strict=True))  # the last row wins
            elif kind in ("model_lineage", "token_receipt"):
                held = lineage if kind == "model_lineage" else receipts
                for rollout_id, attempt, key, text in zip(
                    c["rollout_id"], c["attempt"], c["key"], c["refs"], strict=True
                ):
                    held.setdefault((rollout_id, attempt), {})[key] = _loads(text) or {}
            else:
                _parse_all(c["refs"])
        del by_kind

    # -- every receipt must agree with the token-store snapshot (else reject) ---------------------
    for ex, by_key in receipts.items():
        for key, refs in by_key.items():
            _check_receipt(cid, ex, key, refs, snapshot)
    # -- every generation cut must agree with the receipt of its own key (else reject) ------------
    for ex, by_call in lineage.items():
        conflicts = cut_receipt_conflicts(by_call, receipts.get(ex, {}))
        if conflicts:
            raise reject(cid, f"{ex[0]}#{ex[1]}: {conflicts[0]}")

    # -- one disposition per dispatched execution, in rollout-id order ------------------------------
    plain = not acknowledged and not restarts and not tombstones
    flags = _dispatch_flags(texts)
    if not ascending:
        ranked = sorted(range(len(ids)), key=ids.__getitem__)
        ids, attempts, flags = (
            [ids[i] for i in ranked],
            [attempts[i] for i in ranked],
            [flags[i] for i in ranked],
        )
    out_dispositions: list[Disposition] = []
    out_reasons: list[str] = []
    disposition: Disposition
    for rollout_id, attempt, (state, restart_only) in zip(ids, attempts, flags, strict=True):
        ex = (rollout_id, attempt)
        boundary = boundaries.pop(ex, None)
        named: dict[str, Any] | None = None
        if boundary is not None:
            text = boundary[1]
            try:
                named = orjson.loads(text) if text is not None else None
            except orjson.JSONDecodeError:
                named = _loads(text)
            if not named:
                named = {}
        if (
            plain
            and named is not None
            and not restart_only
            and state not in _NOT_RUNNING
            and named.get("model_call") is None
            and ex not in lineage
            and (not named.get("resources") or _resources_agree(ex, named["resources"], resources, instances))
        ):
            # what _dispose decides for this case, without its calls: a started execution with no
            # result, restart or tombstone, whose boundary agrees with its resources and names no
            # model call, and no lineage to check
            disposition, reason = "continue", _CONTINUE
        else:
            disposition, reason = _dispose(
                ex,
                state,
                restart_only,
                ex in acknowledged,
                restarts,
                tombstones,
                named,
                resources,
                instances,
                lineage,
                receipts,
            )
        out_dispositions.append(disposition)
        out_reasons.append(reason)
    for _, text in boundaries.values():  # boundaries of executions no dispatch names
        _loads(text)
    states = [state for state, _ in flags]
    restart_only_flags = [restart_only for _, restart_only in flags]
    return RolloutPlans(
        ids, attempts, out_dispositions, out_reasons, states, restart_only_flags, ordered=True
    )


def _dispatch_flags(texts: list[str | None]) -> list[tuple[str, bool]]:
    """``(state, restart_only)`` of each dispatch's refs text. The texts are few and shared (a
    state and a flag): each distinct one is parsed once, in the order it first appears."""
    distinct = dict.fromkeys(texts)
    if len(distinct) > _CACHE_LIMIT:
        return [_flags(text) for text in texts]
    table = {text: _flags(text) for text in distinct}
    return list(map(table.__getitem__, texts))


def _flags(text: str | None) -> tuple[str, bool]:
    refs = _loads(text) or {}
    return (str(refs.get("state")), bool(refs.get("restart_only")))


def _revisions(revisions: list[int | None]) -> list[int]:
    """Revisions with a missing one as -1 (older than any stored)."""
    if None not in revisions:
        return cast(list[int], revisions)
    return [-1 if r is None else r for r in revisions]


def _add_boundaries(boundaries: dict[Execution, tuple[int, str | None]], c: Mapping[str, list[Any]]) -> None:
    """Keep the newest agent boundary of each execution (a missing revision counts as -1); the
    refs text of every older one is parsed here (a malformed one fails the load)."""
    keys = list(zip(c["rollout_id"], c["attempt"], strict=True))
    rows = list(zip(_revisions(c["revision"]), c["refs"], strict=True))
    newest = dict(zip(keys, rows, strict=True))
    if len(newest) == len(keys) and boundaries.keys().isdisjoint(newest):
        boundaries.update(newest)  # one boundary per execution, none seen before: the common case
        return
    for ex, (rev, text) in zip(keys, rows, strict=True):
        best = boundaries.get(ex)
        if best is None or rev > best[0]:
            boundaries[ex] = (rev, text)
            if best is not None:
                _loads(best[1])
        else:
            _loads(text)


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


_CONTINUE = "agent boundary, resources, lineage and token receipts agree"
_NOT_RUNNING = _COMPLETED_STATES | {"queued"}


def _dispose(
    ex: Execution,
    state: str,
    restart_only: bool,
    acknowledged: bool,
    restarts: Mapping[Execution, str],
    tombstones: Mapping[str, int],
    refs: dict[str, Any] | None,
    resources: Mapping[tuple[str, int, str, str], int],
    instances: Mapping[str, int],
    lineage: Mapping[Execution, dict[str, dict[str, Any]]],
    receipts: Mapping[Execution, dict[str, dict[str, Any]]],
) -> tuple[Disposition, str]:
    """One execution's disposition; ``refs`` are its newest agent boundary's (None: no boundary)."""
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
    if refs is None:
        return "fresh_dispatch", "no agent boundary"
    wanted = refs.get("resources")
    if wanted and not _resources_agree(ex, wanted, resources, instances):
        mismatch = resources_disagree(wanted, _held(ex, wanted, resources), instances)
        if mismatch is not None:
            return "fresh_dispatch", mismatch
    calls = lineage.get(ex)
    model_call = refs.get("model_call")
    if not calls:
        # no lineage: nothing below can object unless the boundary names a call
        if model_call is not None:
            return "fresh_dispatch", f"model call {model_call!r} missing from lineage"
        return "continue", _CONTINUE
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
    return "continue", _CONTINUE


def _resources_agree(
    ex: Execution,
    wanted: Any,
    resources: Mapping[tuple[str, int, str, str], int],
    instances: Mapping[str, int],
) -> bool:
    """The common case of :func:`resources_disagree` returning None, without building a view:
    every named instance is one component and holds every named session at the named revision.
    False means "not shown to agree": :func:`resources_disagree` then gives the verdict."""
    if not isinstance(wanted, dict):
        return False
    rollout_id, attempt = ex
    for instance, sessions in wanted.items():
        if instances.get(instance) != 1 or not isinstance(sessions, dict):
            return False
        for session, revision in sessions.items():
            if resources.get((rollout_id, attempt, instance, session)) != revision:
                return False
    return True


def _held(
    ex: Execution, wanted: Any, resources: Mapping[tuple[str, int, str, str], int]
) -> dict[str, dict[str, int]]:
    """The snapshots of ``ex`` for the instances and sessions the boundary names: all that
    :func:`resources_disagree` looks up, as ``{instance: {session: revision}}``."""
    held: dict[str, dict[str, int]] = {}
    if not isinstance(wanted, dict):
        return held
    rollout_id, attempt = ex
    for instance, sessions in wanted.items():
        if not isinstance(instance, str) or not isinstance(sessions, dict):
            continue
        found = held.setdefault(instance, {})
        for session in sessions:
            revision = resources.get((rollout_id, attempt, instance, session))
            if revision is not None:
                found[session] = revision
    return held
