"""The publisher's objects: aggregate manifest, global checkpoint record, ``latest`` pointer.

``docs/protocol.md`` is the spec; this module is its reference implementation. Three rules
carry the whole commit protocol:

* every object here is canonical JSON (sorted keys, no whitespace) so a digest names it;
* the aggregate manifest and the global checkpoint record are written **create-only**, and both
  carry the publishing coordinator's unique ``commit_token``, so of two coordinators racing on
  one checkpoint id exactly one can create them (a retried put of identical bytes is an
  idempotent success);
* the global checkpoint record at ``published/<id>.json`` is the single commit point; the
  ``latest`` pointer only ever moves forward, by compare-and-swap.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from . import layout
from ._validation import TypedModel, describe_validation_error
from .errors import (
    CheckpointNotFoundError,
    IntegrityError,
    InvalidRecordError,
    ManifestConflictError,
    ObjectExistsError,
    ObjectNotFoundError,
    SequenceTakenError,
    StoreError,
    UnsupportedSchemaError,
    VersionChangedError,
    refuse_newer_schema,
)
from .ids import Identifier, validate_id
from .store import ObjectStore

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "AggregateManifest",
    "ComponentRef",
    "GlobalCheckpointRecord",
    "LatestPointer",
    "LatestUpdate",
    "RECORD_SCHEMA_VERSION",
    "ObjectRef",
    "SequenceClaim",
    "advance_latest",
    "canonical_json",
    "check_record",
    "claim_sequence",
    "new_checkpoint_id",
    "new_commit_token",
    "ordering_key",
    "publish_record",
    "read_aggregate",
    "read_claim",
    "read_latest",
    "read_record",
    "write_aggregate",
]

MANIFEST_SCHEMA_VERSION = 1
"""Schema version of the aggregate manifest, the latest pointer and the sequence claim."""

RECORD_SCHEMA_VERSION = 2
"""Schema version of the global checkpoint record (2 added ``record_digest`` and the sequence
claim; version 1 records are still read)."""

_LATEST_ATTEMPTS = 32


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes every digest in the protocol is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def new_commit_token() -> str:
    """A unique token that makes two publishers' objects differ byte-wise (create-only then decides)."""
    return uuid.uuid4().hex


