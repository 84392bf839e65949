"""The reference token store on an object store, and reading a checkpoint's token snapshot.

:class:`ObjectStoreTokenStore` is the reference backend::

    <prefix>/shards/<uuid>.parquet          immutable zstd Parquet, one row per model call
    <prefix>/snapshots/<checkpoint_id>.json snapshot manifest (create-only): key -> digest, length

Trade-off: every :meth:`ObjectStoreTokenStore.put` writes one shard, so a receipt is durable
the moment it is returned (a model call's staging is the durability boundary a checkpoint waits
for). That is one object per model call; a server that stages many calls at once should use
:meth:`ObjectStoreTokenStore.put_many`, which writes one shard for the whole batch. Buffering
across calls would make receipts lie about durability, so it is not offered: a server that
wants fewer, larger shards wraps the store in :class:`~rollout_checkpoint.tokens.BatchingTokenSink`,
whose ``put`` still returns only once its batch is durable (group commit).
"""

from __future__ import annotations

import hashlib
import io
import json
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import TypeAdapter, ValidationError

from ..archive import open_parquet_file
from ..errors import IntegrityError, InvalidRecordError, ObjectExistsError, ObjectNotFoundError
from ..format import layout
from ..ids import validate_id, validate_key
from ..store import ObjectStore, open_store
from ._entries import (
    TOKEN_SNAPSHOT_FORMAT,
    TokenEntry,
    TokenPutReceipt,
    TokenSnapshotEntry,
    TokenSnapshotReceipt,
)

__all__ = [
    "ObjectStoreTokenStore",
    "load_snapshot",
    "read_entry",
    "snapshot_key",
    "verify_snapshot_data",
]


_SHARD_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("digest", pa.string()),
        ("length", pa.int64()),
        ("schema_version", pa.int32()),
        ("rollout_id", pa.string()),
        ("attempt", pa.int64()),
        ("call_id", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int64())),
        ("generation_token_ids", pa.list_(pa.int64())),
        ("generation_log_probs", pa.list_(pa.float64())),
        ("mask", pa.list_(pa.int8())),
    ]
)


def snapshot_key(checkpoint_id: str, prefix: str = layout.TOKENS_PREFIX) -> str:
    return f"{prefix.strip('/')}/snapshots/{validate_id(checkpoint_id, 'checkpoint_id')}.json"


