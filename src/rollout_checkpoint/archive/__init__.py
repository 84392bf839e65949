"""Sharded Parquet archives: the shard writer, member index, component manifest and reader.

A component archive lives under one prefix::

    <prefix>/shards/<writer_id>-<seq>.parquet   zstd Parquet shards (immutable, unique names)
    <prefix>/index-<writer_id>.parquet          member index (Parquet)
    <prefix>/manifest.json                      component manifest, written last (create-only)

See ``docs/format.md`` for the byte-level specification.
"""

from __future__ import annotations

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
from ._reader import ArchiveReader, RawRecord, check_object, component_prefixes, find_component_prefixes
from ._schema import (
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_SHARD_BYTES,
    DEFAULT_ZSTD_LEVEL,
    INDEX_SCHEMA,
    SHARD_SCHEMA,
)
from ._writer import ArchiveWriter

__all__ = [
    "COMPONENT_MANIFEST_SCHEMA_VERSION",
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "DEFAULT_TARGET_SHARD_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "INDEX_SCHEMA",
    "SHARD_SCHEMA",
    "ArchiveReader",
    "ArchiveStateError",
    "ArchiveWriter",
    "ComponentManifest",
    "IndexEntry",
    "ManifestRef",
    "MemberNotFoundError",
    "MemberRef",
    "RawRecord",
    "ShardEntry",
    "check_object",
    "component_prefixes",
    "find_component_prefixes",
    "manifest_to_bytes",
    "parse_component_manifest",
]
