"""Group commit for token sinks: fewer, larger shards without receipts that run ahead of durability."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import InvalidRecordError

if TYPE_CHECKING:
    from ._entries import TokenEntry, TokenPutReceipt

__all__ = ["BatchTokenSink", "BatchingTokenSink"]


@runtime_checkable
class BatchTokenSink(Protocol):
    """A sink that can store several entries in one durable write."""

    @property
    def name(self) -> str: ...

    def put_many(self, entries: Sequence[TokenEntry]) -> list[TokenPutReceipt]: ...


class _Waiter:
    __slots__ = ("entries", "error", "receipts")

    def __init__(self, entries: list[TokenEntry]) -> None:
        self.entries = entries
        self.receipts: list[TokenPutReceipt] | None = None
        self.error: BaseException | None = None


class BatchingTokenSink:
    """Group commit in front of a :class:`BatchTokenSink`: fewer, larger shards, honest receipts.

    Concurrent ``put`` calls are written together in one ``put_many``; each ``put`` returns only
    after the write holding its entry is durable, so a receipt never runs ahead of its tokens.
    The first caller to find no write running leads: it waits ``linger`` seconds for others to
    join, writes up to ``max_batch`` callers' entries and wakes them. A failed batch is retried
    caller by caller, so an error (a conflicting entry, say) reaches only the caller it concerns.
    """

    def __init__(self, inner: BatchTokenSink, *, max_batch: int = 256, linger: float = 0.002) -> None:
        if max_batch < 1 or linger < 0:
            raise InvalidRecordError("BatchingTokenSink needs max_batch >= 1 and linger >= 0")
        self.inner = inner
        self.max_batch = max_batch
        self.linger = linger
        self.batches = 0
        self._cond = threading.Condition()
        self._queue: list[_Waiter] = []
        self._writing = False

    @property
    def name(self) -> str:
        return self.inner.name

    def put(self, entry: TokenEntry) -> TokenPutReceipt:
        return self.put_many([entry])[0]

    def put_many(self, entries: Sequence[TokenEntry]) -> list[TokenPutReceipt]:
        waiter = _Waiter(list(entries))
        with self._cond:
            self._queue.append(waiter)
            while waiter.receipts is None and waiter.error is None:
                if self._writing:
                    self._cond.wait()
                    continue
                self._writing = True
                try:
                    if self.linger:
                        self._cond.wait(self.linger)  # others join the batch meanwhile
                    batch = self._queue[: self.max_batch]
                    del self._queue[: self.max_batch]
                    self._cond.release()
                    try:
                        self._write(batch)
                    finally:
                        self._cond.acquire()
                finally:
                    self._writing = False
                    self._cond.notify_all()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.receipts is not None
        return waiter.receipts

    def _write(self, batch: list[_Waiter]) -> None:
        self.batches += 1
        try:
            receipts = self.inner.put_many([e for w in batch for e in w.entries])
        except Exception:
            for waiter in batch:  # find out whose entry failed
                try:
                    waiter.receipts = self.inner.put_many(waiter.entries)
                except Exception as exc:
                    waiter.error = exc
            return
        at = 0
        for waiter in batch:
            waiter.receipts = receipts[at : at + len(waiter.entries)]
            at += len(waiter.entries)