class ObjectStoreTokenStore:
    """Reference :class:`TokenSink` and :class:`TokenSource` on an :class:`ObjectStore`.

    Thread-safe. Shards are immutable and uniquely named, so several processes may share a
    prefix: a snapshot lists every shard (reading only the key/digest/length columns of shards
    this instance has not seen yet). See the module docstring for the layout and trade-offs.
    """

    def __init__(
        self, store: str | ObjectStore, prefix: str = layout.TOKENS_PREFIX, *, zstd_level: int = 3
    ) -> None:
        self.store = open_store(store)
        self.prefix = validate_key(prefix.strip("/"))
        self.zstd_level = zstd_level
        self._lock = threading.Lock()
        self._index: dict[str, TokenSnapshotEntry] = {}
        self._seen_shards: set[str] = set()

    @property
    def name(self) -> str:
        return f"{self.store.url}/{self.prefix}"

    # -- sink ---------------------------------------------------------------------------------
    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        """Store one call's tokens durably (one shard); a repeat with equal tokens is a no-op."""
        return self.put_many([entry])[0]

    def put_many(self, entries: Sequence[TokenEntry]) -> list[TokenPutReceipt]:
        """Store several calls in one shard; receipts in input order.

        A key already stored with equal bytes is not written again; with different bytes it
        raises ``ObjectExistsError`` (a call id names exactly one generation).
        """
        receipts = [e.receipt() for e in entries]
        fresh: dict[str, tuple[TokenEntry, TokenPutReceipt]] = {}
        with self._lock:
            for entry, receipt in zip(entries, receipts, strict=True):
                known = self._index.get(receipt.key)
                pending = fresh.get(receipt.key)
                digest = known.digest if known else (pending[1].digest if pending else None)
                if digest is None:
                    fresh[receipt.key] = (entry, receipt)
                elif digest != receipt.digest:
                    raise ObjectExistsError(
                        f"token entry {receipt.key} is already stored with different tokens",
                        key=receipt.key,
                    )
        if not fresh:
            return receipts
        rows = list(fresh.values())
        shard = f"{self.prefix}/shards/{uuid.uuid4().hex}.parquet"
        self.store.put_if_absent(shard, self._encode(rows))
        with self._lock:
            self._seen_shards.add(shard)
            for row, (_, receipt) in enumerate(rows):
                self._index.setdefault(
                    receipt.key,
                    TokenSnapshotEntry(digest=receipt.digest, length=receipt.length, shard=shard, row=row),
                )
        return receipts

    def _encode(self, rows: Sequence[tuple[TokenEntry, TokenPutReceipt]]) -> bytes:
        columns: dict[str, list[Any]] = {name: [] for name in _SHARD_SCHEMA.names}
        for entry, receipt in rows:
            columns["key"].append(receipt.key)
            columns["digest"].append(receipt.digest)
            columns["length"].append(receipt.length)
            columns["schema_version"].append(entry.schema_version)
            columns["rollout_id"].append(entry.rollout_id)
            columns["attempt"].append(entry.attempt)
            columns["call_id"].append(entry.call_id)
            columns["prompt_token_ids"].append(entry.prompt_token_ids)
            columns["generation_token_ids"].append(entry.generation_token_ids)
            columns["generation_log_probs"].append(entry.generation_log_probs)
            columns["mask"].append(entry.mask)
        table = pa.table(columns, schema=_SHARD_SCHEMA)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd", compression_level=self.zstd_level)
        return sink.getvalue()

    # -- source -------------------------------------------------------------------------------
    def refresh(self) -> int:
        """Index shards written by other processes; returns how many keys are known."""
        shards = [i.key for i in self.store.list(f"{self.prefix}/shards/") if i.key.endswith(".parquet")]
        with self._lock:
            new = [s for s in shards if s not in self._seen_shards]
        found: list[tuple[str, TokenSnapshotEntry]] = []
        for shard in new:
            with self.store.open_read(shard) as fh:
                table = open_parquet_file(fh).read(columns=["key", "digest", "length"], use_threads=False)
            for row, (key, digest, length) in enumerate(
                zip(
                    table["key"].to_pylist(),
                    table["digest"].to_pylist(),
                    table["length"].to_pylist(),
                    strict=True,
                )
            ):
                found.append((key, TokenSnapshotEntry(digest=digest, length=length, shard=shard, row=row)))
        with self._lock:
            for key, entry in found:
                known = self._index.get(key)
                if known is None:
                    self._index[key] = entry
                elif known.digest != entry.digest:
                    raise IntegrityError(
                        f"token entry {key} is stored twice with different tokens "
                        f"({known.shard} and {entry.shard})",
                        key=key,
                    )
            self._seen_shards.update(new)
            return len(self._index)

    def get(self, key: str) -> TokenEntry:
        """The entry under ``key``, digest-checked against the index."""
        with self._lock:
            located = self._index.get(key)
        if located is None:
            self.refresh()
            with self._lock:
                located = self._index.get(key)
        if located is None or located.shard is None or located.row is None:
            raise ObjectNotFoundError(f"{self.name}: no token entry {key!r}", key=key)
        return read_entry(self.store, located, key)

    def forget(self, rollout_ids: Sequence[str]) -> int:
        """Leave these rollouts' calls out of later snapshots (the framework is done with them),
        so retention can delete their shards once no kept checkpoint lists them. Returns how
        many keys were dropped. A store that re-reads every shard (a new process) lists them
        again until gc has removed their shards."""
        prefixes = tuple(f"{validate_id(r, 'rollout_id')}/" for r in rollout_ids)
        with self._lock:
            dropped = [k for k in self._index if k.startswith(prefixes)]
            for key in dropped:
                del self._index[key]
        return len(dropped)

    def snapshot(self, checkpoint_id: str) -> TokenSnapshotReceipt:
        """Write ``snapshots/<checkpoint_id>.json`` (create-only) listing every key with its
        digest and length. The first snapshot under an id wins: a retry returns its receipt.

        The listing is built from the index's fields and encoded by orjson in one call (the
        same canonical bytes as ``json.dumps(sort_keys=True)``); only a snapshot someone else
        already wrote under this id is read back and parsed.
        """
        self.refresh()
        key = snapshot_key(checkpoint_id, self.prefix)
        with self._lock:
            entries = {
                k: {"digest": e.digest, "length": e.length, "shard": e.shard, "row": e.row}
                for k, e in self._index.items()
            }
        body = {
            "format": TOKEN_SNAPSHOT_FORMAT,
            "store": self.name,
            "checkpoint_id": checkpoint_id,
            "snapshot_id": checkpoint_id,
            "entries": entries,
        }
        data = _canonical_json(body)
        count = len(entries)
        try:
            self.store.put_if_absent(key, data)
        except ObjectExistsError:
            data = self.store.get(key)
            count = len(_parse_snapshot(data, key, checkpoint_id))
        return TokenSnapshotReceipt(
            store=self.name,
            checkpoint_id=checkpoint_id,
            snapshot_id=checkpoint_id,
            key=key,
            digest=hashlib.sha256(data).hexdigest(),
            length=len(data),
            entries=count,
        )


