"""Member indexes fetched and decoded ahead of classification, on worker threads.

Classification converts one component's index columns to Python at a time. Fetching the next
indexes (a GET each, slow on an object store) and decoding them (zstd and Parquet, in C++
without the GIL) can run meanwhile on another core. At a million rollouts the decode alone
was an eighth of ``load_checkpoint``.

Prefetching is best effort: what fails on a worker is not reported there; the caller's own
:meth:`~rollout_checkpoint.format.record_reader.ArchiveReader.member_columns` repeats the step
and raises as it always did, so errors and their order do not depend on the threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from ..format.record_reader import ArchiveReader

__all__ = ["IndexPrefetch"]

WINDOW = 4
"""Indexes decoded ahead of the one in use: enough to hide a store's latency, few enough that
the decoded columns waiting never hold much more memory than the plan itself."""
WORKERS = 2


class IndexPrefetch:
    """Prepares ``readers[i]`` ahead of :meth:`ready` ``(i)``, at most :data:`WINDOW` ahead."""

    def __init__(
        self, readers: Sequence[ArchiveReader], window: int = WINDOW, workers: int = WORKERS
    ) -> None:
        self._readers = readers
        self._window = max(1, window)
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[int, Future[None]] = {}
        self._next = 0
        self._workers = max(1, workers)

    def __enter__(self) -> IndexPrefetch:
        if len(self._readers) > 1:  # one index: nothing to overlap with
            self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="rc-index")
            while self._next < min(self._window, len(self._readers)):
                self._submit()
        return self

    def _submit(self) -> None:
        assert self._pool is not None
        self._futures[self._next] = self._pool.submit(self._readers[self._next].prepare_member_columns)
        self._next += 1

    def ready(self, i: int) -> None:
        """Wait until ``readers[i]`` is prepared (or its preparation failed: the caller's own
        read then raises), and start the next one."""
        future = self._futures.pop(i, None)
        if future is not None:
            future.exception()  # waits; the error, if any, is raised again by the caller's read
        if self._pool is not None and self._next < len(self._readers):
            self._submit()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            # a rejected checkpoint stops early: drop what has not started, wait for the rest
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._futures.clear()
