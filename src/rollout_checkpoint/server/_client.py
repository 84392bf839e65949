"""A remote participant for the coordinator: the control routes over httpx.

:class:`RemoteParticipant` satisfies :class:`~rollout_checkpoint.protocol.ParticipantControl`, so a
:class:`~rollout_checkpoint.coordinator.Coordinator` drives servers in other processes exactly
as it drives in-process participants. Each call's HTTP timeout comes from the operation's own
absolute deadline; transport failures and 5xx answers are retried until the deadline (every
operation is idempotent, so a repeat after a lost answer is safe; see ``_http``); a refusal
comes back as the SDK's typed error, its message naming the participant that refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

from ..errors import CheckpointError, ParticipantRestartedError
from ..ids import ExecutionId, pack_executions, pack_text
from ..protocol import (
    Cancellation,
    Capabilities,
    CommitReply,
    ParticipantStatus,
    Phase,
    PrepareReport,
    Publication,
    RestoreReply,
    ResumeReply,
)
from ..store import ObjectStore
from ._http import JsonClient, SliceEnded
from ._wire import (
    CHECKPOINT_ROUTE_PREFIX,
    ForgetReply,
    ParticipantUnreachableError,
    RenewReply,
    RetireReply,
)

__all__ = ["PREPARE_SLICE_SECONDS", "RemoteParticipant"]


R = TypeVar("R", bound=PrepareReport | CommitReply | RestoreReply | ResumeReply)

PREPARE_SLICE_SECONDS = 1.0
"""How long a cancellable remote prepare waits for an answer before it repeats the call (and how
long, at most, it keeps a server waiting after its own caller went away)."""


class RemoteParticipant:
    """One participant behind its server's control routes.

    ``base_url`` is the server (``http://127.0.0.1:8001``); ``token`` its control token.
    ``attempts`` bounds the tries of one call (never past its deadline); ``default_timeout_s``
    applies to the two calls without a deadline (``status``, ``forget``). ``uds`` reaches the
    server over a Unix socket (a worker group's hops); ``transport`` lets a caller pass an httpx
    transport instead (``https`` URLs and a caller's transport go through httpx, plain ``http``
    and Unix sockets through kept-alive ``http.client`` connections). ``capabilities``, when known, name the
    participant without asking it (and a server answering with others is refused).
    ``brief_commits``: every commit asks for a brief reply (no executions and restarts lists,
    which are in the committed manifest's ``extra``), for a caller that does not read them: the
    coordinator never does, and over a worker group the lists would travel every hop.

    Incarnations: the client remembers the incarnation of the last answer it read
    (:attr:`incarnation`). An operation whose call had to be repeated (no answer, a 5xx, a
    prepare's next slice) and whose answer then comes from another incarnation than the one
    known when it started is refused with
    :class:`~rollout_checkpoint.errors.ParticipantRestartedError`: the repeat landed on a
    restarted process, and what the first try did died with the old one.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        prefix: str = CHECKPOINT_ROUTE_PREFIX,
        attempts: int = 4,
        default_timeout_s: float = 30.0,
        answer_margin_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        uds: str | None = None,
        clock: Callable[[], float] = time.time,
        capabilities: Capabilities | None = None,
        brief_commits: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.brief_commits = brief_commits
        self._http = JsonClient(
            self.base_url,
            token=token,
            prefix=prefix,
            attempts=attempts,
            default_timeout_s=default_timeout_s,
            answer_margin_s=answer_margin_s,
            transport=transport,
            uds=uds,
            clock=clock,
            describe=lambda: self.name,
        )
        self._capabilities: Capabilities | None = capabilities
        self._incarnation: str | None = None
        self._scope_text = True  # until a server of an older version refuses the field

    def __repr__(self) -> str:
        return f"RemoteParticipant({self.base_url!r})"

    @property
    def name(self) -> str:
        """``kind/instance @ url`` once known (used in every error message)."""
        caps = self._capabilities
        return f"{caps.kind}/{caps.instance} at {self.base_url}" if caps else self.base_url

    @property
    def incarnation(self) -> str | None:
        """The incarnation of the last answer read (``None`` before the first)."""
        return self._incarnation

    def close(self) -> None:
        self._http.close()

    def _call(
        self,
        path: str,
        body: dict[str, Any],
        reply: type[R],
        deadline: float,
        known: str | None,
        *,
        answer_by: float | None = None,
        repeated: bool = False,
    ) -> R:
        """One control call whose answer carries an incarnation (checked: see the class doc)."""
        tries: list[int] = []
        answer = self._http.call("POST", path, body, reply, deadline, answer_by=answer_by, tries=tries)
        self._observe(answer.incarnation, known, repeated or tries[-1] > 1, path)
        return answer

    def _observe(self, incarnation: str, known: str | None, repeated: bool, path: str) -> None:
        self._incarnation = incarnation
        if repeated and known is not None and incarnation != known:
            raise ParticipantRestartedError(
                f"{self.name}: {path.strip('/')} was repeated and answered by another incarnation "
                f"({known} -> {incarnation}): the participant restarted during the call, and what "
                "the first try did died with it",
                participant=self.name,
                expected=known,
                actual=incarnation,
            )

    def __enter__(self) -> RemoteParticipant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- ParticipantControl ---------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Fetched from ``/status`` once; a server's capabilities never change while it runs."""
        if self._capabilities is None:
            self._capabilities = self.status().capabilities
        return self._capabilities

    def status(self) -> ParticipantStatus:
        reply = self._http.call("GET", "/status", None, ParticipantStatus, None)
        self._incarnation = reply.incarnation  # an observation: the caller compares
        if self._capabilities is not None and reply.capabilities != self._capabilities:
            raise ParticipantUnreachableError(
                f"{self.name}: capabilities changed (another server now answers at this address)",
                participant=self.name,
            )
        self._capabilities = reply.capabilities
        return reply

    def prepare(
        self, checkpoint_id: str, deadline: float, *, cancel: Cancellation | None = None
    ) -> PrepareReport:
        """The remote prepare. With ``cancel`` (a router running this on behalf of a client that
        may go away: a worker frontend, a worker group), the wait for the answer is cut into
        slices of :data:`PREPARE_SLICE_SECONDS`: the same prepare (same id and deadline,
        idempotent) is repeated after each until ``cancel`` is cancelled, when this answers not
        ready; the connection a slice gives up lets the server cancel its own wait."""
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        known = self._incarnation
        if cancel is None:
            return self._call("/prepare", body, PrepareReport, deadline, known)
        repeated = False
        while not cancel.cancelled:
            answer_by = self._http.clock() + PREPARE_SLICE_SECONDS
            try:
                return self._call(
                    "/prepare", body, PrepareReport, deadline, known, answer_by=answer_by, repeated=repeated
                )
            except SliceEnded:
                repeated = True
                continue
        return PrepareReport(
            checkpoint_id=checkpoint_id,
            phase=Phase.PREPARING,
            ready=False,
            blockers=(f"{self.name}: prepare cancelled (its caller went away)",),
            blocker_count=1,
            incarnation=known or "0" * 32,  # nobody reads it: the caller went away
        )

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        self._http.call("POST", "/renew", body, RenewReply, deadline)

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
        *,
        publication: Publication = "sync",
        part: str | None = None,
        brief: bool = False,
    ) -> CommitReply:
        """The remote commit. The scope travels in compact form (``scope_text``: one
        ``rollout_id#attempt`` line per execution, checked in one pass by the server; a server
        older than that field is sent ``scope_ids``, one string per execution, from its refusal
        on).
        ``part`` and ``brief`` are a worker group's: write the archive as that part of the
        component, and answer without the executions and restarts lists (the group reads them
        from the part's manifest, which it reads anyway)."""
        body: dict[str, Any] = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline, "store": _url(store)}
        if publication != "sync":  # a synchronous commit's body is what servers always took
            body["publication"] = publication
        if part is not None:  # a worker group's worker: its share as a part of the component
            body["part"] = part
        if brief or self.brief_commits:
            body["brief"] = True
        if scope is not None and self._scope_text:
            try:
                return self._call(
                    "/commit",
                    {**body, "scope_text": pack_text(scope)},
                    CommitReply,
                    deadline,
                    self._incarnation,
                )
            except CheckpointError as exc:
                if not _refused_field(exc, "scope_text"):
                    raise
                self._scope_text = False  # an older server: nothing was applied, ask again
        if scope is not None:
            body["scope_ids"] = pack_executions(scope)
        return self._call("/commit", body, CommitReply, deadline, self._incarnation)

    def collect(self, checkpoint_id: str, deadline: float, *, brief: bool = False) -> CommitReply:
        """Wait (until ``deadline``) for the background upload of an asynchronous commit.
        ``brief`` (or ``brief_commits``): the reply lists no executions and restarts."""
        body: dict[str, Any] = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        if brief or self.brief_commits:
            body["brief"] = True
        return self._call("/collect", body, CommitReply, deadline, self._incarnation)

    def restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> RestoreReply:
        body = {
            "checkpoint_id": checkpoint_id,
            "source_checkpoint_id": source_checkpoint_id,
            "deadline_ts": deadline,
            "store": _url(store),
            "scope": _executions(scope),
        }
        return self._call("/restore", body, RestoreReply, deadline, self._incarnation)

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        return self._call("/resume", body, ResumeReply, deadline, self._incarnation)

    def abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        return self._call("/abort-restore", body, ResumeReply, deadline, self._incarnation)

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        batch = _executions(executions) or []
        if batch:
            self._http.call(
                "POST", "/retire", {"executions": batch, "deadline_ts": deadline}, RetireReply, deadline
            )

    def forget(self, rollout_ids: Sequence[str]) -> None:
        self._http.call("POST", "/forget", {"rollout_ids": list(rollout_ids)}, ForgetReply, None)


def _url(store: str | ObjectStore) -> str:
    return store if isinstance(store, str) else store.url


def _executions(executions: Sequence[ExecutionId] | None) -> list[dict[str, Any]] | None:
    if executions is None:
        return None
    return [{"rollout_id": e.rollout_id, "attempt": e.attempt} for e in executions]


def _refused_field(exc: CheckpointError, field: str) -> bool:
    """A server's 422 refusing ``field`` of a body as unknown (a server of an older version,
    whose request models forbid extra fields): the request changed nothing there."""
    return (
        exc.details.get("status") == 422 and f"body.{field}" in exc.message and "Extra inputs" in exc.message
    )