def _canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys, UTF-8 (``json.dumps(sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``), by orjson; what orjson refuses (integers beyond 64 bits) by json."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


_SNAPSHOT_ENTRIES: TypeAdapter[dict[str, TokenSnapshotEntry]] = TypeAdapter(dict[str, TokenSnapshotEntry])


def _parse_snapshot(data: bytes, key: str, checkpoint_id: str) -> dict[str, TokenSnapshotEntry]:
    """The entries of a stored snapshot, every one validated (in one pydantic call: faster than
    checking columns in Python and building the models with ``model_construct``)."""
    try:
        body = orjson.loads(data)  # its JSONDecodeError is a ValueError
        if not isinstance(body, dict) or body.get("format") != TOKEN_SNAPSHOT_FORMAT:
            raise ValueError(f"not a {TOKEN_SNAPSHOT_FORMAT} document")
        if body.get("checkpoint_id") != checkpoint_id:
            raise ValueError(
                f"snapshot names checkpoint {body.get('checkpoint_id')!r}, not {checkpoint_id!r}"
            )
        raw = body.get("entries")
        if not isinstance(raw, dict):
            raise ValueError("'entries' must be an object")
        return _SNAPSHOT_ENTRIES.validate_python(raw)
    except (ValueError, ValidationError) as exc:
        raise IntegrityError(f"{key}: invalid token snapshot: {exc}", key=key, problem="invalid") from None


def load_snapshot(store: str | ObjectStore, receipt: TokenSnapshotReceipt) -> dict[str, TokenSnapshotEntry]:
    """Read the snapshot a receipt names, verify its length and digest, return key -> entry.

    ``IntegrityError`` when the snapshot is missing, truncated, altered or names another
    checkpoint: the recovery reader then rejects the checkpoint.
    """
    target = open_store(store)
    try:
        data = target.get(receipt.key)
    except ObjectNotFoundError:
        raise IntegrityError(
            f"token snapshot {receipt.key} is missing", key=receipt.key, problem="missing"
        ) from None
    if len(data) != receipt.length:
        raise IntegrityError(
            f"token snapshot {receipt.key} is {len(data)} bytes, the receipt says {receipt.length}",
            key=receipt.key,
            problem="truncated" if len(data) < receipt.length else "altered",
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != receipt.digest:
        raise IntegrityError(
            f"token snapshot {receipt.key} is altered: sha256 {digest}, receipt {receipt.digest}",
            key=receipt.key,
            problem="altered",
        )
    entries = _parse_snapshot(data, receipt.key, receipt.checkpoint_id)
    if len(entries) != receipt.entries:
        raise IntegrityError(
            f"token snapshot {receipt.key} lists {len(entries)} keys, receipt {receipt.entries}"
        )
    return entries


def _read_shard(store: ObjectStore, shard: str) -> pa.Table:
    try:
        with store.open_read(shard) as fh:
            return open_parquet_file(fh).read(use_threads=False)
    except ObjectNotFoundError:
        raise IntegrityError(f"token shard {shard} is missing", key=shard, problem="missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise IntegrityError(
            f"token shard {shard} is not readable Parquet (truncated or altered): {exc}",
            key=shard,
            problem="unreadable",
        ) from None


def _entry_from_table(table: pa.Table, located: TokenSnapshotEntry, key: str) -> TokenEntry:
    assert located.shard is not None and located.row is not None
    if located.row >= table.num_rows:
        raise IntegrityError(f"token shard {located.shard} has no row {located.row}", key=located.shard)
    row = {name: table[name][located.row].as_py() for name in _SHARD_SCHEMA.names}
    if row["key"] != key:
        raise IntegrityError(f"token shard {located.shard} row {located.row} holds {row['key']}, not {key}")
    if (row["digest"], row["length"]) != (located.digest, located.length):
        raise IntegrityError(
            f"token shard {located.shard} row {located.row} lists another digest/length for {key} (altered)",
            key=key,
            problem="altered",
        )
    try:
        entry = TokenEntry(
            schema_version=row["schema_version"],
            rollout_id=row["rollout_id"],
            attempt=row["attempt"],
            call_id=row["call_id"],
            prompt_token_ids=row["prompt_token_ids"],
            generation_token_ids=row["generation_token_ids"],
            generation_log_probs=row["generation_log_probs"],
            mask=row["mask"],
        )
    except InvalidRecordError as exc:  # bytes that decode to no valid entry were damaged after staging
        raise IntegrityError(
            f"token entry {key} decodes to an invalid entry (altered): {exc.message}",
            key=key,
            problem="altered",
        ) from None
    receipt = entry.receipt()
    if (receipt.digest, receipt.length) != (located.digest, located.length):
        raise IntegrityError(
            f"token entry {key} does not match its digest/length (altered)", key=key, problem="altered"
        )
    return entry


def read_entry(store: ObjectStore, located: TokenSnapshotEntry, key: str) -> TokenEntry:
    """Read one entry from its shard and check it against the digest and length it was listed with."""
    if located.shard is None or located.row is None:
        raise ObjectNotFoundError(f"token entry {key!r} has no location", key=key)
    return _entry_from_table(_read_shard(store, located.shard), located, key)


def verify_snapshot_data(store: str | ObjectStore, receipt: TokenSnapshotReceipt) -> int:
    """Check every token entry a snapshot lists against its digest and length (reads token data:
    this is ``verify``, not classification). Returns the number of entries checked; raises
    :class:`IntegrityError` naming the shard or key that is missing, truncated or altered."""
    store = open_store(store)
    entries = load_snapshot(store, receipt)
    by_shard: dict[str, list[tuple[str, TokenSnapshotEntry]]] = {}
    for key, located in entries.items():
        if located.shard is None or located.row is None:
            raise IntegrityError(f"token entry {key!r} has no location in snapshot {receipt.key}", key=key)
        by_shard.setdefault(located.shard, []).append((key, located))
    for shard, members in sorted(by_shard.items()):
        table = _read_shard(store, shard)
        for key, located in members:
            _entry_from_table(table, located, key)
    return len(entries)
