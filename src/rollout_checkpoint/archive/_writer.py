"""The shard writer: streams records into zstd Parquet shards, then commits index and manifest.

Why it looks like this (measured in docs/benchmarks.md, ``peer_store.py``):

* Batches (``write_columns`` / ``write_records``, ``_bulk``) are checked once per batch and
  become Arrow record batches at once (``_rowgroup``: payloads packed into one buffer, no
  per-member Python object or Arrow call); single members (``write`` / ``write_raw``) are
  appended to column lists, converted once per row group.
* Each full row group goes to ``_shards.ShardRotation``, which encodes it on its encoder thread
  straight out through SHA-256 into the shard object, so the writer's memory does not grow with
  the shard size. Only the manifest, written last with ``put_if_absent``, makes a shard part of
  the checkpoint; shards of an aborted writer are garbage for retention to collect.
* The member index is streamed into one object row group by row group; what stays for the whole
  archive is one 64-bit hash per member (the duplicate check at commit) and, per shard, its
  row-group spans and Parquet footer.
* Duplicates: ``write`` refuses at once a duplicate of a member of the open row group; any other
  is found at :meth:`ArchiveWriter.commit` (sorted hashes, then an exact comparison of the
  colliding members read back from the index), which then writes no manifest.
* Nothing here imports pydantic, ``pyarrow.parquet`` or Arrow's compute kernels: their imports
  count in the writer's resident memory. The manifest models are imported at commit.
"""

from __future__ import annotations

import contextlib
import uuid
from array import array
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import InvalidRecordError, ManifestConflictError, ObjectExistsError
from ..ids import validate_id, validate_key
from ..store import ObjectStore
from ._bulk import Batch, Field, check_batch, check_member, duplicate_error, encode_records, encode_refs
from ._errors import ArchiveStateError
from ._index_stream import IndexStream, colliding_positions
from ._member import ArchiveMember
from ._rowgroup import OpenRowGroup
from ._schema import (
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_SHARD_BYTES,
    DEFAULT_ZSTD_LEVEL,
    MANIFEST_NAME,
    RECORD_SCHEMA_VERSION,
    index_name,
    join_key,
    utc_now_iso,
)
from ._shard import encoding_pool
from ._shards import ShardRotation, streams_natively

if TYPE_CHECKING:
    from pydantic import JsonValue

    from ._manifest import ComponentManifest, ManifestRef, ReferencesEntry

__all__ = ["ArchiveWriter", "streams_natively"]


