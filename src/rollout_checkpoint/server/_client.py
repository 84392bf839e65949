"""A remote participant for the coordinator: the control routes over httpx.

:class:`RemoteParticipant` satisfies :class:`~rollout_checkpoint.control.ParticipantControl`, so a
:class:`~rollout_checkpoint.coordinator.Coordinator` drives servers in other processes exactly
as it drives in-process participants. Each call's HTTP timeout comes from the operation's own
absolute deadline (plus a small margin for the answer to travel); transport failures and 5xx
answers are retried with tenacity until the deadline (every operation is idempotent, so a
repeat after a lost answer is safe); a refusal comes back as the SDK's typed error, its message
naming the participant that refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)
from tenacity.stop import stop_base

from ..control import (
    Capabilities,
    CommitReply,
    ParticipantStatus,
    PrepareReport,
    RestoreReply,
    ResumeReply,
)
from ..errors import CheckpointError, DeadlineExceededError
from ..ids import ExecutionId
from ..store import ObjectStore
from ._wire import (
    CHECKPOINT_ROUTE_PREFIX,
    ForgetReply,
    ParticipantUnreachableError,
    RenewReply,
    RetireReply,
    error_from_wire,
)

__all__ = ["RemoteParticipant"]

M = TypeVar("M", bound=BaseModel)

_RETRY_STATUSES = frozenset({502, 503, 504})


class _Transient(Exception):
    """A failure worth repeating: no answer, or a gateway / unavailable status."""

    def __init__(self, reason: str, cause: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause


class _StopAt(stop_base):
    """Stop retrying once the operation's deadline has passed."""

    def __init__(self, clock: Callable[[], float], end: float) -> None:
        self._clock = clock
        self._end = end

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._clock() >= self._end


class RemoteParticipant:
    """One participant behind its server's control routes.

    ``base_url`` is the server (``http://127.0.0.1:8001``); ``token`` its control token.
    ``attempts`` bounds the tries of one call (never past its deadline); ``default_timeout_s``
    applies to the two calls without a deadline (``status``, ``forget``). ``transport`` lets a
    caller pass an httpx transport (a Unix socket). ``capabilities``, when known, name the
    participant without asking it (and a server answering with others is refused).
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
        clock: Callable[[], float] = time.time,
        capabilities: Capabilities | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.default_timeout_s = default_timeout_s
        self.answer_margin_s = answer_margin_s
        self.clock = clock
        self._client = httpx.Client(
            base_url=f"{self.base_url}{prefix}",
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            trust_env=False,
        )
        self._capabilities: Capabilities | None = capabilities

    def __repr__(self) -> str:
        return f"RemoteParticipant({self.base_url!r})"

    @property
    def name(self) -> str:
        """``kind/instance @ url`` once known (used in every error message)."""
        caps = self._capabilities
        return f"{caps.kind}/{caps.instance} at {self.base_url}" if caps else self.base_url

    def close(self) -> None:
        self._client.close()

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
        reply = self._call("GET", "/status", None, ParticipantStatus, None)
        if self._capabilities is not None and reply.capabilities != self._capabilities:
            raise ParticipantUnreachableError(
                f"{self.name}: capabilities changed (another server now answers at this address)",
                participant=self.name,
            )
        self._capabilities = reply.capabilities
        return reply

    def prepare(self, checkpoint_id: str, deadline: float) -> PrepareReport:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        return self._call("POST", "/prepare", body, PrepareReport, deadline)

    def renew(self, checkpoint_id: str, deadline: float) -> None:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        self._call("POST", "/renew", body, RenewReply, deadline)

    def commit(
        self,
        checkpoint_id: str,
        store: str | ObjectStore,
        deadline: float,
        scope: Sequence[ExecutionId] | None = None,
    ) -> CommitReply:
        body = {
            "checkpoint_id": checkpoint_id,
            "deadline_ts": deadline,
            "store": _url(store),
            "scope": _executions(scope),
        }
        return self._call("POST", "/commit", body, CommitReply, deadline)

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
        return self._call("POST", "/restore", body, RestoreReply, deadline)

    def resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        body = {"checkpoint_id": checkpoint_id, "deadline_ts": deadline}
        return self._call("POST", "/resume", body, ResumeReply, deadline)

    def retire(self, executions: Sequence[ExecutionId], deadline: float) -> None:
        batch = _executions(executions) or []
        if batch:
            self._call(
                "POST", "/retire", {"executions": batch, "deadline_ts": deadline}, RetireReply, deadline
            )

    def forget(self, rollout_ids: Sequence[str]) -> None:
        self._call("POST", "/forget", {"rollout_ids": list(rollout_ids)}, ForgetReply, None)

    # -- transport ----------------------------------------------------------------------------------
    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, reply: type[M], deadline: float | None
    ) -> M:
        end = deadline if deadline is not None else self.clock() + self.default_timeout_s

        retrying = Retrying(
            stop=stop_after_attempt(self.attempts) | _StopAt(self.clock, end),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._once(method, path, body, reply, end)
        except _Transient as exc:
            if deadline is not None and self.clock() >= deadline:
                raise DeadlineExceededError(
                    f"{self.name}: no answer to {path.strip('/')} before the deadline ({exc.reason})",
                    participant=self.name,
                ) from exc.cause
            raise ParticipantUnreachableError(
                f"{self.name}: {path.strip('/')} failed after {self.attempts} tries ({exc.reason})",
                participant=self.name,
            ) from exc.cause
        raise AssertionError("unreachable")  # pragma: no cover - tenacity either returns or raises

    def _once(self, method: str, path: str, body: dict[str, Any] | None, reply: type[M], end: float) -> M:
        timeout = max(0.05, end - self.clock()) + self.answer_margin_s
        try:
            response = self._client.request(method, path, json=body, timeout=timeout)
        except httpx.TransportError as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}", exc) from exc
        if response.status_code in _RETRY_STATUSES:
            raise _Transient(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise self._refusal(path, response)
        try:
            return reply.model_validate_json(response.content)
        except ValueError as exc:
            raise ParticipantUnreachableError(
                f"{self.name}: {path.strip('/')} answered a body that is not a {reply.__name__}: {exc}",
                participant=self.name,
            ) from None

    def _refusal(self, path: str, response: httpx.Response) -> CheckpointError:
        op = path.strip("/")
        try:
            error = response.json()["error"]
            code, detail = str(error["code"]), str(error["detail"])
        except (ValueError, KeyError, TypeError):
            return ParticipantUnreachableError(
                f"{self.name}: {op} answered HTTP {response.status_code} without an error body",
                participant=self.name,
                status=response.status_code,
            )
        return error_from_wire(
            code, f"{self.name}: {op} refused: {detail}", participant=self.name, status=response.status_code
        )


def _url(store: str | ObjectStore) -> str:
    return store if isinstance(store, str) else store.url


def _executions(executions: Sequence[ExecutionId] | None) -> list[dict[str, Any]] | None:
    if executions is None:
        return None
    return [{"rollout_id": e.rollout_id, "attempt": e.attempt} for e in executions]
