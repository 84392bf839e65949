"""The shard writer: streams records into zstd Parquet shards, then commits index and manifest.

Why it looks like this (measured in archive-perf-notes.md):

* Records are buffered as plain column lists and turned into Arrow arrays once per row group,
  so the per-record cost is a handful of list appends (no per-record pydantic validation for
  ``write_raw``, no per-record Arrow calls).
* Each row group is encoded (on a background thread) as soon as it is full and goes straight
  out through SHA-256 (``_shard.ShardStream``). On stores with a streaming writer (local disk,
  S3, other fsspec stores: ``stream_shards``) it goes to the shard object itself, so the writer
  holds about two row groups whatever the shard size; elsewhere (memory stores, or
  ``stream_shards=False``) into an in-memory shard uploaded with one ``put``, which a failed
  upload can retry. Either way only the manifest, written last with ``put_if_absent``, makes a
  shard part of the checkpoint; shards of an aborted writer are unreferenced garbage for
  retention to collect.
* ``write_columns`` / ``write_records`` append whole batches (the columnar path, ``_bulk``): one
  check per batch, list ``extend``s, JSON by orjson; no per-record model or Arrow call.
* The member index is one object, streamed (``ObjectStore.open_write``) while the shards are
  written: each encoded row group's index rows go straight into it, so no per-member state piles
  up, nor per shard: the writer's memory does not grow with the shard size. What stays for the
  whole archive is one 64-bit hash per member (8 bytes, for the duplicate check at commit) and,
  per shard, its row-group spans and Parquet footer.
* Duplicate members: ``write`` refuses at once a duplicate of a member of the open row group;
  any other duplicate is found at :meth:`ArchiveWriter.commit` (sorted hashes, then an exact
  comparison of the colliding members read back from the index), which then raises
  ``InvalidRecordError`` and writes no manifest.
"""

from __future__ import annotations

import contextlib
import io
import sys
import uuid
from array import array
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pyarrow as pa
from pydantic import JsonValue

from ..errors import InvalidRecordError, ManifestConflictError, ObjectExistsError
from ..ids import validate_id, validate_key
from ..records import RECORD_SCHEMA_VERSION, Record
from ..store import DelegatingStore, LocalStore, ObjectStore
from ._bulk import ID_CACHE_LIMIT, MAX_MEMBER_KEY, Batch, Field, check_batch, encode_records, encode_refs
from ._errors import ArchiveStateError
from ._index import RowGroupSpan
from ._index_stream import IndexStream, colliding_positions
from ._manifest import (
    ComponentManifest,
    IndexEntry,
    ManifestRef,
    ShardEntry,
    manifest_to_bytes,
    utc_now_iso,
)
from ._rowgroup import OpenRowGroup
from ._schema import (
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_SHARD_BYTES,
    DEFAULT_ZSTD_LEVEL,
    INDEX_MEMBER_COLUMNS,
    MANIFEST_NAME,
    SHARD_SCHEMA,
    index_name,
    join_key,
    shard_name,
)
from ._shard import ClosedShard, ShardStream, encoding_pool

__all__ = ["ArchiveWriter"]

_SHARD_TYPES = [field.type for field in SHARD_SCHEMA]
_MAX_MEMBER_KEY = MAX_MEMBER_KEY
_ID_CACHE_LIMIT = ID_CACHE_LIMIT


@dataclass
class _EncodedShard:
    """A shard serialised in memory, waiting for (or retrying) its upload."""

    entry: ShardEntry
    data: bytes
    spans: list[RowGroupSpan]
    footer: bytes


def streams_natively(store: ObjectStore) -> bool:
    """Whether ``store`` (behind any wrappers) has a streaming ``open_write``: local disk and
    fsspec stores such as S3 do; memory stores only buffer, so a ``put`` per shard is as cheap
    there and keeps a failed upload retryable."""
    while isinstance(store, DelegatingStore):
        store = store.inner
    if isinstance(store, LocalStore):
        return True
    # not imported means no fsspec store exists (fsspec is loaded only when one is opened)
    fs_module = sys.modules.get(f"{ObjectStore.__module__.rpartition('.')[0]}._fsspec")
    if fs_module is None:
        return False
    return isinstance(store, fs_module.FsspecStore) and not isinstance(store, fs_module.MemoryStore)


