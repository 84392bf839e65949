"""Awaitable session work on a resources participant, for ``async`` request handlers.

An ``async`` server (a FastAPI handler, NeMo Gym's resources servers) cannot call
:meth:`ResourcesParticipant.mutate`: it runs ``fn`` synchronously and, while a checkpoint holds
admission closed, blocks its thread. :func:`session_work` admits the work, counts it in flight
(prepare is not ready until it ends) and takes the session's lock, awaiting each of them with
short sleeps instead of holding a thread: many parked requests cost no threads. Inside, the
handler runs its own (async) code and reports the new state with :meth:`SessionWork.set`, or
that the session ended with :meth:`SessionWork.end`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import AdmissionClosedError, UnknownExecutionError
from ..ids import ExecutionId, validate_id

__all__ = ["SessionWork", "session_work"]


@dataclass
class _Session:
    state: Any
    revision: int
    encoded: bytes | Exception | None  # the member payload of ``state`` (exported mode), or an error
    lock: threading.Lock = field(default_factory=threading.Lock)
    inflight: int = 0


_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.05


class SessionWork:
    """One admitted piece of work on ``(execution, session_id)``; see :func:`session_work`.

    ``participant`` is the :class:`~.resources.ResourcesParticipant` (typed ``Any`` here: this
    module sits below it and works on its lock, sessions and in-flight counts)."""

    def __init__(
        self,
        participant: Any,
        execution: ExecutionId,
        session_id: str,
        session: _Session | None,
    ) -> None:
        self._participant = participant
        self.execution = execution
        self.session_id = session_id
        self._session = session
        self.ended = False

    @property
    def exists(self) -> bool:
        """Whether the participant holds this session (it was opened or restored)."""
        return self._session is not None and not self.ended

    @property
    def state(self) -> Any:
        return None if self._session is None else self._session.state

    @property
    def revision(self) -> int | None:
        return None if self._session is None or self.ended else self._session.revision

    def set(self, state: Any) -> int:
        """Record ``state`` as the session's new state: opens the session at revision 0, or
        bumps its revision. Returns the revision. A fenced attempt raises ``stale_attempt``."""
        p = self._participant
        key = (self.execution, self.session_id)
        with p._cond:
            p.fence.check(self.execution)
            session = p._sessions.get(key)
            if session is not None and session is not self._session:
                raise UnknownExecutionError(
                    f"session {self.session_id} of {self.execution} changed meanwhile"
                )
            revision = 0 if session is None else session.revision + 1
        encoded = p._encode(self.execution, self.session_id, revision, state)
        with p._cond:
            p.fence.check(self.execution)
            if self._session is None:
                p._register(self.execution)
                self._session = _Session(state=state, revision=0, encoded=encoded, inflight=1)
                p._add_session(self.execution, self.session_id, self._session)
                p._opening[key] -= 1
                if not p._opening[key]:
                    del p._opening[key]
            elif p._sessions.get(key) is not self._session:
                raise UnknownExecutionError(f"session {self.session_id} of {self.execution} ended meanwhile")
            else:
                self._session.state = state
                self._session.encoded = encoded
                self._session.revision = revision
                p._touch(self.execution, self.session_id)
            p._changed()
            return revision

    def end(self) -> None:
        """The session is over (terminal): drop it (allowed while admission is closed)."""
        p = self._participant
        with p._cond:
            if (
                self._session is not None
                and p._sessions.get((self.execution, self.session_id)) is self._session
            ):
                p._drop_session(self.execution, self.session_id)
                if self.execution not in p._by_execution:
                    p._unregister(self.execution)
            self.ended = True
            p._changed()


@asynccontextmanager
async def session_work(
    participant: Any, execution: ExecutionId, session_id: str, *, wait: float
) -> AsyncIterator[SessionWork]:
    """Admit work on a session (awaiting, up to ``wait`` s, while a checkpoint holds admission
    closed; then ``admission_closed``), count it in flight and hold the session's lock."""
    validate_id(session_id, "session_id")
    p = participant
    key = (execution, session_id)
    end = time.monotonic() + wait
    delay = _FIRST_POLL_S
    while True:
        with p._cond:
            try:
                p._admit(execution, wait=0)
            except AdmissionClosedError:
                if time.monotonic() >= end:
                    raise
            else:
                session = p._sessions.get(key)
                if session is None:
                    p._opening[key] = p._opening.get(key, 0) + 1
                else:
                    session.inflight += 1
                p._inflight.add(key)
                break
        await asyncio.sleep(min(delay, max(0.0, end - time.monotonic())))
        delay = min(delay * 2, _MAX_POLL_S)
    work = SessionWork(p, execution, session_id, session)
    locked = False
    try:
        if session is not None:
            delay = _FIRST_POLL_S
            while not session.lock.acquire(blocking=False):
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_POLL_S)
            locked = True
        yield work
    finally:
        if locked and session is not None:
            session.lock.release()
        with p._cond:
            held = work._session
            if held is not None:
                held.inflight -= 1
                busy = held.inflight > 0
            else:
                p._opening[key] -= 1
                if not p._opening[key]:
                    del p._opening[key]
                busy = False
            if not busy and not p._opening.get(key):
                p._inflight.discard(key)
            p._changed()
