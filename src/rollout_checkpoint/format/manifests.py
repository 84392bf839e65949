"""The publisher's documents: aggregate manifest, global checkpoint record, sequence claim,
``latest`` pointer (their reading and writing is :mod:`~rollout_checkpoint.format.commit_log`).

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
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from ..errors import (
    IntegrityError,
    InvalidRecordError,
    InvalidValueError,
    UnsupportedSchemaError,
    refuse_newer_schema,
)
from ..ids import Identifier, validate_id
from . import layout
from ._validation import TypedModel, describe_validation_error

__all__ = [
    "AggregateManifest",
    "ComponentRef",
    "GlobalCheckpointRecord",
    "LatestPointer",
    "MANIFEST_SCHEMA_VERSION",
    "ObjectRef",
    "RECORD_SCHEMA_VERSION",
    "SequenceClaim",
    "canonical_json",
    "new_checkpoint_id",
    "new_commit_token",
    "ordering_key",
    "parse_document",
    "record_order",
]

MANIFEST_SCHEMA_VERSION = 1
"""Schema version of the aggregate manifest, the latest pointer and the sequence claim."""

RECORD_SCHEMA_VERSION = 2
"""Schema version of the global checkpoint record (2 added ``record_digest`` and the sequence
claim; version 1 records are still read)."""


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes every digest in the protocol is taken over.

    NaN and the infinities are not JSON (RFC 8259): ``invalid_value``, never written."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except ValueError as exc:
        raise InvalidValueError(f"not canonical JSON: {exc} (NaN and Infinity are not JSON)") from None


def new_commit_token() -> str:
    """A unique token that makes two publishers' objects differ byte-wise (create-only then decides)."""
    return uuid.uuid4().hex


def new_checkpoint_id(prefix: str = "ckpt", now: float | None = None) -> str:
    """``<prefix>-%Y%m%dT%H%M%S-<8hex>`` in UTC: sortable by time and unique with high probability."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC).strftime("%Y%m%dT%H%M%S")
    return validate_id(f"{prefix}-{stamp}-{uuid.uuid4().hex[:8]}", "checkpoint_id")


_INCARNATION = re.compile(r"[0-9a-f]{32}")
"""``protocol.INCARNATION_PATTERN`` (the format layer sits below the protocol's)."""


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
    run_id: Identifier | None = None
    """The run whose coordinator published this (``format.ownership``); absent before fencing."""
    epoch: int | None = Field(default=None, ge=1)
    """That coordinator's owner epoch; absent in records written before fencing existed."""
    incarnations: dict[str, str] | None = None
    """``kind/instance`` -> the incarnation each participant answered this checkpoint's cycle
    with (``docs/protocol.md``, "Incarnations"); absent in records written before it existed."""
    record_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    def _absent(self) -> set[str]:
        """Fields left out of the bytes when unset, so a record written before they existed
        keeps its exact bytes and digest."""
        return {name for name in ("run_id", "epoch", "incarnations") if getattr(self, name) is None}

    def computed_digest(self) -> str:
        """sha256 of the canonical JSON of every field except ``record_digest``."""
        body = self.model_dump(mode="json", exclude={"record_digest", *self._absent()})
        return hashlib.sha256(canonical_json(body)).hexdigest()

    def sealed(self) -> GlobalCheckpointRecord:
        """This record with ``record_digest`` set (what a publisher writes)."""
        return self.model_copy(update={"record_digest": self.computed_digest()})

    def to_bytes(self) -> bytes:
        exclude = {"record_digest"} if self.record_digest is None else set()
        return canonical_json(self.model_dump(mode="json", exclude=exclude | self._absent()))

    @model_validator(mode="after")
    def _valid_incarnations(self) -> GlobalCheckpointRecord:
        for name, incarnation in (self.incarnations or {}).items():
            kind, slash, instance = name.partition("/")
            if not slash:
                raise ValueError(f"incarnations: {name!r} is not kind/instance")
            validate_id(kind, "kind")
            validate_id(instance, "instance")
            if _INCARNATION.fullmatch(incarnation) is None:
                raise ValueError(f"incarnations: {name}: {incarnation!r} is not 32 lowercase hex digits")
        return self

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


def record_order(record: GlobalCheckpointRecord | LatestPointer) -> tuple[int, datetime, str]:
    return ordering_key(record.sequence, record.created_at, record.checkpoint_id)


M = TypeVar("M", bound=_Model)


def parse_document(cls: type[M], data: bytes, key: str) -> M:
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
