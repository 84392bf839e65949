"""The shard writer: streams records into zstd Parquet shards, then commits index and manifest.

Why it looks like this (measured in archive-perf-notes.md):

* Records are buffered as plain column lists and turned into Arrow arrays once per row group,
  so the per-record cost is a handful of list appends (no per-record pydantic validation for
  ``write_raw``, no per-record Arrow calls).
* Each row group is encoded into an in-memory Parquet stream as soon as it is full, so at any
  moment the writer holds one partly encoded shard plus one row group: memory stays bounded by
  ``target_shard_bytes`` whatever the total written.
* A finished shard is uploaded with one ``put`` under a unique name (objects are immutable, no
  temp-then-rename); only the manifest, written last with ``put_if_absent``, makes it part of
  the checkpoint. Shards of an aborted writer are unreferenced garbage for retention to collect.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import JsonValue

from ..errors import InvalidRecordError, ManifestConflictError, ObjectExistsError
from ..ids import validate_id, validate_key
from ..records import RECORD_SCHEMA_VERSION, Record
from ..store import ObjectStore
from ._errors import ArchiveStateError
from ._index import IndexBuilder, RowGroupSpan, row_group_spans
from ._manifest import (
    ComponentManifest,
    IndexEntry,
    ManifestRef,
    ShardEntry,
    manifest_to_bytes,
    utc_now_iso,
)
from ._schema import (
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_SHARD_BYTES,
    DEFAULT_ZSTD_LEVEL,
    INDEX_MEMBER_COLUMNS,
    MANIFEST_NAME,
    SHARD_DICTIONARY_COLUMNS,
    SHARD_SCHEMA,
    SHARD_STATISTICS_COLUMNS,
    encode_refs,
    index_name,
    join_key,
    shard_name,
)

__all__ = ["ArchiveWriter"]

_SHARD_TYPES = [field.type for field in SHARD_SCHEMA]
_MAX_MEMBER_KEY = 1024
_ID_CACHE_LIMIT = 1 << 16


@dataclass
class _EncodedShard:
    """A shard serialised in memory, waiting for (or retrying) its upload."""

    entry: ShardEntry
    data: bytes
    row_groups: list[pa.Table]
    spans: list[RowGroupSpan]
    footer: bytes


class ArchiveWriter:
    """Write one component archive under ``prefix`` of ``store``; not thread-safe.

    ``write``/``write_raw`` append members; :meth:`commit` uploads the last shard and the member
    index, then creates ``manifest.json`` (create-only). As a context manager an exception
    aborts (no manifest: the archive does not exist for readers) and a clean exit commits if
    :meth:`commit` was not called.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        checkpoint_id: str,
        participant_kind: str,
        instance: str,
        target_shard_bytes: int = DEFAULT_TARGET_SHARD_BYTES,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        zstd_level: int = DEFAULT_ZSTD_LEVEL,
    ) -> None:
        if target_shard_bytes < 1:
            raise ValueError("target_shard_bytes must be positive")
        if row_group_rows < 1:
            raise ValueError("row_group_rows must be positive")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.store = store
        self.prefix = prefix
        self.checkpoint_id = validate_id(checkpoint_id, "checkpoint_id")
        self.participant_kind = validate_id(participant_kind, "participant kind")
        self.instance = validate_id(instance, "instance")
        self.target_shard_bytes = target_shard_bytes
        self.row_group_rows = row_group_rows
        # Row groups are also cut by bytes, so a few huge records cannot make one row group
        # (the unit a lookup downloads) as big as the shard.
        self.row_group_bytes = max(1, target_shard_bytes // 4)
        self.zstd_level = zstd_level
        self.writer_id = uuid.uuid4().hex

        # the open row group, as column lists
        self._kinds: list[str] = []
        self._rollout_ids: list[str] = []
        self._attempts: list[int] = []
        self._keys: list[str] = []
        self._schema_versions: list[int] = []
        self._revisions: list[int | None] = []
        self._refs: list[str | None] = []
        self._payloads: list[bytes] = []
        self._rg_payload_bytes = 0
        self._encoded_bytes = 0  # size of the open shard's Parquet stream (changes per row group)
        self._inflight_bytes = 0  # payload bytes of the row group on the encoder thread
        self._shard_payload_bytes = 0  # uncompressed payload bytes of the open shard
        self._encoder: ThreadPoolExecutor | None = None
        self._job: Future[None] | None = None
        self._broken: BaseException | None = None

        # the open shard
        self._sink: pa.BufferOutputStream | None = None
        self._pq: pq.ParquetWriter | None = None
        self._shard_row_groups: list[pa.Table] = []
        self._pending: _EncodedShard | None = None

        self._seq = 0
        self._shards: list[ShardEntry] = []
        self._index = IndexBuilder()
        self._record_counts: dict[str, int] = {}
        self._seen: set[int] = set()
        self._valid_ids: set[str] = set()
        self._index_blob: tuple[str, bytes] | None = None
        self._candidate: tuple[dict[str, JsonValue], ComponentManifest, bytes] | None = None
        self._manifest: ComponentManifest | None = None
        self._manifest_ref: ManifestRef | None = None
        self._aborted = False
        self._created_at = utc_now_iso()

    # -- public state -----------------------------------------------------------------------
    @property
    def manifest_key(self) -> str:
        return join_key(self.prefix, MANIFEST_NAME)

    @property
    def manifest_ref(self) -> ManifestRef:
        """Key, SHA-256 and size of the committed ``manifest.json``."""
        if self._manifest_ref is None:
            raise ArchiveStateError("the archive is not committed yet", prefix=self.prefix)
        return self._manifest_ref

    @property
    def committed(self) -> bool:
        return self._manifest is not None

    @property
    def records_written(self) -> int:
        return sum(self._record_counts.values())

    @property
    def buffered_bytes(self) -> int:
        """Bytes this writer holds for the open shard: encoded Parquet so far plus the payloads
        of the row groups not yet encoded. Never more than ``target_shard_bytes`` plus one record
        (plus Parquet overhead of one row group); a shard awaiting its upload is not counted.

        A shard is closed when its *uncompressed* payload reaches ``target_shard_bytes`` (or its
        buffered bytes do, for key-heavy records), so stored shards are about target / compression
        ratio and the writer's peak memory stays a small multiple of that."""
        return self._encoded_bytes + self._inflight_bytes + self._rg_payload_bytes

    # -- writing ----------------------------------------------------------------------------
    def write(self, record: Record) -> None:
        """Append one record (already validated by pydantic, so nothing is checked again)."""
        self._append(
            record.kind,
            record.rollout_id,
            record.attempt,
            record.record_key,
            record.schema_version,
            record.index_revision(),
            encode_refs(record.index_refs()),
            record.to_payload(),
        )

    def write_raw(
        self,
        kind: str,
        rollout_id: str,
        attempt: int,
        key: str,
        payload: bytes | bytearray | memoryview,
        revision: int | None = None,
        refs: Mapping[str, Any] | None = None,
        *,
        schema_version: int = RECORD_SCHEMA_VERSION,
    ) -> None:
        """Append a pre-serialised member (bulk writers): ids are checked (cached), the payload
        is stored as given. ``refs`` is what ``Record.index_refs()`` would return."""
        valid = self._valid_ids
        if kind not in valid or rollout_id not in valid:
            if len(valid) > _ID_CACHE_LIMIT:
                valid.clear()
            valid.add(validate_id(kind, "record kind"))
            valid.add(validate_id(rollout_id, "rollout_id"))
        if type(attempt) is not int or attempt < 0:
            raise InvalidRecordError(f"attempt must be a non-negative int, got {attempt!r}", attempt=attempt)
        if type(key) is not str or not key or len(key) > _MAX_MEMBER_KEY:
            raise InvalidRecordError(
                f"member key must be a non-empty string of at most {_MAX_MEMBER_KEY} characters", key=key
            )
        if not isinstance(payload, bytes):
            if isinstance(payload, bytearray | memoryview):
                payload = bytes(payload)
            else:
                raise InvalidRecordError(f"payload must be bytes, got {type(payload).__name__}")
        if revision is not None and type(revision) is not int:
            raise InvalidRecordError(f"revision must be an int or None, got {revision!r}")
        if type(schema_version) is not int or schema_version < 1:
            raise InvalidRecordError(f"schema_version must be a positive int, got {schema_version!r}")
        self._append(
            kind,
            rollout_id,
            attempt,
            key,
            schema_version,
            revision,
            None if refs is None else encode_refs(refs),
            payload,
        )

    def _append(
        self,
        kind: str,
        rollout_id: str,
        attempt: int,
        key: str,
        schema_version: int,
        revision: int | None,
        refs: str | None,
        payload: bytes,
    ) -> None:
        if self._manifest is not None or self._aborted or self._broken is not None:
            self._refuse()
        ident = (kind, rollout_id, attempt, key)
        h = hash(ident)
        if h in self._seen and self._is_duplicate(ident):
            raise InvalidRecordError(
                f"duplicate member {kind}/{rollout_id}#{attempt}/{key} in archive {self.prefix!r}",
                kind=kind,
                rollout_id=rollout_id,
                attempt=attempt,
                key=key,
            )
        if self._pending is not None:
            self._upload_pending()
        self._seen.add(h)
        self._kinds.append(kind)
        self._rollout_ids.append(rollout_id)
        self._attempts.append(attempt)
        self._keys.append(key)
        self._schema_versions.append(schema_version)
        self._revisions.append(revision)
        self._refs.append(refs)
        self._payloads.append(payload)
        self._rg_payload_bytes += len(payload)
        self._record_counts[kind] = self._record_counts.get(kind, 0) + 1
        if len(self._payloads) >= self.row_group_rows or self._rg_payload_bytes >= self.row_group_bytes:
            self._flush_row_group()
        self._shard_payload_bytes += len(payload)
        if (
            self._shard_payload_bytes >= self.target_shard_bytes
            or self._encoded_bytes + self._inflight_bytes + self._rg_payload_bytes >= self.target_shard_bytes
        ):
            # uploaded by the next write (before it appends) or by commit: a write that raises
            # a store error has therefore never taken its record
            self._finish_shard()

    def _refuse(self) -> None:
        state = "committed" if self._manifest else "aborted" if self._aborted else "broken"
        raise ArchiveStateError(f"archive {self.prefix!r} is {state}; no more writes", prefix=self.prefix)

    def _is_duplicate(self, ident: tuple[str, str, int, str]) -> bool:
        """Exact check behind the hash set (runs only on a hash hit: a duplicate or a collision)."""
        kind, rollout_id, attempt, key = ident
        self._sync()
        for i, k in enumerate(self._keys):
            if (
                k == key
                and self._kinds[i] == kind
                and self._rollout_ids[i] == rollout_id
                and self._attempts[i] == attempt
            ):
                return True
        for table in self._shard_row_groups:
            if _table_contains(table, ident):
                return True
        if self._pending is not None and any(_table_contains(t, ident) for t in self._pending.row_groups):
            return True
        return self._index.contains(kind, rollout_id, attempt, key)

    def _take_row_group(self) -> list[list[Any]]:
        """Hand the open row group's column lists over (fresh lists replace them)."""
        cols: list[list[Any]] = [
            self._kinds,
            self._rollout_ids,
            self._attempts,
            self._keys,
            self._schema_versions,
            self._revisions,
            self._refs,
            self._payloads,
        ]
        self._kinds, self._rollout_ids, self._attempts, self._keys = [], [], [], []
        self._schema_versions, self._revisions, self._refs, self._payloads = [], [], [], []
        return cols

    def _flush_row_group(self) -> None:
        """Encode the open row group on the encoder thread (one in flight at most).

        Building Arrow arrays and zstd-encoding releases the GIL for most of its time, so the
        caller keeps appending records on one core while the row group is encoded on another.
        """
        if not self._payloads:
            return
        self._sync()
        cols = self._take_row_group()
        self._inflight_bytes = self._rg_payload_bytes
        self._rg_payload_bytes = 0
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-encoder")
        self._job = self._encoder.submit(self._encode_row_group, cols)

    def _sync(self) -> None:
        """Wait for the row group being encoded; an encoding failure breaks the writer."""
        job = self._job
        if job is None:
            return
        self._job = None
        self._inflight_bytes = 0
        try:
            job.result()
        except BaseException as exc:
            self._broken = exc
            raise ArchiveStateError(f"encoding a row group failed: {exc!r}", prefix=self.prefix) from exc

    def _encode_row_group(self, cols: list[list[Any]]) -> None:
        """Runs on the encoder thread: column lists -> Arrow -> one Parquet row group."""
        n = len(cols[0])
        table = pa.Table.from_arrays(
            [pa.array(col, typ) for col, typ in zip(cols, _SHARD_TYPES, strict=True)], schema=SHARD_SCHEMA
        )
        if self._pq is None:
            self._sink = pa.BufferOutputStream()
            self._pq = pq.ParquetWriter(
                self._sink,
                SHARD_SCHEMA,
                compression="zstd",
                compression_level=self.zstd_level,
                use_dictionary=SHARD_DICTIONARY_COLUMNS,
                write_statistics=SHARD_STATISTICS_COLUMNS,
                write_page_index=False,
            )
        self._pq.write_table(table, row_group_size=n)
        # keep only the (small) member columns for the index; the payload buffers are freed
        self._shard_row_groups.append(table.select(INDEX_MEMBER_COLUMNS))
        self._encoded_bytes = int(self._sink.tell()) if self._sink is not None else 0

    def _finish_shard(self) -> None:
        """Close the open shard into an in-memory object awaiting upload (``_pending``)."""
        self._flush_row_group()
        self._sync()
        if self._pq is None or self._sink is None:
            return
        if self._pending is not None:
            raise AssertionError("a shard is still waiting for upload")
        self._pq.close()
        data = self._sink.getvalue().to_pybytes()
        self._pq = None
        self._sink = None
        self._encoded_bytes = 0
        self._shard_payload_bytes = 0
        footer_len = int.from_bytes(data[-8:-4], "little")
        footer_offset = len(data) - 8 - footer_len
        footer = data[footer_offset : footer_offset + footer_len]
        metadata = pq.read_metadata(pa.BufferReader(data))
        view = memoryview(data)
        spans = [
            RowGroupSpan(offset, length, hashlib.sha256(view[offset : offset + length]).hexdigest())
            for offset, length in row_group_spans(metadata)
        ]
        entry = ShardEntry(
            key=shard_name(self.writer_id, self._seq),
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            records=int(metadata.num_rows),
            row_groups=int(metadata.num_row_groups),
            footer_offset=footer_offset,
            footer_bytes=footer_len,
        )
        self._seq += 1
        self._pending = _EncodedShard(entry, data, self._shard_row_groups, spans, footer)
        self._shard_row_groups = []

    def _upload_pending(self) -> None:
        """Upload the encoded shard; on failure it stays pending and the next call retries it."""
        pending = self._pending
        if pending is None:
            return
        self.store.put(join_key(self.prefix, pending.entry.key), pending.data)
        self._shards.append(pending.entry)
        self._index.add_shard(pending.row_groups, pending.spans, pending.footer)
        self._pending = None

    # -- committing -------------------------------------------------------------------------
    def commit(self, extra: Mapping[str, JsonValue] | None = None) -> ComponentManifest:
        """Upload the last shard and the index, then create ``manifest.json`` (create-only).

        Idempotent: calling it again (also after a failure half way) finishes or returns the
        same manifest. A different manifest already at the key raises ``ManifestConflictError``.
        """
        extra_dict: dict[str, JsonValue] = dict(extra or {})
        if self._manifest is not None:
            if extra is not None and extra_dict != self._manifest.extra:
                raise ManifestConflictError(
                    f"{self.manifest_key} was already committed with a different extra",
                    key=self.manifest_key,
                )
            return self._manifest
        if self._aborted or self._broken is not None:
            self._refuse()
        self._finish_shard()
        self._upload_pending()
        if self._index_blob is None:
            self._index_blob = (index_name(self.writer_id), self._index.to_bytes(self.zstd_level))
        name, blob = self._index_blob
        self.store.put(join_key(self.prefix, name), blob)
        if self._candidate is None or self._candidate[0] != extra_dict:
            manifest = ComponentManifest(
                checkpoint_id=self.checkpoint_id,
                participant_kind=self.participant_kind,
                instance=self.instance,
                writer_id=self.writer_id,
                created_at=self._created_at,
                shards=list(self._shards),
                index=IndexEntry(
                    key=name, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(), rows=self._index.rows
                ),
                record_counts=dict(sorted(self._record_counts.items())),
                extra=extra_dict,
            )
            self._candidate = (extra_dict, manifest, manifest_to_bytes(manifest))
        _, manifest, data = self._candidate
        try:
            self.store.put_if_absent(self.manifest_key, data)
        except ObjectExistsError:
            raise ManifestConflictError(
                f"{self.manifest_key} already holds a different manifest (another writer committed here)",
                key=self.manifest_key,
            ) from None
        self._manifest = manifest
        self._manifest_ref = ManifestRef.of(self.manifest_key, data)
        self._shutdown()
        self._seen = set()
        self._valid_ids = set()
        return manifest

    def abort(self) -> None:
        """Drop buffered data; no manifest is written (uploaded shards become garbage)."""
        if self._manifest is not None:
            return
        self._aborted = True
        with contextlib.suppress(ArchiveStateError):
            self._sync()
        self._shutdown()
        if self._pq is not None:
            self._pq.close()
        self._pq = None
        self._sink = None
        self._encoded_bytes = 0
        self._pending = None
        self._shard_row_groups = []
        for buf in (self._kinds, self._rollout_ids, self._keys, self._payloads):
            buf.clear()
        self._rg_payload_bytes = 0

    def _shutdown(self) -> None:
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif self._manifest is None and not self._aborted:
            self.commit()

    def __repr__(self) -> str:
        return f"ArchiveWriter({self.store!r}, {self.prefix!r}, writer_id={self.writer_id!r})"


def _table_contains(table: pa.Table, ident: tuple[str, str, int, str]) -> bool:
    kind, rollout_id, attempt, key = ident
    for i, k in enumerate(table["key"].to_pylist()):
        if (
            k == key
            and table["kind"][i].as_py() == kind
            and table["rollout_id"][i].as_py() == rollout_id
            and table["attempt"][i].as_py() == attempt
        ):
            return True
    return False