def new_checkpoint_id(prefix: str = "ckpt", now: float | None = None) -> str:
    """``<prefix>-%Y%m%dT%H%M%S-<8hex>`` in UTC: sortable by time and unique with high probability."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC).strftime("%Y%m%dT%H%M%S")
    return validate_id(f"{prefix}-{stamp}-{uuid.uuid4().hex[:8]}", "checkpoint_id")


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class _Model(TypedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    SCHEMA: ClassVar[int] = MANIFEST_SCHEMA_VERSION
    schema_version: int = Field(default=MANIFEST_SCHEMA_VERSION, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _refuse_newer_schema(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_newer_schema(cls.__name__, data.get("schema_version"), cls.SCHEMA)
        return data

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


class ObjectRef(BaseModel):
    """Names one stored object and pins its exact bytes (sha256 + length)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)

    @classmethod
    def of(cls, key: str, data: builtins.bytes) -> ObjectRef:
        return cls(key=key, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))

    def check(self, data: builtins.bytes) -> None:
        """Raise ``IntegrityError`` unless ``data`` are exactly the bytes this ref names."""
        if len(data) != self.bytes:
            raise IntegrityError(
                f"{self.key}: {len(data)} bytes, expected {self.bytes}",
                key=self.key,
                found=len(data),
                expected=self.bytes,
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise IntegrityError(
                f"{self.key}: sha256 {digest} does not match {self.sha256}",
                key=self.key,
                found=digest,
                expected=self.sha256,
            )


ComponentRole = Literal["participant", "framework"]


class ComponentRef(BaseModel):
    """One committed component archive: who wrote it and its ``manifest.json`` pinned by digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Identifier
    instance: Identifier
    role: ComponentRole
    mode: str | None = None
    prefix: str = Field(min_length=1)
    manifest: ObjectRef


class AggregateManifest(_Model):
    """Every component of a checkpoint, written create-only once all of them validated."""

    type: Literal["aggregate_manifest"] = "aggregate_manifest"
    checkpoint_id: Identifier
    commit_token: str = Field(min_length=1)
    created_at: datetime
    prepare_order: list[str]
    components: list[ComponentRef]
    dispatched: int = Field(ge=0, description="executions in the frozen dispatch membership")

    @model_validator(mode="after")
    def _unique_components(self) -> AggregateManifest:
        seen = {(c.kind, c.instance) for c in self.components}
        if len(seen) != len(self.components):
            raise ValueError("components must be unique by (kind, instance)")
        return self


class GlobalCheckpointRecord(_Model):
    """The commit point: once ``published/<id>.json`` exists, the checkpoint exists.

    Version 2 is self-verifying: ``record_digest`` is the sha256 of the record's canonical JSON
    without that field (:meth:`sealed` sets it), and the record's sequence claim pins the exact
    bytes. Version 1 records (no digest, no claim) are still read.
    """

    SCHEMA: ClassVar[int] = RECORD_SCHEMA_VERSION
    schema_version: int = Field(default=RECORD_SCHEMA_VERSION, ge=1)
    type: Literal["global_checkpoint"] = "global_checkpoint"
    checkpoint_id: Identifier
    sequence: int = Field(ge=1)
    created_at: datetime
    commit_token: str = Field(min_length=1)
    coordinator_id: str = Field(min_length=1)
    previous_checkpoint_id: Identifier | None = None
    aggregate: ObjectRef
    components: list[ComponentRef]
    token_snapshot: dict[str, JsonValue] | None = None
    framework_state: JsonValue = None
    counts: dict[str, int] = Field(default_factory=dict)
    record_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def computed_digest(self) -> str:
        """sha256 of the canonical JSON of every field except ``record_digest``."""
        body = self.model_dump(mode="json", exclude={"record_digest"})
        return hashlib.sha256(canonical_json(body)).hexdigest()

    def sealed(self) -> GlobalCheckpointRecord:
        """This record with ``record_digest`` set (what a publisher writes)."""
        return self.model_copy(update={"record_digest": self.computed_digest()})

    def to_bytes(self) -> bytes:
        exclude = {"record_digest"} if self.record_digest is None else set()
        return canonical_json(self.model_dump(mode="json", exclude=exclude))

    @model_validator(mode="after")
    def _keys_under_own_prefix(self) -> GlobalCheckpointRecord:
        # Garbage collection relies on this: a checkpoint references nothing outside its prefix.
        root = layout.checkpoint_prefix(self.checkpoint_id) + "/"
        for key in [self.aggregate.key, *(c.manifest.key for c in self.components)]:
            if not key.startswith(root):
                raise ValueError(f"{key!r} is outside the checkpoint's prefix {root!r}")
        if self.aggregate.key != layout.aggregate_key(self.checkpoint_id):
            raise ValueError("aggregate key must be layout.aggregate_key(checkpoint_id)")
        return self


class LatestPointer(_Model):
    """``latest.json``: which published checkpoint a restore without an id uses."""

    type: Literal["latest_pointer"] = "latest_pointer"
    checkpoint_id: Identifier
    sequence: int = Field(ge=1)
    created_at: datetime
    record: ObjectRef
    updated_at: datetime


class SequenceClaim(_Model):
    """``sequence/<n>.json``: written create-only just before the record it names, so each
    sequence number belongs to exactly one publish and pins that record's exact bytes."""

    type: Literal["sequence_claim"] = "sequence_claim"
    sequence: int = Field(ge=1)
    checkpoint_id: Identifier
    commit_token: str = Field(min_length=1)
    coordinator_id: str = Field(min_length=1)
    record: ObjectRef

    @model_validator(mode="after")
    def _names_published_key(self) -> SequenceClaim:
        if self.record.key != layout.published_key(self.checkpoint_id):
            raise ValueError("record key must be layout.published_key(checkpoint_id)")
        return self


def ordering_key(sequence: int, created_at: datetime, checkpoint_id: str) -> tuple[int, datetime, str]:
    """Total order of checkpoints: sequence, then creation time, then id (ties never happen twice)."""
    return (sequence, _utc(created_at), checkpoint_id)


def _record_order(record: GlobalCheckpointRecord | LatestPointer) -> tuple[int, datetime, str]:
    return ordering_key(record.sequence, record.created_at, record.checkpoint_id)


M = TypeVar("M", bound=_Model)


def _parse(cls: type[M], data: bytes, key: str) -> M:
    try:
        return cls.model_validate_json(data)
    except UnsupportedSchemaError:
        raise
    except ValidationError as exc:
        raise InvalidRecordError(
            f"{key}: not a valid {cls.__name__}: {describe_validation_error(exc)}", key=key
        ) from None
    except ValueError as exc:  # invalid UTF-8 / JSON
        raise InvalidRecordError(f"{key}: not a valid {cls.__name__}: {exc}", key=key) from None


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
    return _parse(AggregateManifest, data, ref.key)


# -- global record ------------------------------------------------------------------------


def publish_record(store: ObjectStore, record: GlobalCheckpointRecord) -> ObjectRef:
    """The commit: claim ``sequence/<n>.json``, then create ``published/<id>.json``.

    A version 2 record is sealed first and its sequence claimed (:func:`claim_sequence`):
    :class:`SequenceTakenError` when another publish holds that sequence (build the record
    again with a later one). A retry whose first try already landed finds identical bytes and
    succeeds; a record from another coordinator (different ``commit_token``) raises
    ``ManifestConflictError``. A version 1 record (legacy, tests) is written without a claim.
    """
    if record.schema_version >= 2:
        if record.record_digest is None:
            record = record.sealed()
        claim_sequence(store, record)
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
        claim = _parse(SequenceClaim, data, key)
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
    record = _parse(GlobalCheckpointRecord, data, key)
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
    return _parse(LatestPointer, raw[0], layout.LATEST_KEY), raw[1]


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
                current = _parse(LatestPointer, raw[0], layout.LATEST_KEY), raw[1]
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
        if _record_order(pointer) >= _record_order(mine):
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
