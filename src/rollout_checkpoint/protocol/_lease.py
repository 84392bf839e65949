"""Deadlines and the checkpoint lease: a participant whose coordinator vanished resumes by itself."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from ..errors import DeadlineExceededError, DeadlineTooFarError

__all__ = ["DEFAULT_LEASE_GRACE_SECONDS", "MAX_DEADLINE_SECONDS", "Lease", "check_deadline"]

DEFAULT_LEASE_GRACE_SECONDS = 600.0

MAX_DEADLINE_SECONDS = 3600.0
"""The furthest ahead a deadline of prepare, renew, commit, collect or restore may lie (a
participant's ``max_deadline_seconds``, this by default): those hold admission closed, a control
thread or the lease until their deadline, so a client cannot pause a participant for a day."""


def check_deadline(deadline: float, now: float, operation: str, *, limit: float | None = None) -> None:
    """Every control operation carries an absolute deadline; an expired one changes nothing,
    and so does one more than ``limit`` seconds ahead (``deadline_too_far``)."""
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or math.isnan(deadline):
        raise DeadlineExceededError(f"{operation}: deadline must be epoch seconds, got {deadline!r}")
    if deadline <= now:
        raise DeadlineExceededError(
            f"{operation}: deadline {deadline:.3f} already passed (now {now:.3f}); nothing changed",
            deadline=deadline,
        )
    if limit is not None and deadline - now > limit:
        raise DeadlineTooFarError(
            f"{operation}: deadline {deadline - now:.0f} s ahead; this participant accepts at most "
            f"{limit:g} s (max_deadline_seconds); nothing changed",
            deadline=deadline,
            limit=limit,
        )


class Lease:
    """Runs while a checkpoint is active and expires ``grace`` seconds after its latest deadline.

    The owner notices expiry lazily (:meth:`expired`, on every call) and through a daemon timer
    that calls ``on_timer`` just after it, so a participant never stays closed forever. Not
    thread-safe by itself: the owner calls it with its own lock held.
    """

    def __init__(self, clock: Callable[[], float], on_timer: Callable[[], None], name: str) -> None:
        self._clock = clock
        self._on_timer = on_timer
        self._name = name
        self.expires: float | None = None
        self._timer: threading.Timer | None = None

    def extend(self, deadline: float, grace: float) -> None:
        """Expire no earlier than ``deadline + grace`` (a lease never shrinks)."""
        expires = deadline + grace
        if self.expires is None or expires > self.expires:
            self.expires = expires
            self._arm(expires)

    def clear(self) -> None:
        """No checkpoint is active any more: no expiry, no timer."""
        self.expires = None
        self.stop_timer()

    def stop_timer(self) -> None:
        """Cancel the timer only; expiry is then still noticed lazily."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def expired(self) -> bool:
        return self.expires is not None and self._clock() > self.expires

    def wait_slice(self, remaining: float | None) -> float | None:
        """Wake no later than the expiry, so a waiter notices it (the timer also notifies)."""
        if self.expires is None:
            return remaining
        until_lease = max(0.0, self.expires - self._clock()) + 0.01
        return until_lease if remaining is None else min(remaining, until_lease)

    def _arm(self, expires: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, expires - self._clock()) + 0.01
        timer = threading.Timer(delay, self._on_timer)
        timer.daemon = True
        timer.name = self._name
        self._timer = timer
        timer.start()
