"""Awaitable forms of the participant's blocking waits, for ``async`` request handlers.

A handler that must park new work while a checkpoint holds admission closed awaits
:meth:`AsyncAdmission.wait_open` (or lets :meth:`AsyncAdmission.call` retry its admission) instead
of blocking the event loop. However many requests wait, one watcher thread per participant
blocks on the participant's condition variable and wakes them all when admission reopens.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio

from ..errors import AdmissionClosedError

__all__ = ["AsyncAdmission", "run_blocking"]

T = TypeVar("T")

_WATCH_SLICE_S = 1.0
"""The watcher re-checks whether anyone still waits this often (it sleeps on the condition
variable in between, so it does not spin)."""


class _Gate(Protocol):
    @property
    def accepting(self) -> bool: ...

    def wait_open(self, timeout: float | None = None) -> bool: ...


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking SDK call (an export, a park, a lock-taking admission) off the event loop."""
    return await anyio.to_thread.run_sync(lambda: fn(*args))


class AsyncAdmission:
    """Awaitable admission waits on one participant (any object with ``accepting`` and
    ``wait_open``, e.g. every :class:`~rollout_checkpoint.participant.Participant`)."""

    def __init__(self, participant: _Gate) -> None:
        self._participant = participant
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._watcher: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """How many coroutines currently wait for admission to reopen."""
        with self._lock:
            return len(self._waiters)

    async def wait_open(self, timeout: float | None = None) -> bool:
        """Wait (without blocking the loop) until admission is open; ``True`` if it is."""
        if self._participant.accepting:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (loop, future)
        with self._lock:
            self._waiters.append(entry)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="admission-watcher", daemon=True)
                self._watcher.start()
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return bool(self._participant.accepting)
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    async def call(self, fn: Callable[[], T], *, timeout: float) -> T:
        """Run ``fn`` (a non-waiting admission such as ``begin(execution)``) in a thread; while
        it is refused with ``admission_closed``, wait for admission to reopen and try again,
        for at most ``timeout`` seconds (then the refusal is raised)."""
        end = time.monotonic() + timeout
        while True:
            try:
                return await run_blocking(fn)
            except AdmissionClosedError:
                remaining = end - time.monotonic()
                if remaining <= 0 or not await self.wait_open(remaining):
                    raise

    def _watch(self) -> None:
        while True:
            with self._lock:
                if not self._waiters:
                    self._watcher = None
                    return
            if not self._participant.wait_open(timeout=_WATCH_SLICE_S):
                continue
            with self._lock:
                woken = list(self._waiters)
                self._waiters.clear()
            for loop, future in woken:
                with contextlib.suppress(RuntimeError):  # the loop already closed
                    loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
