"""The wire format of the control routes: request and reply bodies, the error envelope, and
the mapping between the SDK's error codes and HTTP statuses (shared by server and client).

Every body forbids unknown fields, so a typo is a 422 naming the field instead of an
option silently ignored. Deadlines are absolute epoch seconds (``deadline_ts``, NeMo Gym's
name), finite and at most :data:`MAX_DEADLINE_HORIZON_S` ahead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..errors import (
    CheckpointError,
    DeadlineTooFarError,
    IntegrityError,
    InvalidIdentifierError,
    InvalidRecordError,
    TransientStoreError,
    UnsupportedSchemaError,
)
from ..ids import ExecutionId, Identifier, PackedExecutions, check_packed, check_packed_text
from ..protocol import Publication

__all__ = [
    "CHECKPOINT_ROUTE_PREFIX",
    "MAX_DEADLINE_HORIZON_S",
    "CheckpointRequest",
    "CollectRequest",
    "CommitRequest",
    "ErrorBody",
    "ErrorReply",
    "ForgetReply",
    "ForgetRequest",
    "ParticipantUnreachableError",
    "RemoteParticipantError",
    "RenewReply",
    "RestoreRequest",
    "RetireReply",
    "RetireRequest",
    "StoreMismatchError",
    "UnauthorizedError",
    "UnsupportedOperationError",
    "error_from_wire",
    "status_for",
]

CHECKPOINT_ROUTE_PREFIX = "/ng-control/v1/checkpoint"
"""NeMo Gym's prefix of the bearer-protected checkpoint control routes."""

MAX_DEADLINE_HORIZON_S = 7 * 24 * 3600.0
"""A deadline further ahead than this is refused (422): no checkpoint legitimately waits a
week, and an unbounded one would overflow the lease timer."""

UNAUTHORIZED = "unauthorized"
INVALID_REQUEST = "invalid_request"
INTERNAL_ERROR = "internal_error"


class UnauthorizedError(CheckpointError):
    """The control token was missing or wrong (HTTP 401); nothing was applied."""

    code = UNAUTHORIZED


class StoreMismatchError(CheckpointError):
    """The request names a store other than the one this server writes to."""

    code = "store_mismatch"


class UnsupportedOperationError(CheckpointError):
    """The participant behind this server does not implement the operation."""

    code = "unsupported_operation"


class ParticipantUnreachableError(CheckpointError):
    """A remote participant gave no answer (connection refused, timeouts, 5xx) after retries."""

    code = "participant_unreachable"


class RemoteParticipantError(CheckpointError):
    """A remote participant answered with an error code this client does not know."""

    code = "remote_error"


def _in_horizon(value: float) -> float:
    if value > time.time() + MAX_DEADLINE_HORIZON_S:
        raise ValueError(f"deadline_ts is more than {MAX_DEADLINE_HORIZON_S:.0f} s ahead")
    return value


