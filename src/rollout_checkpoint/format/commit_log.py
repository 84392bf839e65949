"""The commit log: writing the publication's objects and reading back what is published.

Writing (a coordinator's publish): the aggregate manifest and the global checkpoint record are
put **create-only**, each publish first claims ``sequence/<n>.json`` create-only, and
``latest.json`` only moves forward by compare-and-swap. Reading: which checkpoints are
published, their order, and the next free sequence.

Ordering never depends on ``latest.json``, a pointer that can be lost, stale or damaged. As in
Delta Lake's log, the order lives in object keys written create-only: each sequence number has
exactly one owner and the next one is derived from the claims themselves. ``latest.json`` is
only a hint: readers resolve the newest checkpoint from the claims and report when the pointer
is missing, unparseable or stale. Records written before claims existed (schema version 1) are
ordered by the sequence inside them. The documents themselves are defined in
:mod:`rollout_checkpoint.format.manifests`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import (
    CheckpointError,
    CheckpointNotFoundError,
    IntegrityError,
    InvalidRecordError,
    ManifestConflictError,
    ObjectExistsError,
    ObjectNotFoundError,
    SequenceTakenError,
    StoreError,
    VersionChangedError,
)
from ..store import ObjectStore
from . import layout
from .manifests import (
    AggregateManifest,
    GlobalCheckpointRecord,
    LatestPointer,
    ObjectRef,
    SequenceClaim,
    ordering_key,
    parse_document,
    record_order,
)

_LATEST_ATTEMPTS = 32

__all__ = [
    "Candidate",
    "LatestUpdate",
    "PointerHint",
    "PublishedCheckpoint",
    "advance_latest",
    "check_record",
    "claim_sequence",
    "claimed_sequences",
    "iter_candidates",
    "list_published",
    "next_sequence",
    "pointer_note",
    "publish_record",
    "read_aggregate",
    "read_claim",
    "read_latest",
    "read_pointer_hint",
    "read_record",
    "write_aggregate",
]


def _create_only(store: ObjectStore, key: str, data: bytes, what: str) -> bool:
    try:
        return store.put_if_absent(key, data).created
    except ObjectExistsError:
        raise ManifestConflictError(
            f"{store.url}/{key}: a different {what} was already written (another coordinator "
            "published this checkpoint id); it was left untouched",
            key=key,
        ) from None


# -- aggregate ------------------------------------------------------------------------------


def write_aggregate(store: ObjectStore, manifest: AggregateManifest) -> ObjectRef:
    """Create ``checkpoints/<id>/aggregate.json``; ``ManifestConflictError`` if another exists."""
    key = layout.aggregate_key(manifest.checkpoint_id)
    data = manifest.to_bytes()
    _create_only(store, key, data, "aggregate manifest")
    return ObjectRef.of(key, data)


def read_aggregate(store: ObjectStore, ref: ObjectRef) -> AggregateManifest:
    """Read the aggregate a record names; ``IntegrityError`` unless its bytes match the ref."""
    data = store.get(ref.key)
    ref.check(data)
    return parse_document(AggregateManifest, data, ref.key)


# -- global record ------------------------------------------------------------------------


def publish_record(
    store: ObjectStore, record: GlobalCheckpointRecord, before_record: Callable[[], None] | None = None
) -> ObjectRef:
    """The commit: claim ``sequence/<n>.json``, then create ``published/<id>.json``.

    A version 2 record is sealed first and its sequence claimed (:func:`claim_sequence`):
    :class:`SequenceTakenError` when another publish holds that sequence (build the record
    again with a later one). A retry whose first try already landed finds identical bytes and
    succeeds; a record from another coordinator (different ``commit_token``) raises
    ``ManifestConflictError``. A version 1 record (legacy, tests) is written without a claim.
    ``before_record`` runs between the claim and the record (the coordinator's last ownership
    check): if it raises, the claim stays without a record, as after an interrupted publish.
    """
    if record.schema_version >= 2:
        if record.record_digest is None:
            record = record.sealed()
        claim_sequence(store, record)
    if before_record is not None:
        before_record()
    key = layout.published_key(record.checkpoint_id)
    data = record.to_bytes()
    _create_only(store, key, data, "global checkpoint record")
    return ObjectRef.of(key, data)


def claim_sequence(store: ObjectStore, record: GlobalCheckpointRecord) -> SequenceClaim:
    """Create ``sequence/<record.sequence>.json`` naming ``record`` (sealed) by digest.

    Raises :class:`SequenceTakenError` when another publish already holds that sequence: of
    publishers racing for one sequence exactly one wins; the others claim a later one. A retry
    of the same claim (identical bytes) succeeds.
    """
    if record.record_digest is None and record.schema_version >= 2:
        raise ValueError("claim_sequence needs a sealed record (GlobalCheckpointRecord.sealed())")
    key = layout.published_key(record.checkpoint_id)
    claim = SequenceClaim(
        sequence=record.sequence,
        checkpoint_id=record.checkpoint_id,
        commit_token=record.commit_token,
        coordinator_id=record.coordinator_id,
        record=ObjectRef.of(key, record.to_bytes()),
    )
    try:
        store.put_if_absent(layout.sequence_key(record.sequence), claim.to_bytes())
    except ObjectExistsError:
        raise SequenceTakenError(
            f"{store.url}: sequence {record.sequence} is already claimed by another publish",
            sequence=record.sequence,
            checkpoint_id=record.checkpoint_id,
        ) from None
    return claim


def read_claim(store: ObjectStore, sequence: int) -> SequenceClaim | None:
    """The claim of ``sequence``, ``None`` when unclaimed; ``IntegrityError`` when unparseable."""
    key = layout.sequence_key(sequence)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        return None
    try:
        claim = parse_document(SequenceClaim, data, key)
    except InvalidRecordError as exc:
        raise IntegrityError(exc.message, key=key) from None
    if claim.sequence != sequence:
        raise IntegrityError(f"{key} names sequence {claim.sequence}", key=key)
    return claim


def check_record(store: ObjectStore, record: GlobalCheckpointRecord, ref: ObjectRef) -> None:
    """Self-verification of a published record: its digest and its sequence claim.

    Version 2: ``record_digest`` must match the content and the claim of ``record.sequence``
    must name this checkpoint, commit and exact bytes. Version 1 (legacy, no digest): checked
    against a claim only where one names this checkpoint. ``IntegrityError`` on any mismatch.
    """
    key = ref.key
    if record.schema_version >= 2:
        if record.record_digest is None:
            raise IntegrityError(
                f"{key}: version {record.schema_version} record without record_digest", key=key
            )
        digest = record.computed_digest()
        if digest != record.record_digest:
            raise IntegrityError(
                f"{key}: content does not match its record_digest (the record was edited)",
                key=key,
                found=digest,
                expected=record.record_digest,
            )
    claim = read_claim(store, record.sequence)
    if claim is None:
        if record.schema_version >= 2:
            raise IntegrityError(
                f"{key}: the claim {layout.sequence_key(record.sequence)} of its sequence is missing",
                key=key,
            )
        return
    if claim.checkpoint_id != record.checkpoint_id:
        if record.schema_version >= 2:
            raise IntegrityError(
                f"{key}: sequence {record.sequence} is claimed by checkpoint {claim.checkpoint_id!r}",
                key=key,
            )
        return
    if claim.commit_token != record.commit_token or claim.record != ref:
        raise IntegrityError(
            f"{key}: bytes differ from those its sequence claim {layout.sequence_key(record.sequence)} "
            "pins (the record was edited or replaced)",
            key=key,
        )


def read_record(store: ObjectStore, checkpoint_id: str) -> tuple[GlobalCheckpointRecord, ObjectRef]:
    """The published record of ``checkpoint_id`` and a ref pinning the bytes read, checked
    against its digest and sequence claim (:func:`check_record`)."""
    key = layout.published_key(checkpoint_id)
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        raise CheckpointNotFoundError(
            f"{store.url}: no published checkpoint {checkpoint_id!r}", checkpoint_id=checkpoint_id
        ) from None
    record = parse_document(GlobalCheckpointRecord, data, key)
    if record.checkpoint_id != checkpoint_id:
        raise InvalidRecordError(
            f"{key} names checkpoint {record.checkpoint_id!r}", key=key, checkpoint_id=record.checkpoint_id
        )
    ref = ObjectRef.of(key, data)
    check_record(store, record, ref)
    return record, ref


# -- latest pointer ---------------------------------------------------------------------------


def _read_latest_raw(store: ObjectStore) -> tuple[bytes, str | None] | None:
    # stat / get / stat until both versions agree, so the version fed to compare-and-swap
    # belongs to exactly the content that was judged.
    for _ in range(_LATEST_ATTEMPTS):
        try:
            before = store.stat(layout.LATEST_KEY)
            data = store.get(layout.LATEST_KEY)
            after = store.stat(layout.LATEST_KEY)
        except ObjectNotFoundError:
            return None
        if before.version == after.version:
            return data, after.version
    raise StoreError(f"{store.url}/{layout.LATEST_KEY} keeps changing while read", key=layout.LATEST_KEY)


def read_latest(store: ObjectStore) -> tuple[LatestPointer, str | None] | None:
    """The pointer and the version token of exactly the bytes read, or ``None`` when absent."""
    raw = _read_latest_raw(store)
    if raw is None:
        return None
    return parse_document(LatestPointer, raw[0], layout.LATEST_KEY), raw[1]


@dataclass(frozen=True)
class LatestUpdate:
    """What :func:`advance_latest` did: ``moved`` is ``False`` when a newer checkpoint is latest."""

    moved: bool
    pointer: LatestPointer
    attempts: int


def advance_latest(
    store: ObjectStore,
    record: GlobalCheckpointRecord,
    record_ref: ObjectRef,
    *,
    now: Callable[[], float] = time.time,
) -> LatestUpdate:
    """Move ``latest.json`` to ``record`` by compare-and-swap, forward only.

    Missing pointer: create-only. Present: replace only the version just read, and only when
    ``record`` orders after the current target; on ``VersionChangedError`` re-read and decide
    again. A pointer that no longer parses is replaced (it names nothing a reader could use).
    """
    mine = LatestPointer(
        checkpoint_id=record.checkpoint_id,
        sequence=record.sequence,
        created_at=record.created_at,
        record=record_ref,
        updated_at=datetime.fromtimestamp(now(), tz=UTC),
    )
    data = mine.to_bytes()
    for attempt in range(1, _LATEST_ATTEMPTS + 1):
        raw = _read_latest_raw(store)
        current: tuple[LatestPointer, str | None] | None = None
        if raw is not None:
            try:
                current = parse_document(LatestPointer, raw[0], layout.LATEST_KEY), raw[1]
            except InvalidRecordError:
                try:
                    store.put_if_match(layout.LATEST_KEY, data, raw[1] or "")
                except (VersionChangedError, ObjectNotFoundError):
                    continue
                return LatestUpdate(True, mine, attempt)
        if current is None:
            try:
                store.put_if_absent(layout.LATEST_KEY, data)
            except ObjectExistsError:
                continue
            return LatestUpdate(True, mine, attempt)
        pointer, version = current
        if pointer.checkpoint_id == record.checkpoint_id:
            return LatestUpdate(False, pointer, attempt)
        if record_order(pointer) >= record_order(mine):
            return LatestUpdate(False, pointer, attempt)
        try:
            store.put_if_match(layout.LATEST_KEY, data, version or "")
        except (VersionChangedError, ObjectNotFoundError):
            continue
        return LatestUpdate(True, mine, attempt)
    raise StoreError(
        f"{store.url}/{layout.LATEST_KEY}: compare-and-swap lost {_LATEST_ATTEMPTS} times in a row",
        key=layout.LATEST_KEY,
    )


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


def iter_candidates(store: ObjectStore, trailing: list[str] | None = None) -> Iterator[Candidate]:
    """Published checkpoints newest first, reading claims lazily (the newest costs one read).

    Claims come first, highest sequence first; a claim whose record does not exist (a publish
    interrupted between claim and record, or a removed record) is passed over and reported.
    Records no claim names (schema version 1) follow, ordered by their own sequence; one that
    does not parse comes first among them, so a reader fails closed instead of skipping it.
    Claims passed over after the last candidate are appended to ``trailing`` when the iteration
    ends (so "nothing published" can say why).
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
    if trailing is not None:
        trailing.extend(passed)


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