class ArchiveWriter:
    """Write one component archive under ``prefix`` of ``store``; not thread-safe.

    ``write``/``write_raw`` append members, ``write_columns``/``write_records`` whole batches;
    :meth:`commit` uploads the last shard and the member index, then creates ``manifest.json``
    (create-only). As a context manager an exception aborts (no manifest: the archive does not
    exist for readers) and a clean exit commits if :meth:`commit` was not called.

    ``stream_shards`` (default: whether the store streams natively, see :func:`streams_natively`)
    streams each shard into its object as it is encoded, so memory stays at about two row groups;
    a store error while streaming then breaks the writer (``ArchiveStateError``: abort and write
    the archive again). Without it a shard is encoded in memory and uploaded with one ``put``; a
    failed upload is retried by the next write or commit.
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
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        zstd_level: int = DEFAULT_ZSTD_LEVEL,
        stream_shards: bool | None = None,
    ) -> None:
        if target_shard_bytes < 1:
            raise ValueError("target_shard_bytes must be positive")
        if row_group_rows < 1 or row_group_bytes < 1:
            raise ValueError("row_group_rows and row_group_bytes must be positive")
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
        # Row groups are also cut by bytes (never above a quarter shard), so a few huge records
        # cannot make one row group (the unit a lookup downloads, and what the writer holds
        # while encoding) large.
        self.row_group_bytes = max(1, min(row_group_bytes, target_shard_bytes // 4))
        self.zstd_level = zstd_level
        self.stream_shards = streams_natively(store) if stream_shards is None else bool(stream_shards)
        self.writer_id = uuid.uuid4().hex

        # the open row group, as column lists
        self._rg = OpenRowGroup()
        self._encoded_bytes = 0  # size of the open shard's Parquet stream (changes per row group)
        self._inflight_bytes = 0  # payload bytes of the row group on the encoder thread
        self._shard_payload_bytes = 0  # uncompressed payload bytes of the open shard
        self._encoder: ThreadPoolExecutor | None = None
        self._job: Future[None] | None = None
        self._broken: BaseException | None = None

        # the open shard: its encoder and where its bytes go (a store stream or a buffer)
        self._shard: ShardStream | None = None
        self._shard_key = ""
        self._shard_stack: contextlib.ExitStack | None = None
        self._shard_buffer: io.BytesIO | None = None
        self._pending: _EncodedShard | None = None

        self._seq = 0
        self._shards: list[ShardEntry] = []
        # per uploaded shard (not per member): row-group spans and the raw Parquet footer
        self._shard_meta: list[tuple[list[RowGroupSpan], bytes]] = []
        self._record_counts: dict[str, int] = {}
        # one 64-bit hash per member, in write order (= index row order): the duplicate check
        self._hashes: array[int] = array("q")
        self._valid_ids: set[str] = set()
        # the member index, streamed into one store object as row groups are encoded
        self._index = IndexStream(store, join_key(prefix, index_name(self.writer_id)), zstd_level)
        self._index_entry: IndexEntry | None = None
        self._sealed = False  # commit has started: no more writes
        self._duplicates_checked = False
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
        ratio and the writer's peak memory stays a small multiple of that. A streamed shard's
        encoded bytes are already on the store, so only the row groups count."""
        held = 0 if self.stream_shards else self._encoded_bytes
        return held + self._inflight_bytes + self._rg.payload_bytes

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

    def write_columns(
        self,
        kind: str,
        rollout_ids: Sequence[str],
        attempts: Sequence[int],
        keys: Sequence[str],
        payloads: Sequence[bytes | bytearray | memoryview],
        *,
        revisions: Sequence[int | None] | None = None,
        refs: Sequence[Mapping[str, Any] | None] | None = None,
        schema_version: int = RECORD_SCHEMA_VERSION,
    ) -> None:
        """Append a batch of pre-serialised members of one ``kind``, one column per field (the
        columnar path: one check per batch, no per-record model or Arrow call).

        Same meaning as :meth:`write_raw` per member; ``refs[i]`` is what
        ``Record.index_refs()`` would return. The batch is checked whole before any of it is
        taken: a bad value or a duplicate within the batch raises ``InvalidRecordError`` and
        appends nothing. A duplicate of an earlier member is refused at :meth:`commit`, as for
        :meth:`write`.
        """
        if self._sealed or self._aborted or self._broken is not None:
            self._refuse()
        if type(schema_version) is not int or schema_version < 1:
            raise InvalidRecordError(f"schema_version must be a positive int, got {schema_version!r}")
        batch = check_batch(kind, rollout_ids, attempts, keys, payloads, revisions, refs)
        if not batch:
            return
        if not self._rg.seen.isdisjoint(batch.hashes):
            for ident in zip([kind] * len(batch), batch.rollout_ids, batch.attempts, batch.keys, strict=True):
                if self._rg.contains(ident):
                    raise self._duplicate_error(ident)
        if self._pending is not None:
            self._upload_pending()
        self._extend(batch, schema_version)

    def write_records(
        self,
        kind: str,
        records: Sequence[Mapping[str, Any]],
        *,
        key: Field,
        revision: Field | None = None,
        refs: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
        schema_version: int = RECORD_SCHEMA_VERSION,
    ) -> None:
        """Append a batch of JSON-shaped records of one ``kind`` (``Record.model_dump(mode="json")``
        dicts, or anything of that shape): each payload is ``orjson.dumps(record)``.

        ``rollout_id`` and ``attempt`` come from the records' fields of those names; ``key``
        and ``revision`` are a field name or a function of the record (``Record.record_key``,
        ``Record.index_revision()``), ``refs`` a function (``Record.index_refs()``). Payloads
        are not validated against the record model: readers decode them with it, so the caller
        must write the model's JSON shape (use :meth:`write` for models).
        """
        columns = encode_records(records, key, revision, refs)
        rollout_ids, attempts, keys, payloads, revisions, refs_list = columns
        self.write_columns(
            kind,
            rollout_ids,
            attempts,
            keys,
            payloads,
            revisions=revisions,
            refs=refs_list,
            schema_version=schema_version,
        )

    def _extend(self, batch: Batch, schema_version: int) -> None:
        """Append a checked batch, cutting row groups and shards where ``_append`` would."""
        n = len(batch)
        start = 0
        self._hashes.extend(batch.hashes)
        self._record_counts[batch.kind] = self._record_counts.get(batch.kind, 0) + n
        lengths = batch.lengths
        while start < n:
            end = min(n, start + self.row_group_rows - len(self._rg))
            room = self.row_group_bytes - self._rg.payload_bytes
            shard_room = self.target_shard_bytes - self._shard_payload_bytes
            chunk = sum(lengths[start:end])
            if chunk >= room or chunk >= shard_room:
                # cut after the record that reaches a byte limit (as _append does)
                acc = 0
                for i in range(start, end):
                    acc += lengths[i]
                    if acc >= room or acc >= shard_room:
                        end = i + 1
                        break
                chunk = acc
            self._rg.extend(batch, start, end, schema_version, chunk)
            self._shard_payload_bytes += chunk
            start = end
            if len(self._rg) >= self.row_group_rows or self._rg.payload_bytes >= self.row_group_bytes:
                self._flush_row_group()
            if (
                self._shard_payload_bytes >= self.target_shard_bytes
                or self._encoded_bytes + self._inflight_bytes + self._rg.payload_bytes
                >= self.target_shard_bytes
            ):
                self._finish_shard()
                if start < n and self._pending is not None:
                    self._upload_pending()

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
        if self._sealed or self._aborted or self._broken is not None:
            self._refuse()
        ident = (kind, rollout_id, attempt, key)
        h = hash(ident)
        if h in self._rg.seen and self._rg.contains(ident):
            raise self._duplicate_error(ident)
        if self._pending is not None:
            self._upload_pending()
        self._hashes.append(h)
        self._rg.append(ident, h, schema_version, revision, refs, payload)
        self._record_counts[kind] = self._record_counts.get(kind, 0) + 1
        if len(self._rg) >= self.row_group_rows or self._rg.payload_bytes >= self.row_group_bytes:
            self._flush_row_group()
        self._shard_payload_bytes += len(payload)
        if (
            self._shard_payload_bytes >= self.target_shard_bytes
            or self._encoded_bytes + self._inflight_bytes + self._rg.payload_bytes >= self.target_shard_bytes
        ):
            # uploaded by the next write (before it appends) or by commit: a write that raises
            # a store error has therefore never taken its record
            self._finish_shard()

    def _refuse(self) -> None:
        state = (
            "committed"
            if self._manifest
            else "aborted"
            if self._aborted
            else "broken"
            if self._broken is not None
            else "being committed"
        )
        raise ArchiveStateError(f"archive {self.prefix!r} is {state}; no more writes", prefix=self.prefix)

    def _duplicate_error(self, ident: tuple[str, str, int, str]) -> InvalidRecordError:
        kind, rollout_id, attempt, key = ident
        return InvalidRecordError(
            f"duplicate member {kind}/{rollout_id}#{attempt}/{key} in archive {self.prefix!r}",
            kind=kind,
            rollout_id=rollout_id,
            attempt=attempt,
            key=key,
        )

    def _flush_row_group(self) -> None:
        """Build the open row group's Arrow columns (here: that needs the GIL) and encode them on
        the encoder thread (one in flight at most), which runs Parquet encoding and zstd without
        the GIL while the caller keeps appending records; it also frees the row group's Python
        objects and streams its index rows (see :meth:`_encode_job`)."""
        if not self._rg:
            return
        rg, self._rg = self._rg, OpenRowGroup()
        cols, rg_bytes = rg.columns(), rg.payload_bytes
        del rg  # the column lists live on in ``cols`` only: the encoder job frees them
        pool = encoding_pool()
        try:
            table = pa.Table.from_arrays(
                [pa.array(col, typ, memory_pool=pool) for col, typ in zip(cols, _SHARD_TYPES, strict=True)],
                schema=SHARD_SCHEMA,
            )
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            self._broken = exc
            raise ArchiveStateError(f"encoding a row group failed: {exc!r}", prefix=self.prefix) from exc
        self._sync()
        shard = self._shard
        if shard is None:
            try:
                shard = self._open_shard()
            except BaseException as exc:  # the row group's records are taken: the writer is broken
                self._broken = exc
                raise ArchiveStateError(
                    f"opening a shard of {self.prefix!r} failed: {exc!r}; abort and write the archive again",
                    prefix=self.prefix,
                ) from exc
        self._inflight_bytes = rg_bytes
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-encoder")
        self._job = self._encoder.submit(self._encode_job, shard, self._seq - 1, table, cols)
        del cols, table  # the job holds them now (and frees them)

    def _sync(self) -> None:
        """Wait for the row group being encoded, then hand its bytes to the shard's sink (hash,
        store stream) here on the caller's thread, so that the encoder thread's ``write_table``
        never calls into Python. An encoding or store failure breaks the writer."""
        job = self._job
        if job is None:
            return
        self._job = None
        self._inflight_bytes = 0
        shard = self._shard
        try:
            job.result()
            if shard is None:
                raise AssertionError("a row group was encoded with no open shard")
            shard.finish_row_group()
        except BaseException as exc:
            self._broken = exc
            raise ArchiveStateError(f"encoding a row group failed: {exc!r}", prefix=self.prefix) from exc
        self._encoded_bytes = shard.bytes

    def _encode_job(self, shard: ShardStream, seq: int, table: pa.Table, cols: list[list[Any]]) -> None:
        """The encoder thread's work for one row group. It starts holding the GIL anyway, so it
        first frees the records' Python objects (off the caller's thread), then encodes (no GIL),
        then streams the row group's index rows (the shard's position in the manifest is its
        sequence number), so the writer keeps nothing per member of the shard until its upload."""
        cols.clear()
        offset, length = shard.encode_row_group(table)
        self._index.add(seq, shard.encoded_row_groups - 1, table.select(INDEX_MEMBER_COLUMNS), offset, length)

    def _open_shard(self) -> ShardStream:
        """Start the next shard: a stream into its store object, or an in-memory buffer."""
        key = shard_name(self.writer_id, self._seq)
        self._seq += 1
        sink: Any
        if self.stream_shards:
            stack = contextlib.ExitStack()
            sink = stack.enter_context(self.store.open_write(join_key(self.prefix, key)))
            self._shard_stack = stack
        else:
            sink = self._shard_buffer = io.BytesIO()
        self._shard_key = key
        self._shard = ShardStream(sink, self.zstd_level)
        return self._shard

    def _discard_shard(self, exc: BaseException) -> None:
        """Drop the open shard; a streamed one is discarded by its store stream."""
        shard, stack = self._shard, self._shard_stack
        self._shard = None
        self._shard_stack = None
        self._shard_buffer = None
        self._encoded_bytes = 0
        if shard is not None:
            shard.abandon()
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.__exit__(type(exc), exc, exc.__traceback__)

    def _finish_shard(self) -> None:
        """Close the open shard: a streamed one is finished on the store now (and recorded); a
        buffered one becomes ``_pending``, uploaded by the next write or by commit."""
        self._flush_row_group()
        self._sync()
        shard = self._shard
        if shard is None:
            return
        if self._pending is not None:
            raise AssertionError("a shard is still waiting for upload")
        try:
            closed = shard.close()
            if self._shard_stack is not None:
                self._shard_stack.close()  # local disk: fsync + rename; S3: the upload completes
                self._shard_stack = None
        except BaseException as exc:
            self._broken = exc
            self._discard_shard(exc)
            raise ArchiveStateError(
                f"writing shard {self._shard_key} of {self.prefix!r} failed: {exc!r}; "
                "abort and write the archive again",
                prefix=self.prefix,
            ) from exc
        entry = ShardEntry(
            key=self._shard_key,
            bytes=closed.size,
            sha256=closed.sha256,
            records=closed.records,
            row_groups=len(closed.spans),
            footer_offset=closed.footer_offset,
            footer_bytes=len(closed.footer),
        )
        buffer = self._shard_buffer
        self._shard = None
        self._shard_buffer = None
        self._encoded_bytes = 0
        self._shard_payload_bytes = 0
        if buffer is None:
            self._shard_uploaded(entry, closed)
        else:
            data = buffer.getvalue()
            buffer.close()
            self._pending = _EncodedShard(entry, data, closed.spans, closed.footer)

    def _shard_uploaded(self, entry: ShardEntry, shard: ClosedShard | _EncodedShard) -> None:
        self._shards.append(entry)
        self._shard_meta.append((shard.spans, shard.footer))

    def _upload_pending(self) -> None:
        """Upload the encoded shard; on failure it stays pending and the next call retries it."""
        pending = self._pending
        if pending is None:
            return
        self.store.put(join_key(self.prefix, pending.entry.key), pending.data)
        self._pending = None
        self._shard_uploaded(pending.entry, pending)

    # -- the member index (one streamed object, see _index_stream) ---------------------------
    def _close_index(self) -> IndexEntry:
        """Finish the index object; its length and digest go into the manifest."""
        size, digest, rows = self._index.close(
            [join_key(self.prefix, entry.key) for entry in self._shards],
            [spans for spans, _ in self._shard_meta],
            [footer for _, footer in self._shard_meta],
        )
        return IndexEntry(key=index_name(self.writer_id), bytes=size, sha256=digest, rows=rows)

    def _check_duplicates(self) -> None:
        """Commit-time duplicate check: sort the member hashes; only members whose hashes collide
        are compared exactly, by reading their identities back from the (closed) index."""
        if self._duplicates_checked:
            return
        positions = colliding_positions(self._hashes)
        if positions:
            ident = self._index.first_duplicate(positions)
            if ident is not None:
                exc = self._duplicate_error(ident)
                self._broken = exc
                raise exc
        self._duplicates_checked = True

    # -- committing -------------------------------------------------------------------------
    def commit(self, extra: Mapping[str, JsonValue] | None = None) -> ComponentManifest:
        """Upload the last shard and the index, then create ``manifest.json`` (create-only).

        Idempotent: calling it again (also after a failure half way) finishes or returns the
        same manifest. A different manifest already at the key raises ``ManifestConflictError``.
        A duplicate member that ``write`` could not refuse (its first copy was no longer in the
        open row group) raises ``InvalidRecordError`` here, and no manifest is ever written.
        Once commit has started, further writes are refused.
        """
        extra_dict: dict[str, JsonValue] = dict(extra or {})
        if self._manifest is not None:
            if extra is not None and extra_dict != self._manifest.extra:
                raise ManifestConflictError(
                    f"{self.manifest_key} was already committed with a different extra",
                    key=self.manifest_key,
                )
            return self._manifest
        if isinstance(self._broken, InvalidRecordError):
            raise self._broken  # a duplicate member found by an earlier commit
        if self._aborted or self._broken is not None:
            self._refuse()
        self._sealed = True
        self._finish_shard()
        self._upload_pending()
        if self._index_entry is None:
            self._index_entry = self._close_index()
        self._check_duplicates()
        if self._candidate is None or self._candidate[0] != extra_dict:
            manifest = ComponentManifest(
                checkpoint_id=self.checkpoint_id,
                participant_kind=self.participant_kind,
                instance=self.instance,
                writer_id=self.writer_id,
                created_at=self._created_at,
                shards=list(self._shards),
                index=self._index_entry,
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
        self._hashes = array("q")
        self._shard_meta = []
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
        self._discard_shard(ArchiveStateError("aborted", prefix=self.prefix))
        self._pending = None
        self._rg = OpenRowGroup()
        self._index.drop(ArchiveStateError("aborted", prefix=self.prefix))
        self._hashes = array("q")
        self._shard_meta = []

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
