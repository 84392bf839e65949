"""The component manifest: the JSON object whose create-only put commits an archive.

Everything a reader trusts is reached from it: shard and index keys with their byte lengths
and SHA-256 digests (our own digests; ETags are opaque and multipart ETags are not MD5s).
"""

from __future__ import annotations

import builtins
import hashlib
import json
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SkipValidation,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import InvalidIdentifierError, InvalidRecordError, InvalidValueError, refuse_newer_schema
from ..ids import Identifier, validate_key
from ._schema import utc_now_iso

__all__ = [
    "COMPONENT_MANIFEST_SCHEMA_VERSION",
    "BaseEntry",
    "ReferencesEntry",
    "ComponentManifest",
    "IndexEntry",
    "ManifestRef",
    "ShardEntry",
    "build_component_manifest",
    "manifest_to_bytes",
    "parse_component_manifest",
    "utc_now_iso",
]

COMPONENT_MANIFEST_SCHEMA_VERSION: Final = 2
"""Newest manifest schema this code reads and writes. 2 adds ``bases`` and ``references`` (member
references into earlier archives, docs/format.md "Format version 2"); an archive with neither is
still written as version 1, so version-1 readers keep reading it."""

_SHA256 = r"^[0-9a-f]{64}$"


def _relative_key(value: str) -> str:
    try:
        return validate_key(value)
    except InvalidIdentifierError as exc:
        raise ValueError(exc.message) from None


_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)


_PARSED_JSON: Final[dict[str, bool]] = {"parsed_json": True}
"""Validation context of a manifest that ``json.loads`` produced (its ``extra`` needs no walk)."""


def _check_json(value: Any) -> None:
    """``ValueError`` unless ``value`` is made of JSON values only: ``dict`` with ``str`` keys,
    ``list``, ``str``, ``int``, ``float``, ``bool``, ``None`` (no tuple, bytes or other type)."""
    scalar = _SCALAR_TYPES
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for child in item:
                if type(child) not in scalar:
                    stack.append(child)
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"extra: object key {key!r} is not a string")
                if type(child) not in scalar:
                    stack.append(child)
        elif not isinstance(item, _SCALARS):
            raise ValueError(f"extra: {type(item).__name__} is not a JSON value")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShardEntry(_Model):
    """One Parquet shard: ``key`` is relative to the archive prefix."""

    key: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    records: int = Field(ge=0)
    row_groups: int = Field(ge=0)
    footer_offset: int | None = Field(default=None, ge=0)
    footer_bytes: int | None = Field(default=None, ge=0)

    _check_key = field_validator("key")(_relative_key)


class IndexEntry(_Model):
    """The member index (Parquet): ``key`` is relative to the archive prefix."""

    key: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    rows: int = Field(ge=0)

    _check_key = field_validator("key")(_relative_key)


class ManifestRef(_Model):
    """Where a committed manifest is and what its exact bytes hash to (aggregates pin these)."""

    key: str
    sha256: str = Field(pattern=_SHA256)
    bytes: int = Field(ge=0)

    _check_key = field_validator("key")(_relative_key)

    @classmethod
    def of(cls, key: str, data: builtins.bytes) -> ManifestRef:
        return cls(key=key, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


class BaseEntry(_Model):
    """An earlier archive whose shards hold members this archive refers to (``prefix`` relative to
    the store root; ``manifest`` pins its ``manifest.json`` bytes)."""

    prefix: str
    manifest: ManifestRef

    _check_prefix = field_validator("prefix")(_relative_key)

    @model_validator(mode="after")
    def _manifest_in_prefix(self) -> BaseEntry:
        if self.manifest.key != f"{self.prefix}/manifest.json":
            raise ValueError(f"base manifest key {self.manifest.key!r} is not {self.prefix}/manifest.json")
        return self


class ReferencesEntry(_Model):
    """The reference table (Parquet): ``key`` relative to the archive prefix, ``counts`` per kind."""

    key: str
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=_SHA256)
    rows: int = Field(ge=0)
    counts: dict[str, int]

    _check_key = field_validator("key")(_relative_key)


