"""Token store: contracts (entries, receipts, snapshot, sink/source protocols), the reference
store on an object store, and the group-commit sink. Layer: above ``format``; never imports the
protocol, participants, registry, reader or anything above them."""

from __future__ import annotations

from ._batching import BatchingTokenSink, BatchTokenSink
from ._entries import (
    TOKEN_ENTRY_SCHEMA_VERSION,
    TOKEN_SNAPSHOT_FORMAT,
    InMemoryLineageStore,
    LineageStore,
    TokenEntry,
    TokenPutReceipt,
    TokenSink,
    TokenSnapshotEntry,
    TokenSnapshotReceipt,
    TokenSource,
    prefix_digest,
    token_key,
)
from ._store import ObjectStoreTokenStore, load_snapshot, read_entry, snapshot_key, verify_snapshot_data

__all__ = [
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "TOKEN_SNAPSHOT_FORMAT",
    "BatchTokenSink",
    "BatchingTokenSink",
    "InMemoryLineageStore",
    "LineageStore",
    "ObjectStoreTokenStore",
    "TokenEntry",
    "TokenPutReceipt",
    "TokenSink",
    "TokenSnapshotEntry",
    "TokenSnapshotReceipt",
    "TokenSource",
    "load_snapshot",
    "prefix_digest",
    "read_entry",
    "snapshot_key",
    "token_key",
    "verify_snapshot_data",
]