Deadline = Annotated[
    float,
    Field(gt=0, allow_inf_nan=False, strict=True, description="absolute deadline, epoch seconds"),
    AfterValidator(_in_horizon),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointRequest(_Body):
    """``prepare``, ``renew`` and ``resume``: the checkpoint id and its absolute deadline."""

    checkpoint_id: Identifier
    deadline_ts: Deadline


class _StoreScope(CheckpointRequest):
    store: str | None = Field(
        default=None, max_length=4096, description="store URL; must be the server's own store if it has one"
    )
    scope: list[ExecutionId] | None = Field(
        default=None, description="executions the coordinator continues (default: all)"
    )
    scope_ids: list[str] | None = Field(
        default=None,
        description="the scope in compact form, 'rollout_id#attempt' strings (at most one of "
        "scope, scope_ids and scope_text)",
    )
    scope_text: str | None = Field(
        default=None,
        description="the scope as one string, 'rollout_id#attempt' and a newline per execution: "
        "what this SDK's client sends (at most one of scope, scope_ids and scope_text)",
    )
    _executions: Sequence[ExecutionId] | None = PrivateAttr(default=None)

    @field_validator("scope_ids", "scope_text")
    @classmethod
    def _compact(cls, value: list[str] | str | None, info: ValidationInfo) -> list[str] | str | None:
        """One pass over the whole list (``scope_ids``) or text (``scope_text``)."""
        if value is not None:
            try:
                if isinstance(value, str):
                    check_packed_text(value, str(info.field_name))
                else:
                    check_packed(value, str(info.field_name))
            except CheckpointError as exc:
                raise ValueError(exc.message) from None
        return value

    @model_validator(mode="after")
    def _one_scope(self) -> _StoreScope:
        if sum(s is not None for s in (self.scope, self.scope_ids, self.scope_text)) > 1:
            raise ValueError("name the scope once: scope, scope_ids or scope_text")
        if self.scope_text is not None:
            self._executions = PackedExecutions(text=self.scope_text)  # split when first read
        elif self.scope_ids is not None:
            self._executions = PackedExecutions(self.scope_ids)  # unpacked when first read
        elif self.scope is not None:
            self._executions = list(self.scope)
        return self

    def executions(self) -> Sequence[ExecutionId] | None:
        """The scope (from ``scope`` or ``scope_ids``); ``None``: all."""
        return self._executions


class CommitRequest(_StoreScope):
    publication: Publication = Field(
        default="sync",
        description="sync: upload before answering; async: freeze, answer 'frozen', upload in the "
        "background (wait for it with /collect)",
    )
    part: Identifier | None = Field(
        default=None,
        description="write the archive as this part of the component (<component>/parts/<part>): "
        "a worker group's worker, whose group refers to it",
    )
    brief: bool = Field(
        default=False,
        strict=True,
        description="answer without the executions and restarts lists (the caller reads them from "
        "the committed manifest's extra): a worker group's worker",
    )


class CollectRequest(CheckpointRequest):
    brief: bool = Field(
        default=False,
        strict=True,
        description="answer without the executions and restarts lists (the caller reads them from "
        "the committed manifest's extra): a worker group, or a coordinator asking brief replies",
    )


class RestoreRequest(_StoreScope):
    source_checkpoint_id: Identifier


class RetireRequest(_Body):
    executions: list[ExecutionId] = Field(min_length=1)
    deadline_ts: Deadline


class ForgetRequest(_Body):
    rollout_ids: list[Identifier]


class RenewReply(_Body):
    checkpoint_id: Identifier
    deadline_ts: float


class RetireReply(_Body):
    retired: int = Field(ge=0)


class ForgetReply(_Body):
    forgotten: int = Field(ge=0)


class ErrorBody(_Body):
    code: str
    detail: str


class ErrorReply(_Body):
    """Every refusal: ``{"error": {"code", "detail"}}`` with the SDK's stable ``code``."""

    error: ErrorBody


_UNPROCESSABLE: tuple[type[CheckpointError], ...] = (
    DeadlineTooFarError,
    InvalidIdentifierError,
    InvalidRecordError,
    IntegrityError,
    UnsupportedSchemaError,
)


def status_for(error: CheckpointError) -> int:
    """HTTP status of an SDK error: 422 for bad input or bad stored state, 503 for a transient
    store failure (worth retrying), 409 for every protocol refusal (NeMo Gym's statuses)."""
    if isinstance(error, _UNPROCESSABLE):
        return 422
    if isinstance(error, TransientStoreError):
        return 503
    return 409


def _codes() -> dict[str, type[CheckpointError]]:
    found: dict[str, type[CheckpointError]] = {}
    pending: list[type[CheckpointError]] = [CheckpointError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def error_from_wire(code: str, detail: str, **details: Any) -> CheckpointError:
    """The typed SDK error for an error body (an unknown code becomes :class:`RemoteParticipantError`)."""
    cls = _codes().get(code)
    if cls is None:
        return RemoteParticipantError(detail, remote_code=code, **details)
    try:
        return cls(detail, **details)
    except TypeError:
        return RemoteParticipantError(detail, remote_code=code, **details)