class ComponentManifest(_Model):
    """What one participant instance wrote for one checkpoint; see docs/format.md."""

    schema_version: Literal[1, 2] = 1
    checkpoint_id: Identifier
    participant_kind: Identifier
    instance: Identifier
    writer_id: Identifier
    created_at: str = Field(min_length=1)
    shards: list[ShardEntry]
    index: IndexEntry
    record_counts: dict[str, int]
    digest_algorithm: Literal["sha256"] = "sha256"
    extra: Annotated[dict[str, JsonValue], SkipValidation] = Field(default_factory=dict)
    """JSON values only, checked by ``_extra_is_json`` (the values pydantic's ``JsonValue``
    accepts, at a fraction of its cost on the long execution lists a manifest carries)."""
    bases: list[BaseEntry] | None = None
    references: ReferencesEntry | None = None

    @field_validator("extra", mode="before")
    @classmethod
    def _extra_is_json(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            raise ValueError("extra must be a JSON object")
        if info.context is not _PARSED_JSON:  # ``json.loads`` gives nothing but JSON values
            _check_json(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ComponentManifest:
        # A manifest that contradicts itself is refused before anyone trusts a count from it.
        shard_records = sum(s.records for s in self.shards)
        counted = sum(self.record_counts.values())
        if any(n < 0 for n in self.record_counts.values()):
            raise ValueError("record_counts must not be negative")
        if not (shard_records == counted == self.index.rows):
            raise ValueError(
                f"inconsistent counts: shards hold {shard_records} records, record_counts sum to "
                f"{counted}, the index has {self.index.rows} rows"
            )
        keys = [s.key for s in self.shards] + [self.index.key]
        if self.references is not None:
            keys.append(self.references.key)
            if any(n < 0 for n in self.references.counts.values()) or (
                sum(self.references.counts.values()) != self.references.rows
            ):
                raise ValueError("reference counts must be non-negative and sum to the reference rows")
        if len(set(keys)) != len(keys):
            raise ValueError("shard, index and reference table keys must be distinct")
        v2 = self.bases is not None or self.references is not None
        if v2 != (self.schema_version == 2):
            raise ValueError("bases and references are present exactly in schema_version 2")
        if v2 and (self.bases is None or self.references is None):
            raise ValueError("schema_version 2 has both bases and references")
        if self.bases is not None:
            prefixes = [b.prefix for b in self.bases]
            if len(set(prefixes)) != len(prefixes):
                raise ValueError("bases must be distinct archives")
        return self

    @property
    def total_records(self) -> int:
        return self.index.rows

    @property
    def total_bytes(self) -> int:
        """Bytes of shards plus index (the manifest itself not included)."""
        return sum(s.bytes for s in self.shards) + self.index.bytes


def manifest_to_bytes(manifest: ComponentManifest) -> bytes:
    """Canonical bytes (sorted keys, compact, UTF-8): equal manifests give equal bytes, so a
    retried create-only put of the same manifest is recognised as idempotent. A version-1
    manifest has no ``bases``/``references`` keys at all (its bytes are those of version 1)."""
    # ``extra`` holds JSON values only (checked when the manifest was built), which dump as
    # themselves: taken as they are, never through pydantic's JsonValue serializer (slow on the
    # long execution lists)
    body = manifest.model_dump(mode="json", exclude={"extra"})
    body["extra"] = manifest.extra
    if manifest.schema_version == 1:
        body.pop("bases", None)
        body.pop("references", None)
    try:
        return json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except ValueError as exc:  # NaN or Infinity somewhere in ``extra``: not JSON
        raise InvalidValueError(f"component manifest is not canonical JSON: {exc}") from None


def build_component_manifest(
    *,
    checkpoint_id: str,
    participant_kind: str,
    instance: str,
    writer_id: str,
    created_at: str,
    shards: list[Any],
    index: IndexEntry,
    record_counts: dict[str, int],
    extra: dict[str, JsonValue],
    bases: list[BaseEntry] | None = None,
    references: ReferencesEntry | None = None,
) -> tuple[ComponentManifest, builtins.bytes]:
    """A finished writer's manifest and its bytes. ``shards`` are the writer's ``ShardInfo``s
    (slotted dataclasses with ``ShardEntry``'s fields), in upload order."""
    manifest = ComponentManifest(
        checkpoint_id=checkpoint_id,
        participant_kind=participant_kind,
        instance=instance,
        writer_id=writer_id,
        created_at=created_at,
        shards=[ShardEntry(**{name: getattr(info, name) for name in info.__slots__}) for info in shards],
        index=index,
        record_counts=dict(sorted(record_counts.items())),
        extra=extra,
        schema_version=2 if references is not None else 1,
        bases=bases,
        references=references,
    )
    return manifest, manifest_to_bytes(manifest)


def parse_component_manifest(data: bytes | str) -> ComponentManifest:
    """Parse manifest bytes: ``UnsupportedSchemaError`` for a newer schema, else
    ``InvalidRecordError`` for anything that is not a valid component manifest."""
    try:
        # orjson: a manifest lists every live execution (22 B each), so at a million rollouts the
        # fleet's manifests are tens of MB of JSON; what orjson refuses, json decides as before
        loaded: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            loaded = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRecordError(f"component manifest is not JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise InvalidRecordError("component manifest must be a JSON object")
    refuse_newer_schema("component manifest", loaded.get("schema_version"), COMPONENT_MANIFEST_SCHEMA_VERSION)
    try:
        return ComponentManifest.model_validate(loaded, context=_PARSED_JSON)
    except ValidationError as exc:
        raise InvalidRecordError(f"invalid component manifest: {exc}") from None