class ArchiveWriter:
    """Write one component archive under ``prefix`` of ``store``; not thread-safe.

    ``write``/``write_raw`` append members, ``write_columns``/``write_records`` whole batches;
    :meth:`commit` uploads the last shard and the member index, then creates ``manifest.json``
    (create-only). As a context manager an exception aborts (no manifest: the archive does not
    exist for readers) and a clean exit commits if :meth:`commit` was not called.

    ``stream_shards`` (default: whether the store streams natively, see :func:`streams_natively`)
    streams each shard into its object as it is encoded, so memory stays at about three row groups;
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
        # cannot make one row group (the unit a lookup downloads, and the writer holds) large.
        self.row_group_bytes = max(1, min(row_group_bytes, target_shard_bytes // 4))
        self.zstd_level = zstd_level
        self.stream_shards = streams_natively(store) if stream_shards is None else bool(stream_shards)
        self.writer_id = uuid.uuid4().hex

        # the open row group (Arrow parts and a tail of single members)
        self._pool = encoding_pool()
        self._rg = OpenRowGroup(self._pool)
        self._shard_payload_bytes = 0  # uncompressed payload bytes of the open shard
        self._broken: BaseException | None = None
        # the member index, streamed into one store object as row groups are encoded
        self._index = IndexStream(store, join_key(prefix, index_name(self.writer_id)), zstd_level)
        # the open shard, its encoder thread, and the shards closed so far
        self._shards = ShardRotation(
            store, prefix, self.writer_id, zstd_level, self.stream_shards, self._index
        )
        self._record_counts: dict[str, int] = {}
        # one 64-bit hash per member, in write order (= index row order): the duplicate check
        self._hashes: array[int] = array("q")
        self._valid_ids: set[str] = set()
        self._index_entry: tuple[int, str, int] | None = None
        self._sealed = False  # commit has started: no more writes
        self._duplicates_checked = False
        self._candidate: tuple[dict[str, JsonValue], ComponentManifest, bytes] | None = None
        self._manifest: ComponentManifest | None = None
        self._manifest_ref: ManifestRef | None = None
        self._aborted = False
        self._created_at = utc_now_iso()
        self._refer: tuple[list[tuple[str, ManifestRef]], list[Any]] | None = None
        self._references_entry: ReferencesEntry | None = None

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
        encoded bytes go on to the store (at most a MiB waits), so only the row groups count."""
        shards = self._shards
        held = 0 if self.stream_shards else shards.encoded_bytes
        return held + shards.inflight_bytes + self._rg.payload_bytes

    # -- writing ----------------------------------------------------------------------------
    def write(self, record: ArchiveMember) -> None:
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
        payload = check_member(
            self._valid_ids, kind, rollout_id, attempt, key, payload, revision, schema_version
        )
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
        if self._sealed or self._aborted or self._failure() is not None:
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
        if self._shards.pending is not None:
            self._shards.upload_pending()
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
        columns = encode_records(records, key, revision, refs, self._shards.pulse)
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
            try:
                self._rg.extend(batch, start, end, schema_version, chunk)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                self._broken = exc  # earlier slices of the batch may be taken already
                raise ArchiveStateError(f"encoding a row group failed: {exc!r}", prefix=self.prefix) from exc
            self._shard_payload_bytes += chunk
            start = end
            if len(self._rg) >= self.row_group_rows or self._rg.payload_bytes >= self.row_group_bytes:
                self._flush_row_group()
            if (
                self._shard_payload_bytes >= self.target_shard_bytes
                or self._held_bytes() >= self.target_shard_bytes
            ):
                self._finish_shard()
                if start < n and self._shards.pending is not None:
                    self._shards.upload_pending()

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
        if self._sealed or self._aborted or self._failure() is not None:
            self._refuse()
        ident = (kind, rollout_id, attempt, key)
        h = hash(ident)
        if h in self._rg.seen and self._rg.contains(ident):
            raise self._duplicate_error(ident)
        if self._shards.pending is not None:
            self._shards.upload_pending()
        self._hashes.append(h)
        self._rg.append(ident, h, schema_version, revision, refs, payload)
        self._record_counts[kind] = self._record_counts.get(kind, 0) + 1
        if len(self._rg) >= self.row_group_rows or self._rg.payload_bytes >= self.row_group_bytes:
            self._flush_row_group()
        self._shard_payload_bytes += len(payload)
        if (
            self._shard_payload_bytes >= self.target_shard_bytes
            or self._held_bytes() >= self.target_shard_bytes
        ):
            # uploaded by the next write (before it appends) or by commit: a write that raises
            # a store error has therefore never taken its record
            self._finish_shard()

    def _refuse(self) -> None:
        states = [(self._manifest, "committed"), (self._aborted, "aborted"), (self._failure(), "broken")]
        state = next((name for flag, name in states if flag), "being committed")
        raise ArchiveStateError(f"archive {self.prefix!r} is {state}; no more writes", prefix=self.prefix)

    def _duplicate_error(self, ident: tuple[str, str, int, str]) -> InvalidRecordError:
        return duplicate_error(ident, f"in archive {self.prefix!r}")

    def _failure(self) -> BaseException | None:
        return self._broken or self._shards.broken

    def _held_bytes(self) -> int:
        shards = self._shards
        return shards.encoded_bytes + shards.inflight_bytes + self._rg.payload_bytes

    def _flush_row_group(self) -> None:
        """Hand the open row group to the encoder thread as one Arrow table (its parts are
        built already; only the tail of single members is converted here)."""
        if not self._rg:
            return
        rg, self._rg = self._rg, OpenRowGroup(self._pool)
        try:
            table = rg.table()
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            self._broken = exc
            raise ArchiveStateError(f"encoding a row group failed: {exc!r}", prefix=self.prefix) from exc
        payload_bytes = rg.payload_bytes
        del rg  # the table holds the parts; the encoder job drops it when encoded
        self._shards.encode(table, payload_bytes)

    def _finish_shard(self) -> None:
        """Close the open shard after its last row group (see ``ShardRotation.finish_shard``)."""
        self._flush_row_group()
        self._shards.finish_shard()
        self._shard_payload_bytes = 0

    # -- the member index (one streamed object, see _index_stream) ---------------------------
    def _close_index(self) -> tuple[int, str, int]:
        """Finish the index object; its length, digest and rows go into the manifest."""
        shards = self._shards
        # on the encoder thread, like every Parquet write of this writer (see ``_shards``)
        return shards.run(
            self._index.close,
            [join_key(self.prefix, info.key) for info in shards.shards],
            [spans for spans, _ in shards.meta],
            [footer for _, footer in shards.meta],
        )

    def _check_duplicates(self) -> None:
        """Commit-time duplicate check: sort the member hashes; only members whose hashes collide
        are compared exactly, by reading their identities back from the (closed) index."""
        positions = [] if self._duplicates_checked else colliding_positions(self._hashes)
        ident = self._index.first_duplicate(positions) if positions else None
        if ident is not None:
            self._broken = self._duplicate_error(ident)
            raise self._broken
        self._duplicates_checked = True

    # -- committing -------------------------------------------------------------------------
    def refer(self, bases: Sequence[tuple[str, ManifestRef]], references: Sequence[Sequence[Any]]) -> None:
        """Make this a version-2 archive that lists ``references`` (members stored in the archives
        ``bases``: (prefix, pinned manifest) each) besides what it stores. ``references`` are the
        reference table's columns in ``REFERENCE_SCHEMA`` order (``base`` is a position in
        ``bases``), sequences or Arrow arrays. Call before :meth:`commit`; the caller keeps the
        two sets disjoint (the reader rejects an identity that is both stored and referenced)."""
        if self._sealed:
            raise ArchiveStateError(f"{self.prefix}: refer() after commit started")
        # Arrow columns are kept as they are (immutable, no Python object per row)
        self._refer = (
            list(bases),
            [c if isinstance(c, pa.Array | pa.ChunkedArray) else list(c) for c in references],
        )

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
        if self._aborted or self._failure() is not None:
            self._refuse()
        self._sealed = True
        self._finish_shard()
        self._shards.upload_pending()
        if self._index_entry is None:
            self._index_entry = self._close_index()
        self._shards.shutdown()
        self._check_duplicates()
        # pydantic (the manifest models) is imported only now: streaming the shards never needs it
        from ._manifest import BaseEntry, IndexEntry, ManifestRef, build_component_manifest

        if self._refer is not None and self._references_entry is None:
            self._references_entry = self._write_references(*self._refer)
        if self._candidate is None or self._candidate[0] != extra_dict:
            size, digest, rows = self._index_entry
            self._candidate = (
                extra_dict,
                *build_component_manifest(
                    checkpoint_id=self.checkpoint_id,
                    participant_kind=self.participant_kind,
                    instance=self.instance,
                    writer_id=self.writer_id,
                    created_at=self._created_at,
                    shards=self._shards.shards,
                    index=IndexEntry(key=index_name(self.writer_id), bytes=size, sha256=digest, rows=rows),
                    record_counts=self._record_counts,
                    extra=extra_dict,
                    bases=None
                    if self._refer is None
                    else [BaseEntry(prefix=p, manifest=ref) for p, ref in self._refer[0]],
                    references=self._references_entry,
                ),
            )
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
        self._hashes = array("q")
        self._shards.meta = []
        self._valid_ids = set()
        return manifest

    def _write_references(self, bases: list[tuple[str, ManifestRef]], columns: list[Any]) -> ReferencesEntry:
        """Upload the reference table (a unique name, like the index) and describe it."""
        from ._references import reference_entry, reference_table_bytes, references_name

        data = reference_table_bytes(columns, self.zstd_level)
        name = references_name(self.writer_id)
        self.store.put(join_key(self.prefix, name), data)
        return reference_entry(data, name, columns[0])

    def abort(self) -> None:
        """Drop buffered data; no manifest is written (uploaded shards become garbage)."""
        if self._manifest is not None:
            return
        self._aborted = True
        shards = self._shards
        with contextlib.suppress(ArchiveStateError):
            shards.sync()
        shards.shutdown()
        shards.discard(ArchiveStateError("aborted", prefix=self.prefix))
        shards.pending = None
        shards.meta = []
        self._rg = OpenRowGroup(self._pool)
        self._index.drop(ArchiveStateError("aborted", prefix=self.prefix))
        self._hashes = array("q")

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
