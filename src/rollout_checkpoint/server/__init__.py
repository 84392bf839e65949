"""The HTTP control plane: a router any FastAPI app mounts, its wire format, awaitable
admission waits for async handlers, and the remote participant the coordinator drives."""

from ._admission import AsyncAdmission, run_blocking
from ._client import RemoteParticipant
from ._router import checkpoint_router, control_app, error_response, install_participant
from ._wire import (
    CHECKPOINT_ROUTE_PREFIX,
    MAX_DEADLINE_HORIZON_S,
    CheckpointRequest,
    CommitRequest,
    ErrorBody,
    ErrorReply,
    ForgetReply,
    ForgetRequest,
    ParticipantUnreachableError,
    RemoteParticipantError,
    RenewReply,
    RestoreRequest,
    RetireReply,
    RetireRequest,
    StoreMismatchError,
    UnauthorizedError,
    UnsupportedOperationError,
    error_from_wire,
    status_for,
)

__all__ = [
    "CHECKPOINT_ROUTE_PREFIX",
    "MAX_DEADLINE_HORIZON_S",
    "AsyncAdmission",
    "CheckpointRequest",
    "CommitRequest",
    "ErrorBody",
    "ErrorReply",
    "ForgetReply",
    "ForgetRequest",
    "ParticipantUnreachableError",
    "RemoteParticipant",
    "RemoteParticipantError",
    "RenewReply",
    "RestoreRequest",
    "RetireReply",
    "RetireRequest",
    "StoreMismatchError",
    "UnauthorizedError",
    "UnsupportedOperationError",
    "checkpoint_router",
    "control_app",
    "error_from_wire",
    "error_response",
    "install_participant",
    "run_blocking",
    "status_for",
]
