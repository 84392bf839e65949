"""The published log: which checkpoints are published, their order, and the next sequence.

Ordering never depends on ``latest.json``, a pointer that can be lost, stale or damaged. As in
Delta Lake's log, the order lives in object keys written create-only: before its record, every
publish claims ``sequence/<n>.json`` (:func:`~rollout_checkpoint.manifests.claim_sequence`),
so each sequence number has exactly one owner and the next one is derived from the claims
themselves. ``latest.json`` is only a hint: readers resolve the newest checkpoint from the
claims and report when the pointer is missing, unparseable or stale. Records written before
claims existed (schema version 1) are ordered by the sequence inside them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from . import layout
from .errors import CheckpointError, CheckpointNotFoundError, IntegrityError
from .manifests import (
    GlobalCheckpointRecord,
    LatestPointer,
    ordering_key,
    read_claim,
    read_latest,
    read_record,
)
from .store import ObjectStore

__all__ = [
    "Candidate",
    "PointerHint",
    "PublishedCheckpoint",
    "claimed_sequences",
    "iter_candidates",
    "list_published",
    "next_sequence",
    "pointer_note",
    "read_pointer_hint",
]


@dataclass(frozen=True)
class PublishedCheckpoint:
    """A listed published checkpoint (``record`` is ``None`` when its record fails its checks)."""

    checkpoint_id: str
    record: GlobalCheckpointRecord | None
    error: str | None = None
    latest: bool = False

    @property
    def order(self) -> tuple[int, datetime, str]:
        if self.record is None:
            return (0, datetime.min.replace(tzinfo=UTC), self.checkpoint_id)
        return ordering_key(self.record.sequence, self.record.created_at, self.checkpoint_id)


@dataclass(frozen=True)
class PointerHint:
    """``latest.json`` as read by a reader that must not depend on it: ``problem`` says why
    there is no usable ``pointer`` (missing, unparseable, newer schema)."""

    pointer: LatestPointer | None
    version: str | None
    problem: str | None


def read_pointer_hint(store: ObjectStore) -> PointerHint:
    """The latest pointer, never raising for a missing or damaged one (store errors propagate)."""
    try:
        found = read_latest(store)
    except CheckpointError as exc:
        if exc.code in ("invalid_record", "unsupported_schema"):
            return PointerHint(None, None, f"{layout.LATEST_KEY} is unparseable ({exc.message})")
        raise
    if found is None:
        return PointerHint(None, None, f"{layout.LATEST_KEY} is missing")
    return PointerHint(found[0], found[1], None)


def _published_ids(store: ObjectStore) -> list[str]:
    ids: list[str] = []
    for info in store.list(layout.PUBLISHED_PREFIX):
        name = info.key[len(layout.PUBLISHED_PREFIX) :]
        if "/" not in name and name.endswith(".json"):
            ids.append(name[: -len(".json")])
    return ids


def list_published(store: ObjectStore) -> list[PublishedCheckpoint]:
    """Every ``published/*.json`` newest first; the pointer's target is marked ``latest``.

    Every record is read and checked (digest, sequence claim); one that fails is listed with
    ``error`` (oldest) rather than hidden.
    """
    hint = read_pointer_hint(store)
    latest_id = hint.pointer.checkpoint_id if hint.pointer is not None else None
    out: list[PublishedCheckpoint] = []
    for checkpoint_id in _published_ids(store):
        try:
            record, _ = read_record(store, checkpoint_id)
        except CheckpointNotFoundError:
            continue  # unpublished while listing
        except CheckpointError as exc:
            if exc.code not in ("invalid_record", "unsupported_schema", "integrity_error", "invalid_id"):
                raise
            out.append(PublishedCheckpoint(checkpoint_id, None, exc.message, checkpoint_id == latest_id))
            continue
        out.append(PublishedCheckpoint(checkpoint_id, record, None, checkpoint_id == latest_id))
    out.sort(key=lambda p: p.order, reverse=True)
    return out


def claimed_sequences(store: ObjectStore) -> list[int]:
    """Every claimed sequence number, ascending (one listing, no reads)."""
    seqs = [layout.sequence_of_key(info.key) for info in store.list(layout.SEQUENCE_PREFIX)]
    return sorted(s for s in seqs if s is not None)


def next_sequence(store: ObjectStore, floor: int = 0) -> int:
    """The sequence a new publish claims: one past the highest claim. A store without claims
    (only version 1 records) continues after the highest sequence its records carry."""
    claimed = claimed_sequences(store)
    if claimed:
        return max(claimed[-1], floor) + 1
    legacy = max((p.record.sequence for p in list_published(store) if p.record is not None), default=0)
    hint = read_pointer_hint(store).pointer
    return max(legacy, hint.sequence if hint is not None else 0, floor) + 1


@dataclass(frozen=True)
class Candidate:
    """A published checkpoint in log order (newest first). ``sequence`` is the claimed one
    (``None`` for a legacy record that does not parse); ``passed`` says which claims were
    passed over on the way here and why."""

    checkpoint_id: str
    sequence: int | None
    passed: tuple[str, ...] = ()


def iter_candidates(store: ObjectStore) -> Iterator[Candidate]:
    """Published checkpoints newest first, reading claims lazily (the newest costs one read).

    Claims come first, highest sequence first; a claim whose record does not exist (a publish
    interrupted between claim and record, or a removed record) is passed over and reported.
    Records no claim names (schema version 1) follow, ordered by their own sequence; one that
    does not parse comes first among them, so a reader fails closed instead of skipping it.
    """
    published = set(_published_ids(store))
    named: set[str] = set()
    passed: list[str] = []
    for sequence in reversed(claimed_sequences(store)):
        try:
            claim = read_claim(store, sequence)
        except IntegrityError as exc:
            passed.append(f"sequence {sequence}: damaged claim ({exc.message})")
            continue
        if claim is None or claim.checkpoint_id in named:
            continue
        named.add(claim.checkpoint_id)
        if claim.checkpoint_id not in published:
            passed.append(
                f"sequence {sequence}: claimed by {claim.checkpoint_id} but no published record "
                "(publish interrupted, or the record was removed)"
            )
            continue
        yield Candidate(claim.checkpoint_id, sequence, tuple(passed))
        passed = []
    legacy: list[PublishedCheckpoint] = []
    for checkpoint_id in sorted(published - named):
        try:
            record, _ = read_record(store, checkpoint_id)
        except CheckpointNotFoundError:
            continue
        except CheckpointError as exc:
            if exc.code not in ("invalid_record", "unsupported_schema", "integrity_error"):
                raise
            legacy.insert(0, PublishedCheckpoint(checkpoint_id, None, exc.message))
            continue
        legacy.append(PublishedCheckpoint(checkpoint_id, record, None))
    broken = [p for p in legacy if p.record is None]
    usable = sorted((p for p in legacy if p.record is not None), key=lambda p: p.order, reverse=True)
    for item in broken + usable:
        yield Candidate(item.checkpoint_id, item.record.sequence if item.record else None, tuple(passed))
        passed = []


def pointer_note(hint: PointerHint, newest: Candidate | None) -> str | None:
    """Why the pointer was not what the log says is newest (``None`` when it agrees)."""
    if hint.problem is not None:
        if newest is None:
            return hint.problem
        return f"{hint.problem}; resolved {newest.checkpoint_id} from the published records"
    pointer = hint.pointer
    if pointer is None or newest is None:
        return None
    if pointer.checkpoint_id != newest.checkpoint_id:
        return (
            f"{layout.LATEST_KEY} names {pointer.checkpoint_id} (sequence {pointer.sequence}) but the "
            f"published records say {newest.checkpoint_id} (sequence {newest.sequence}) is newest; "
            "using the published records"
        )
    return None
