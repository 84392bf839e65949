"""Giving up a wait: a prepare whose caller went away stops waiting (and frees its thread).

A :class:`Cancellation` is handed to :meth:`Participant.prepare` by whoever runs it on a
caller's behalf (the control router, when the HTTP client disconnects). Cancelling it wakes the
waiting prepare at once; the prepare then answers ``ready=False`` as if its deadline had passed.
Nothing else changes: admission stays closed as after any not-ready prepare, a repeat with the
same id waits again, and the lease (deadline + ``lease_grace_seconds``) still reopens admission
if nobody resumes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Cancellation"]


class Cancellation:
    """A one-way flag with wake-up callbacks; thread-safe, cancelling twice is a no-op."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._wakers: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def on_cancel(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when cancelled (at once if it already is). Never called with a lock of
        the caller's held by this object, so ``wake`` may take the caller's own lock."""
        with self._lock:
            if not self._cancelled:
                self._wakers.append(wake)
                return
        wake()
