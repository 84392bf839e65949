"""Merging what the workers of one server committed: the component manifest that refers to the
parts they wrote (each record written once, by its worker), its ``extra`` and reply, and where
a restore places each pre-crash owner's executions."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from ..archive import ArchiveWriter, ManifestRef, RawArchiveReader, UnitedReferences
from ..errors import CheckpointError, IntegrityError, InvalidPhaseError, InvalidRecordError
from ..format import layout
from ..ids import ExecutionId, checked_pairs, execution_ids
from ..protocol import Capabilities, CommitReply, Phase, UnsafeEffect
from ..store import ObjectStore

__all__ = [
    "PartsCommitted",
    "assign_owners",
    "execution_key",
    "commit_parts",
    "merge_extra",
    "merged_reply",
    "session_owners",
    "unique_effects",
    "united_pairs",
]

STANDARD_KEYS = ("capabilities", "tombstones", "executions", "restarts", "unsafe_effects")

Pairs = list[tuple[str, int]]
"""Executions as ``(rollout_id, attempt)`` tuples, checked (``checked_pairs``), sorted, unique."""


@dataclass(frozen=True)
class PartsCommitted:
    """What ``commit_parts`` wrote: the component manifest, and the executions and restarts
    of every part united (read from the parts' digest-pinned manifests, not from the replies)."""

    ref: ManifestRef
    executions: Pairs
    restarts: Pairs


def execution_key(execution: ExecutionId) -> tuple[str, int]:
    return (execution.rollout_id, execution.attempt)


def assign_owners(owners: dict[str, list[ExecutionId]], workers: Sequence[str]) -> dict[str, str]:
    """Old owner -> live worker: all of one owner's executions stay together. An owner that is
    still a live worker keeps its own executions (so its clients' owner stays right); the other
    owners, biggest first, each go to the worker with the fewest executions (then fewest owners)."""
    if not workers:
        raise InvalidPhaseError("no live worker to restore onto")
    load = {w: [0, 0] for w in workers}
    placed: dict[str, str] = {}
    for owner in sorted(o for o in owners if o in load):
        placed[owner] = owner
        load[owner][0] += len(owners[owner])
        load[owner][1] += 1
    for owner in sorted((o for o in owners if o not in load), key=lambda o: (-len(owners[o]), o)):
        target = min(workers, key=lambda w: (load[w][0], load[w][1], w))
        placed[owner] = target
        load[target][0] += len(owners[owner])
        load[target][1] += 1
    return placed


def merge_extra(
    caps: Capabilities,
    extras: dict[str, dict[str, JsonValue]],
    replies: dict[str, CommitReply],
    owned: dict[str, tuple[Pairs, Pairs]],
) -> dict[str, JsonValue]:
    """The component manifest's ``extra``: the workers' standard keys merged (``owned``: worker
    id -> its part's executions and restarts), ``session_owners``, and the other keys (equal
    on every worker)."""
    tombstones: dict[str, int] = {}
    for extra in extras.values():
        raw = extra.get("tombstones", {})
        if not isinstance(raw, dict):
            raise InvalidRecordError("a worker's manifest extra 'tombstones' is not an object")
        for rollout_id, attempt in raw.items():
            if not isinstance(attempt, int):
                raise InvalidRecordError("a worker's tombstone is not an attempt number")
            tombstones[rollout_id] = max(attempt, tombstones.get(rollout_id, attempt))
    executions = united_pairs(e for e, _ in owned.values())
    restarts = united_pairs(r for _, r in owned.values())
    effects = unique_effects(e for r in replies.values() for e in r.unsafe_effects)
    merged: dict[str, JsonValue] = {
        "capabilities": caps.model_dump(mode="json"),
        "tombstones": dict(sorted(tombstones.items())),
        "executions": [[r, a] for r, a in executions],
        "restarts": [[r, a] for r, a in restarts],
        "unsafe_effects": [u.model_dump(mode="json") for u in effects],
        "session_owners": {wid: [[r, a] for r, a in united_pairs(owned[wid])] for wid in sorted(owned)},
    }
    for wid, extra in sorted(extras.items()):
        for name, value in extra.items():
            if name in STANDARD_KEYS:
                continue
            if name in merged and merged[name] != value:
                raise IntegrityError(f"workers disagree on manifest extra {name!r} (worker {wid})")
            merged[name] = value
    return merged


def united_pairs(groups: Iterable[Iterable[tuple[str, int]]]) -> Pairs:
    """The pairs of ``groups``, each once, sorted."""
    return sorted({pair for group in groups for pair in group})


def _united(groups: Iterable[Iterable[ExecutionId]]) -> list[ExecutionId]:
    """The executions of ``groups``, each once, sorted (keyed by plain tuples: a model's hash is
    slow, and a group unites thousands)."""
    seen: dict[tuple[str, int], ExecutionId] = {}
    for group in groups:
        for e in group:
            seen.setdefault((e.rollout_id, e.attempt), e)
    return [seen[k] for k in sorted(seen)]


def unique_effects(effects: Iterable[UnsafeEffect]) -> list[UnsafeEffect]:
    seen: dict[str, UnsafeEffect] = {}
    for effect in effects:
        seen.setdefault(json.dumps(effect.model_dump(mode="json"), sort_keys=True), effect)
    return [seen[k] for k in sorted(seen)]


def session_owners(raw: Any) -> dict[str, list[ExecutionId]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRecordError("manifest extra 'session_owners' must be an object")
    out: dict[str, list[ExecutionId]] = {}
    for owner, items in raw.items():
        if not isinstance(items, list):
            raise InvalidRecordError("manifest extra 'session_owners' entries must be lists")
        try:
            out[str(owner)] = [ExecutionId(rollout_id=i[0], attempt=i[1]) for i in items]
        except (TypeError, IndexError, ValueError) as exc:
            raise InvalidRecordError(f"manifest extra 'session_owners': {exc}") from None
    return out


def merged_reply(
    caps: Capabilities,
    checkpoint_id: str,
    phase: Phase,
    replies: dict[str, CommitReply],
    parts: PartsCommitted | None = None,
    *,
    incarnation: str,
) -> CommitReply:
    """The group's reply: the workers' effects united, and their executions and restarts (those
    ``commit_parts`` read from the parts' manifests when given, else the replies')."""
    if parts is None:
        executions = _united(r.executions for r in replies.values())
        restarts = _united(r.restarts for r in replies.values())
    else:
        executions, restarts = execution_ids(parts.executions), execution_ids(parts.restarts)
    return CommitReply(
        checkpoint_id=checkpoint_id,
        phase=phase,
        kind=caps.kind,
        instance=caps.instance,
        manifest_key=None if parts is None else parts.ref.key,
        manifest_sha256=None if parts is None else parts.ref.sha256,
        manifest_bytes=None if parts is None else parts.ref.bytes,
        executions=tuple(executions),
        restarts=tuple(restarts),
        unsafe_effects=tuple(unique_effects(e for r in replies.values() for e in r.unsafe_effects)),
        incarnation=incarnation,
    )


def commit_parts(
    target: ObjectStore,
    checkpoint_id: str,
    caps: Capabilities,
    replies: dict[str, CommitReply],
    fence: Callable[[], None],
    lock: threading.Condition,
) -> PartsCommitted:
    """Write the component's manifest over the parts its workers committed (``replies``: worker
    id -> the reply that pins its part's manifest): a format-2 archive that stores nothing and
    refers to every member of every part, reading only their manifests, member indexes and
    reference tables (never a payload byte). ``fence`` decides (under ``lock``) whether the
    manifest may be written. The executions and restarts come from the parts' manifests (a
    worker's brief reply leaves them out); a part whose lists are malformed is refused."""
    prefix = layout.component_prefix(checkpoint_id, caps.kind, caps.instance)
    bases: dict[str, tuple[int, ManifestRef]] = {}

    def base_of(base_prefix: str, ref: ManifestRef) -> int:
        known = bases.get(base_prefix)
        if known is None:
            known = bases[base_prefix] = (len(bases), ref)
        elif known[1] != ref:  # two parts pin different bytes of one archive: cannot be
            raise IntegrityError(f"{base_prefix}: parts pin different manifests of one base archive")
        return known[0]

    united = UnitedReferences()  # the reference table, in Arrow
    extras: dict[str, dict[str, JsonValue]] = {}
    owned: dict[str, tuple[Pairs, Pairs]] = {}
    for wid in sorted(replies):
        reply = replies[wid]
        part = layout.component_part_prefix(checkpoint_id, caps.kind, caps.instance, wid)
        if reply.manifest_key != f"{part}/{layout.MANIFEST_NAME}" or reply.manifest_sha256 is None:
            raise IntegrityError(f"worker {wid} committed {reply.manifest_key}, not its part {part}")
        reader = RawArchiveReader.open(target, part, expected_sha256=reply.manifest_sha256)
        m = reader.manifest
        if (m.checkpoint_id, m.participant_kind, m.instance) != (checkpoint_id, caps.kind, caps.instance):
            raise IntegrityError(
                f"{part}: part is {m.participant_kind}/{m.instance} of {m.checkpoint_id}, not "
                f"{caps.kind}/{caps.instance} of {checkpoint_id}"
            )
        extras[wid] = dict(m.extra)
        try:
            owned[wid] = (
                checked_pairs(m.extra.get("executions"), "extra 'executions'"),
                checked_pairs(m.extra.get("restarts"), "extra 'restarts'"),
            )
        except CheckpointError as exc:
            raise IntegrityError(f"{part}: {exc.message}") from None
        # the members the part stores (its digest-checked index): referred to in the part
        united.add_stored(reader, base_of(part, reader.manifest_ref))
        # the members the part refers to: the same reference, into the same archive (flattened)
        united.add_references(reader, [base_of(b.prefix, b.manifest) for b in m.bases or []])
    # no member twice: stored in two parts, referred to by two, or stored and referred to
    twice = united.repeated()
    if twice:
        raise InvalidRecordError(f"{caps.kind}/{caps.instance}: {twice} members are in two workers' parts")
    columns = united.columns()
    extra = merge_extra(caps, extras, replies, owned)
    writer = ArchiveWriter(
        target, prefix, checkpoint_id=checkpoint_id, participant_kind=caps.kind, instance=caps.instance
    )
    try:
        ordered = sorted(bases.items(), key=lambda item: item[1][0])
        writer.refer([(base_prefix, ref) for base_prefix, (_, ref) in ordered], columns)
        with lock:
            fence()
            writer.commit(extra=extra)
    except BaseException:
        writer.abort()
        raise
    return PartsCommitted(
        writer.manifest_ref,
        united_pairs(e for e, _ in owned.values()),
        united_pairs(r for _, r in owned.values()),
    )
