"""Arrow schemas and object names of a component archive (the on-storage format, see docs/format.md).

Kept in one module so the writer, the reader, the CLI and the docs agree on every column.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from ._names import MANIFEST_NAME

__all__ = [
    "DEFAULT_ROW_GROUP_BYTES",
    "DEFAULT_ROW_GROUP_ROWS",
    "DEFAULT_TARGET_SHARD_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "INDEX_FORMAT_VERSION",
    "INDEX_META_KEY",
    "INDEX_SCHEMA",
    "KEY_COLUMNS",
    "MANIFEST_NAME",
    "SHARDS_DIR",
    "SHARD_FORMAT_VERSION",
    "SHARD_META_KEY",
    "SHARD_SCHEMA",
    "footer_meta_key",
    "index_name",
    "join_key",
    "shard_name",
    "utc_now_iso",
]

DEFAULT_TARGET_SHARD_BYTES = 64 << 20
DEFAULT_ROW_GROUP_ROWS = 1024
DEFAULT_ROW_GROUP_BYTES = 1 << 20
"""Uncompressed payload bytes after which a row group is cut (whatever the shard size): the
writer holds about two row groups, and a point lookup downloads one."""
DEFAULT_ZSTD_LEVEL = 1
RECORD_SCHEMA_VERSION = 1
"""The members' default ``schema_version`` (``records.RECORD_SCHEMA_VERSION``; kept here so the
writer does not import the pydantic record models, and a test checks they agree)."""

SHARD_FORMAT_VERSION = 1
INDEX_FORMAT_VERSION = 1
SHARD_META_KEY = b"rollout_checkpoint.shard"
INDEX_META_KEY = b"rollout_checkpoint.index"
SHARDS_DIR = "shards"

SHARD_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("revision", pa.int64(), nullable=True),
        pa.field("refs", pa.string(), nullable=True),
        pa.field("payload", pa.binary(), nullable=False),
    ],
    metadata={SHARD_META_KEY: json.dumps({"format": SHARD_FORMAT_VERSION}).encode()},
)

KEY_COLUMNS = ("kind", "rollout_id", "attempt", "key")
"""The member identity; unique within one archive."""

# Statistics only where they help pruning: min/max of a 2 KiB payload column bloat the footer
# ~10x (archive-perf-notes.md) and no one filters on payload bytes.
SHARD_STATISTICS_COLUMNS = ["kind", "rollout_id", "attempt", "key", "schema_version", "revision"]
# Dictionary encoding only where values repeat within a row group: rollout ids and refs are
# (nearly) unique per member, so a dictionary there costs hashing and saves nothing.
SHARD_DICTIONARY_COLUMNS = ["kind", "key"]

INDEX_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("revision", pa.int64(), nullable=True),
        pa.field("refs", pa.string(), nullable=True),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("row_group", pa.int32(), nullable=False),
        pa.field("row", pa.int32(), nullable=False),
        pa.field("rg_offset", pa.int64(), nullable=False),
        pa.field("rg_length", pa.int64(), nullable=False),
    ]
)
INDEX_MEMBER_COLUMNS = ["kind", "rollout_id", "attempt", "key", "revision", "refs"]


def footer_meta_key(shard: int) -> bytes:
    """Index key-value metadata entry holding shard ``shard``'s raw Parquet footer."""
    return f"rollout_checkpoint.footer.{shard}".encode()


def shard_name(writer_id: str, seq: int) -> str:
    """Relative key of a shard: unique per writer, never overwritten."""
    return f"{SHARDS_DIR}/{writer_id}-{seq:06d}.parquet"


def index_name(writer_id: str) -> str:
    return f"index-{writer_id}.parquet"


def join_key(prefix: str, name: str) -> str:
    """``prefix/name``, or ``name`` for an archive at the store root."""
    return f"{prefix}/{name}" if prefix else name


def utc_now_iso() -> str:
    """``2026-11-29T12:00:00.123Z``: ISO 8601, UTC, millisecond precision."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
