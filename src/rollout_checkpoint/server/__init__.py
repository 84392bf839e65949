"""The HTTP control plane: a router any FastAPI app mounts, its wire format, awaitable
admission waits for async handlers, the remote participant the coordinator drives, and servers
with several worker processes (one merged participant, session routing between workers)."""

from ._admission import AsyncAdmission, run_blocking
from ._client import RemoteParticipant
from ._router import (
    checkpoint_router,
    control_app,
    error_response,
    install_error_handlers,
    install_participant,
)
from ._routing import OWNER_COOKIE, OWNER_HEADER, ROLLOUT_PATH_PREFIX, VIA_HEADER, OwnerSigner, WorkerFrontend
from ._serve import TOKEN_ENV, ServedApp, WorkerContext, group_app, run_server, serve_thread, worker_app
from ._tokens import TOKENS_ROUTE_PREFIX, RemoteTokenStore, token_store_app, token_store_router
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
from ._workers import STAGING_PREFIX, WorkerGroup, WorkerInfo, assign_owners

__all__ = [
    "CHECKPOINT_ROUTE_PREFIX",
    "MAX_DEADLINE_HORIZON_S",
    "OWNER_COOKIE",
    "OWNER_HEADER",
    "ROLLOUT_PATH_PREFIX",
    "STAGING_PREFIX",
    "TOKENS_ROUTE_PREFIX",
    "TOKEN_ENV",
    "VIA_HEADER",
    "OwnerSigner",
    "ServedApp",
    "WorkerContext",
    "WorkerFrontend",
    "WorkerGroup",
    "WorkerInfo",
    "assign_owners",
    "group_app",
    "run_server",
    "serve_thread",
    "worker_app",
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
    "RemoteTokenStore",
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
    "install_error_handlers",
    "install_participant",
    "run_blocking",
    "status_for",
    "token_store_app",
    "token_store_router",
]
