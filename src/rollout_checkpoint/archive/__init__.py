"""Sharded Parquet archives: the shard writer, member index, component manifest and reader.

A component archive lives under one prefix::

    <prefix>/shards/<writer_id>-<seq>.parquet   zstd Parquet shards (immutable, unique names)
    <prefix>/index-<writer_id>.parquet          member index (Parquet)
    <prefix>/manifest.json                      component manifest, written last (create-only)

See ``docs/format.md`` for the byte-level specification.

Names resolve on first use: ``from rollout_checkpoint.archive import ArchiveWriter`` loads the
writer only (pyarrow's Parquet writer, orjson), not the reader, the record models or pydantic,
which the write path does not need (their imports count in a writer's memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from ._errors import ArchiveStateError, MemberNotFoundError
    from ._index import MemberRef
    from ._manifest import (
        COMPONENT_MANIFEST_SCHEMA_VERSION,
        ComponentManifest,
        IndexEntry,
        ManifestRef,
        ShardEntry,
        manifest_to_bytes,
        parse_component_manifest,
    )
    from ._parquet_io import open_parquet_file
    from ._reader import (
        RawArchiveReader,
        RawRecord,
        check_object,
        component_prefixes,
        find_component_prefixes,
    )
    from ._schema import (
        DEFAULT_ROW_GROUP_BYTES,
        DEFAULT_ROW_GROUP_ROWS,
        DEFAULT_TARGET_SHARD_BYTES,
        DEFAULT_ZSTD_LEVEL,
        INDEX_SCHEMA,
        SHARD_SCHEMA,
    )
    from ._united import UnitedReferences
    from ._writer import ArchiveWriter

_EXPORTS = {
    "ArchiveStateError": "._errors",
    "MemberNotFoundError": "._errors",
    "MemberRef": "._index",
    "COMPONENT_MANIFEST_SCHEMA_VERSION": "._manifest",
    "ComponentManifest": "._manifest",
    "IndexEntry": "._manifest",
    "ManifestRef": "._manifest",
    "ShardEntry": "._manifest",
    "manifest_to_bytes": "._manifest",
    "parse_component_manifest": "._manifest",
    "RawArchiveReader": "._reader",
    "RawRecord": "._reader",
    "check_object": "._reader",
    "component_prefixes": "._reader",
    "find_component_prefixes": "._reader",
    "DEFAULT_ROW_GROUP_BYTES": "._schema",
    "DEFAULT_ROW_GROUP_ROWS": "._schema",
    "DEFAULT_TARGET_SHARD_BYTES": "._schema",
    "DEFAULT_ZSTD_LEVEL": "._schema",
    "INDEX_SCHEMA": "._schema",
    "SHARD_SCHEMA": "._schema",
    "ArchiveWriter": "._writer",
    "UnitedReferences": "._united",
    "open_parquet_file": "._parquet_io",
}


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "COMPONENT_MANIFEST_SCHEMA_VERSION",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "DEFAULT_TARGET_SHARD_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "INDEX_SCHEMA",
    "SHARD_SCHEMA",
    "RawArchiveReader",
    "ArchiveStateError",
    "ArchiveWriter",
    "ComponentManifest",
    "IndexEntry",
    "ManifestRef",
    "MemberNotFoundError",
    "MemberRef",
    "RawRecord",
    "ShardEntry",
    "UnitedReferences",
    "check_object",
    "component_prefixes",
    "find_component_prefixes",
    "manifest_to_bytes",
    "open_parquet_file",
    "parse_component_manifest",
]
