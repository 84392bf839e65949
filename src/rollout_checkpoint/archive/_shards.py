"""Shard rotation for the writer: the open shard, its encoder thread, closing and uploading.

Each full row group is handed over as an Arrow table; :class:`ShardRotation` encodes it on one
background thread (Parquet encoding and zstd release the GIL, so the caller keeps producing the
next row group meanwhile) into the open shard (``_shard.ShardStream``), and streams its index
rows. A shard is closed when the writer says so: streamed shards are finished on the store at
once, buffered ones wait (``pending``) for one ``put`` that a failure lets the next call retry.
Nothing here imports pydantic: shard entries are plain :class:`ShardInfo` until commit.
"""

from __future__ import annotations

import contextlib
import io
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..store import DelegatingStore, LocalStore, ObjectStore
from ._errors import ArchiveStateError
from ._index import RowGroupSpan
from ._index_stream import IndexStream
from ._schema import INDEX_MEMBER_COLUMNS, join_key, shard_name
from ._shard import ShardStream

__all__ = ["ShardInfo", "ShardRotation", "streams_natively"]

_DEFAULT_POOL = pa.default_memory_pool()


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the manifest records of one uploaded shard (``ShardEntry``'s fields)."""

    key: str
    bytes: int
    sha256: str
    records: int
    row_groups: int
    footer_offset: int
    footer_bytes: int


@dataclass
class _EncodedShard:
    """A shard serialised in memory, waiting for (or retrying) its upload."""

    info: ShardInfo
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


class ShardRotation:
    """The shards of one writer; not thread-safe (the writer's thread calls it).

    A failure that loses records already taken (encoding, opening or finishing a streamed shard)
    sets :attr:`broken` and raises ``ArchiveStateError``: the writer must be aborted.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        writer_id: str,
        zstd_level: int,
        stream_shards: bool,
        index: IndexStream,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.writer_id = writer_id
        self.zstd_level = zstd_level
        self.stream_shards = stream_shards
        self.index = index
        self.broken: BaseException | None = None
        self.encoded_bytes = 0  # size of the open shard's Parquet stream (changes per row group)
        self.inflight_bytes = 0  # payload bytes of the row group on the encoder thread
        self.pending: _EncodedShard | None = None
        self.shards: list[ShardInfo] = []
        # per uploaded shard (not per member): row-group spans and the raw Parquet footer
        self.meta: list[tuple[list[RowGroupSpan], bytes]] = []
        self._seq = 0
        self._encoder: ThreadPoolExecutor | None = None
        self._job: Future[tuple[int, int]] | None = None
        self._members: tuple[int, int, pa.Table] = (0, 0, pa.table({}))
        self._shard: ShardStream | None = None
        self._shard_key = ""
        self._stack: contextlib.ExitStack | None = None
        self._buffer: io.BytesIO | None = None

    def _fail(self, exc: BaseException, message: str) -> ArchiveStateError:
        self.broken = exc
        return ArchiveStateError(message, prefix=self.prefix)

    # -- row groups -----------------------------------------------------------------------
    def encode(self, table: pa.Table, payload_bytes: int) -> None:
        """Encode one row group on the encoder thread (one in flight at most: the previous one
        is finished first, so the caller holds at most two row groups). The previous row
        group's index rows are streamed here, on the caller's thread, while this one encodes."""
        done = self.sync()
        shard = self._shard
        if shard is None:
            try:
                shard = self._open_shard()
            except BaseException as exc:  # the row group's records are taken: the writer is broken
                raise self._fail(
                    exc,
                    f"opening a shard of {self.prefix!r} failed: {exc!r}; abort and write the archive again",
                ) from exc
        self.inflight_bytes = payload_bytes
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-encoder")
        # the shard's position in the manifest is its sequence number
        members = (self._seq - 1, shard.encoded_row_groups, table.select(INDEX_MEMBER_COLUMNS))
        self._job = self._encoder.submit(_encode_job, shard, table)
        self._members = members
        if done is not None:
            self.index.add(*done)

    def sync(self) -> tuple[int, int, pa.Table, int, int] | None:
        """Wait for the row group being encoded, then hand its bytes to the shard's sink (hash,
        store stream) here on the caller's thread, so that the encoder thread's ``write_table``
        never calls into Python. An encoding or store failure breaks the writer.

        Returns the row group's index rows (shard, row group, member columns, byte range) for
        ``IndexStream.add``, which the caller streams."""
        job = self._job
        if job is None:
            return None
        self._job = None
        self.inflight_bytes = 0
        shard = self._shard
        try:
            offset, length = job.result()
            if shard is None:
                raise AssertionError("a row group was encoded with no open shard")
            shard.finish_row_group()
        except BaseException as exc:
            raise self._fail(exc, f"encoding a row group failed: {exc!r}") from exc
        self.encoded_bytes = shard.bytes
        seq, row_group, members = self._members
        return seq, row_group, members, offset, length

    def _sync_and_index(self) -> None:
        done = self.sync()
        if done is not None:
            self.index.add(*done)
        # Parquet's page and compression buffers come from Arrow's default pool whatever pool
        # the writer is given; mimalloc's there keeps freed pages of this thread for reuse (about
        # 20 MB more resident while writing), so they go back now (mimalloc: ``mi_collect``)
        _DEFAULT_POOL.release_unused()

    # -- shards ---------------------------------------------------------------------------
    def _open_shard(self) -> ShardStream:
        """Start the next shard: a stream into its store object, or an in-memory buffer."""
        key = shard_name(self.writer_id, self._seq)
        self._seq += 1
        sink: Any
        if self.stream_shards:
            stack = contextlib.ExitStack()
            sink = stack.enter_context(self.store.open_write(join_key(self.prefix, key)))
            self._stack = stack
        else:
            sink = self._buffer = io.BytesIO()
        self._shard_key = key
        self._shard = ShardStream(sink, self.zstd_level)
        return self._shard

    def discard(self, exc: BaseException) -> None:
        """Drop the open shard; a streamed one is discarded by its store stream."""
        shard, stack = self._shard, self._stack
        self._shard = None
        self._stack = None
        self._buffer = None
        self.encoded_bytes = 0
        if shard is not None:
            shard.abandon()
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.__exit__(type(exc), exc, exc.__traceback__)

    def finish_shard(self) -> None:
        """Close the open shard (its row groups must be handed over already): a streamed one is
        finished on the store now (and recorded); a buffered one becomes :attr:`pending`."""
        self._sync_and_index()
        shard = self._shard
        if shard is None:
            return
        if self.pending is not None:
            raise AssertionError("a shard is still waiting for upload")
        try:
            closed = shard.close()
            if self._stack is not None:
                self._stack.close()  # local disk: fsync + rename; S3: the upload completes
                self._stack = None
        except BaseException as exc:
            self.broken = exc
            self.discard(exc)
            raise ArchiveStateError(
                f"writing shard {self._shard_key} of {self.prefix!r} failed: {exc!r}; "
                "abort and write the archive again",
                prefix=self.prefix,
            ) from exc
        info = ShardInfo(
            key=self._shard_key,
            bytes=closed.size,
            sha256=closed.sha256,
            records=closed.records,
            row_groups=len(closed.spans),
            footer_offset=closed.footer_offset,
            footer_bytes=len(closed.footer),
        )
        buffer = self._buffer
        self._shard = None
        self._buffer = None
        self.encoded_bytes = 0
        if buffer is None:
            self._uploaded(info, closed.spans, closed.footer)
        else:
            data = buffer.getvalue()
            buffer.close()
            self.pending = _EncodedShard(info, data, closed.spans, closed.footer)

    def _uploaded(self, info: ShardInfo, spans: list[RowGroupSpan], footer: bytes) -> None:
        self.shards.append(info)
        self.meta.append((spans, footer))

    def upload_pending(self) -> None:
        """Upload the encoded shard; on failure it stays pending and the next call retries it."""
        pending = self.pending
        if pending is None:
            return
        self.store.put(join_key(self.prefix, pending.info.key), pending.data)
        self.pending = None
        self._uploaded(pending.info, pending.spans, pending.footer)

    def shutdown(self) -> None:
        """Stop the encoder thread (after its last job)."""
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None


def _encode_job(shard: ShardStream, table: pa.Table) -> tuple[int, int]:
    """The encoder thread's work for one row group: encode it (no GIL); its byte range."""
    span = shard.encode_row_group(table)
    # Parquet's page and compression buffers come from Arrow's default pool whatever pool the
    # writer is given; mimalloc's there keeps this thread's freed pages for reuse (about 20 MB
    # more resident while writing), so they go back now (mimalloc: ``mi_collect``)
    _DEFAULT_POOL.release_unused()
    return span
