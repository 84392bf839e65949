"""Shard rotation for the writer: the open shard, its encoder thread, closing and uploading.

Each full row group is handed over as an Arrow table; :class:`ShardRotation` encodes it on one
background thread (Parquet encoding and zstd release the GIL, so the caller keeps producing the
next row groups meanwhile) into the open shard (``_shard.ShardStream``), and the same job
streams its index rows (``IndexStream``). Up to ``MAX_INFLIGHT`` row groups may wait for or be
in encoding, so the caller rarely waits for the encoder. Every Parquet write of the writer (row
groups, shard footers, the index) runs on that one thread: a second thread writing Parquet
keeps its own allocator state resident (about 12 MB more, measured with pyarrow 26), and
pyarrow's stream methods must not be called from two threads at once (they take the stream's
lock while holding the GIL). The encoded bytes reach the shard's sink (hash, store stream)
from that thread too, whenever the native buffer in front of it fills.

A shard is closed when the writer says so: streamed shards are finished on the store at once,
buffered ones wait (``pending``) for one ``put`` that a failure lets the next call retry.
Nothing here imports pydantic: shard entries are plain :class:`ShardInfo` until commit.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from ..store import DelegatingStore, LocalStore, ObjectStore
from ._errors import ArchiveStateError
from ._index import RowGroupSpan
from ._index_stream import IndexStream
from ._schema import INDEX_MEMBER_COLUMNS, join_key, shard_name
from ._shard import ShardStream

__all__ = ["MAX_INFLIGHT", "ShardInfo", "ShardRotation", "streams_natively"]

_DEFAULT_POOL = pa.default_memory_pool()
MAX_INFLIGHT = 2
"""Row groups handed to the encoder thread and not yet collected, at most (the writer holds them
plus the open one). Two let a batch cut a row group while the previous one still encodes; three
measured no faster in ``benchmarks/peer_store.py`` and hold one more row group."""
RELEASE_EVERY = 8
"""The encoder thread hands freed pool pages back every this many row groups (each call costs
about as much as encoding a tenth of a row group; every row group cost ~10% of the encoder)."""
T = TypeVar("T")


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
    """The shards of one writer; not thread-safe (the writer's thread calls it, and it runs the
    Parquet work on its encoder thread).

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
        self.inflight_bytes = 0  # payload bytes of the row groups handed to the encoder thread
        self.pending: _EncodedShard | None = None
        self.shards: list[ShardInfo] = []
        # per uploaded shard (not per member): row-group spans and the raw Parquet footer
        self.meta: list[tuple[list[RowGroupSpan], bytes]] = []
        self._seq = 0
        self._encoder: ThreadPoolExecutor | None = None
        self._jobs: deque[tuple[Future[tuple[int, int]], int]] = deque()  # (job, payload bytes), in order
        self._row_groups = 0  # row groups handed over for the open shard
        self._shard: ShardStream | None = None
        self._shard_key = ""
        self._stack: contextlib.ExitStack | None = None
        self._buffer: io.BytesIO | None = None

    def _fail(self, exc: BaseException, message: str) -> ArchiveStateError:
        self.broken = exc
        return ArchiveStateError(message, prefix=self.prefix)

    # -- the encoder thread -----------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        if self._encoder is None:
            self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="archive-encoder")
        return self._encoder

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the encoder thread after the jobs before it, and wait for it
        (opening and closing shards and the index: every Parquet write on one thread)."""
        return self._executor().submit(fn, *args).result()

    # -- row groups -----------------------------------------------------------------------
    def encode(self, table: pa.Table, payload_bytes: int) -> None:
        """Hand one row group to the encoder thread, which encodes it into the open shard and
        then streams its index rows. Waits only while ``MAX_INFLIGHT`` row groups are queued."""
        self.sync(MAX_INFLIGHT - 1)
        shard = self._shard
        if shard is None:
            try:
                shard = self._open_shard()
            except BaseException as exc:  # the row group's records are taken: the writer is broken
                raise self._fail(
                    exc,
                    f"opening a shard of {self.prefix!r} failed: {exc!r}; abort and write the archive again",
                ) from exc
        # the shard's position in the manifest is its sequence number
        job = self._executor().submit(_encode_job, shard, table, self.index, self._seq - 1, self._row_groups)
        self._row_groups += 1
        self._jobs.append((job, payload_bytes))
        self.inflight_bytes += payload_bytes

    def pulse(self) -> None:
        """Let the encoder thread take the GIL now if it waits for it (the writer's thread calls
        this every few hundred records while it encodes a batch in Python).

        The encoder needs the GIL for a moment between two native calls (after encoding a row
        group, to start the next); a thread running Python keeps it for up to the interpreter's
        switch interval (5 ms) before it must hand it over, which stalled the encoder about once
        per row group. ``time.sleep(0)`` hands it over at once, and costs a system call when
        nobody waits. Only while a row group is queued or being encoded."""
        jobs = self._jobs
        if jobs and not jobs[-1][0].done():
            time.sleep(0)

    def sync(self, keep: int = 0) -> None:
        """Collect the encoded row groups, waiting until at most ``keep`` are still queued. An
        encoding or store failure (the encoder hands bytes on to the store) breaks the writer."""
        jobs = self._jobs
        try:
            while jobs and (len(jobs) > keep or jobs[0][0].done()):
                job, payload_bytes = jobs[0]
                offset, length = job.result()
                jobs.popleft()
                self.inflight_bytes -= payload_bytes
                self.encoded_bytes = offset + length
        except BaseException as exc:
            self._drain()
            raise self._fail(exc, f"encoding a row group failed: {exc!r}") from exc

    def _drain(self) -> None:
        """Wait out the queued jobs after a failure (their results no longer matter)."""
        while self._jobs:
            job, _ = self._jobs.popleft()
            with contextlib.suppress(BaseException):
                job.result()
        self.inflight_bytes = 0

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
        self._row_groups = 0
        self._shard = self.run(ShardStream, sink, self.zstd_level)
        return self._shard

    def discard(self, exc: BaseException) -> None:
        """Drop the open shard; a streamed one is discarded by its store stream."""
        self._drain()
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
        self.sync()
        shard = self._shard
        if shard is None:
            return
        if self.pending is not None:
            raise AssertionError("a shard is still waiting for upload")
        try:
            closed = self.run(shard.close)
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
        self._drain()
        if self._encoder is not None:
            self._encoder.shutdown(wait=True)
            self._encoder = None


def _encode_job(
    shard: ShardStream, table: pa.Table, index: IndexStream, seq: int, row_group: int
) -> tuple[int, int]:
    """The encoder thread's work for one row group: encode it (no GIL), then stream its index
    rows (shard, row group, member columns, byte range); the byte range."""
    offset, length = shard.encode_row_group(table)
    index.add(seq, row_group, table.select(INDEX_MEMBER_COLUMNS), offset, length)
    del table
    if row_group % RELEASE_EVERY == 0:
        # Parquet's page and compression buffers come from Arrow's default pool whatever pool
        # the writer is given; mimalloc's there keeps this thread's freed pages for reuse, so
        # they go back now and then (mimalloc: ``mi_collect``, about 0.5 ms a call)
        _DEFAULT_POOL.release_unused()
    return offset, length
