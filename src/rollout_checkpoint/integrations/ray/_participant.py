"""``RayParticipant``: participant control over a :class:`ParticipantHost` actor handle.

It satisfies :class:`~rollout_checkpoint.protocol.ParticipantControl`, so a driver-side
:class:`~rollout_checkpoint.coordinator.Coordinator` drives actors exactly as it drives HTTP
servers, and every operation has an ``async`` twin (``await participant.aprepare(...)``) for a
controller on an event loop. What a call becomes:

* its deadline a timeout (the deadline plus ``answer_margin_s``), then ``ray.cancel`` of the
  task (a pending task never runs; a running one ends at its own deadline);
* an actor that died, is restarting or gave no answer: ``participant_unreachable``;
* an SDK error raised in the actor: the same typed error (the ``RayTaskError`` unwrapped);
* prepare, renew, commit and collect carry the incarnation last seen, and the actor refuses one
  meant for another incarnation (``participant_restarted``: Ray retried it onto the empty
  replacement), and every reply is checked the same way here;
* scopes and retired executions travel in the HTTP routes' compact form (``rollout_id#attempt``
  strings), and a commit answers brief when asked (``brief_commits``), as over HTTP.

Control needs no HTTP token: only a holder of the actor handle (a process of the cluster) can
call it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from ...errors import CheckpointError, ParticipantRestartedError
from ...ids import ExecutionId, pack_executions
from ...protocol import (
    Capabilities,
    CommitReply,
    ParticipantStatus,
    PrepareReport,
    RestoreReply,
    ResumeReply,
)
from ...server import ParticipantUnreachableError
from ...store import ObjectStore

__all__ = ["RayParticipant"]

T = TypeVar("T")

try:  # Ray >= 2.9 distinguishes an actor that is restarting from one that is dead
    from ray.exceptions import ActorUnavailableError as _Unavailable
except ImportError:  # pragma: no cover - older Ray
    _Unavailable = RayActorError  # type: ignore[assignment,misc]


class RayParticipant:
    """One :class:`ParticipantHost` (or subclass) actor as a participant.

    ``handle``: the actor handle. ``name``: used in every error (default the actor id).
    ``default_timeout_s``: for the calls without a deadline (``status``, ``forget``).
    ``answer_margin_s``: how long past a deadline to wait for the answer before cancelling.
    ``get`` / ``cancel``: how a reference is awaited and cancelled (``ray.get`` / ``ray.cancel``;
    a test passes its own). ``brief_commits``: every commit asks for a brief reply (no executions
    and restarts lists, which are in the committed manifest's ``extra``), for a caller that does
    not read them: the coordinator never does (:class:`RayDeployment` sets it).

    What travels is what the HTTP routes send (``docs/ray.md``, "What a call costs"): scopes and
    retired executions as compact ``rollout_id#attempt`` strings, not lists of models.
    """

    def __init__(
        self,
        handle: Any,
        *,
        name: str | None = None,
        default_timeout_s: float = 30.0,
        answer_margin_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        get: Callable[..., Any] | None = None,
        cancel: Callable[[Any], Any] | None = None,
        brief_commits: bool = False,
    ) -> None:
        self.handle = handle
        self.brief_commits = brief_commits
        self._get = get if get is not None else ray.get
        self._cancel = cancel if cancel is not None else ray.cancel
        self._name = name
        self.default_timeout_s = default_timeout_s
        self.answer_margin_s = answer_margin_s
        self.clock = clock
        self._incarnation: str | None = None
        self._capabilities: Capabilities | None = None

    def __repr__(self) -> str:
        return f"RayParticipant({self.name!r})"

    @property
    def name(self) -> str:
        if self._name:
            return self._name
        caps = self._capabilities
        if caps is not None:
            return f"{caps.kind}/{caps.instance}"
        actor_id = getattr(self.handle, "_actor_id", None)
        return f"actor {actor_id.hex() if actor_id is not None else self.handle!r}"

    @property
    def incarnation(self) -> str | None:
        """The incarnation of the last answer read (``None`` before the first)."""
        return self._incarnation

    # -- the call ---------------------------------------------------------------------------------
    def _timeout(self, deadline: float | None) -> float:
        if deadline is None:
            return self.default_timeout_s
        return max(0.0, deadline - self.clock()) + self.answer_margin_s

    def _ref(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.handle, method).remote(*args)
        except (RayActorError, _Unavailable) as exc:
            raise self._unreachable(method, exc) from None

    def _unreachable(self, method: str, exc: BaseException | None) -> ParticipantUnreachableError:
        what = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if exc is not None else "no answer"
        return ParticipantUnreachableError(
            f"{self.name}: {method.removeprefix('control_')} got no answer ({what})", participant=self.name
        )

    def _unwrap(self, method: str, exc: BaseException) -> BaseException:
        if isinstance(exc, RayTaskError):
            cause = exc.cause
            if isinstance(cause, CheckpointError):
                return cause
            if isinstance(cause, RayActorError | _Unavailable):
                return self._unreachable(method, cause)
            return cause if isinstance(cause, Exception) else exc
        if isinstance(exc, RayActorError | _Unavailable | GetTimeoutError):
            return self._unreachable(method, exc)
        return exc

    def _call(self, method: str, deadline: float | None, *args: Any) -> Any:
        ref = self._ref(method, *args)
        try:
            return self._get(ref, timeout=self._timeout(deadline))
        except GetTimeoutError as exc:
            self._cancel(ref)  # a task still pending never runs; a running one ends at its deadline
            raise self._unreachable(method, exc) from None
        except Exception as exc:
            raise self._unwrap(method, exc) from None

    async def _acall(self, method: str, deadline: float | None, *args: Any) -> Any:
        ref = self._ref(method, *args)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), self._timeout(deadline))
        except TimeoutError as exc:
            self._cancel(ref)
            raise self._unreachable(method, exc) from None
        except Exception as exc:
            raise self._unwrap(method, exc) from None

    def _observe(self, reply: T, known: str | None, operation: str) -> T:
        now: str = reply.incarnation  # type: ignore[attr-defined]
        self._incarnation = now
        if known is not None and now != known:
            raise ParticipantRestartedError(
                f"{self.name}: {operation} was answered by another incarnation ({known} -> {now}): "
                "the actor restarted during the call, and what the first try did died with it",
                participant=self.name,
                expected=known,
                actual=now,
            )
        return reply

    def _status(self, reply: ParticipantStatus) -> ParticipantStatus:
        self._incarnation = reply.incarnation  # an observation: the coordinator compares
        self._capabilities = reply.capabilities
        return reply

    # -- ParticipantControl ---------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        if self._capabilities is None:
            self._capabilities = self.status().capabilities
        return self._capabilities

    def status(self) -> ParticipantStatus:
        return self._status(self._call("control_status", None))

    def prepare(self, checkpoint_id: str, deadline: float) -> PrepareReport:
        known = self._incarnation
        reply: PrepareReport = self._call("control_prepare", deadline, checkpoint_id, deadline, known)
        return self._observe(reply, known, "prepare")

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        self._call("control_renew", deadline, checkpoint_id, deadline, self._incarnation)

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        brief: bool = False,
    ) -> CommitReply:
        """``brief``: answer without the executions and restarts lists (see the class doc)."""
        known = self._incarnation
        args = (checkpoint_id, _url(store), deadline, _packed(scope), known, brief or self.brief_commits)
        reply: CommitReply = self._call("control_commit", deadline, *args)
        return self._observe(reply, known, "commit")

    def restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply:
        args = (checkpoint_id, source_checkpoint_id, _url(store), deadline, _packed(scope))
        reply: RestoreReply = self._call("control_restore", deadline, *args)
        self._incarnation = reply.incarnation  # a restore installs into whichever incarnation answers
        return reply

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        reply: ResumeReply = self._call("control_resume", deadline, checkpoint_id, deadline)
        self._incarnation = reply.incarnation
        return reply

    def abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        reply: ResumeReply = self._call("control_abort_restore", deadline, checkpoint_id, deadline)
        self._incarnation = reply.incarnation
        return reply

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        batch = pack_executions(executions)
        if batch:
            self._call("control_retire", deadline, batch, deadline)

    def forget(self, rollout_ids: Sequence[str]) -> None:
        self._call("control_forget", None, list(rollout_ids))

    # -- async twins ------------------------------------------------------------------------------
    async def astatus(self) -> ParticipantStatus:
        return self._status(await self._acall("control_status", None))

    async def aprepare(self, checkpoint_id: str, deadline: float) -> PrepareReport:
        known = self._incarnation
        reply: PrepareReport = await self._acall("control_prepare", deadline, checkpoint_id, deadline, known)
        return self._observe(reply, known, "prepare")

    async def arenew(self, checkpoint_id: str, deadline: float) -> None:
        await self._acall("control_renew", deadline, checkpoint_id, deadline, self._incarnation)

    async def acommit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        brief: bool = False,
    ) -> CommitReply:
        known = self._incarnation
        args = (checkpoint_id, _url(store), deadline, _packed(scope), known, brief or self.brief_commits)
        reply: CommitReply = await self._acall("control_commit", deadline, *args)
        return self._observe(reply, known, "commit")

    async def arestore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply:
        args = (checkpoint_id, source_checkpoint_id, _url(store), deadline, _packed(scope))
        reply: RestoreReply = await self._acall("control_restore", deadline, *args)
        self._incarnation = reply.incarnation
        return reply

    async def aresume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        reply: ResumeReply = await self._acall("control_resume", deadline, checkpoint_id, deadline)
        self._incarnation = reply.incarnation
        return reply

    async def aretire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        batch = pack_executions(executions)
        if batch:
            await self._acall("control_retire", deadline, batch, deadline)


def _url(store: str | ObjectStore) -> str:
    return store if isinstance(store, str) else store.url


def _packed(scope: Sequence[ExecutionId] | None) -> list[str] | None:
    """A scope in the compact form of the HTTP routes' ``scope_ids``: one short string per
    execution pickles and unpickles in a fraction of what a list of models costs."""
    return None if scope is None else pack_executions(scope)
