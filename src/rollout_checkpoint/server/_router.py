"""The checkpoint control routes as a FastAPI router any app mounts (NeMo Gym's names).

``GET /status`` and ``POST /prepare /renew /commit /collect /restore /resume /abort-restore /retire
/forget`` under
:data:`CHECKPOINT_ROUTE_PREFIX`, each protected by a bearer token compared in constant time,
each wrapping one operation of any :class:`~rollout_checkpoint.protocol.ParticipantControl`.

The router needs no app-level exception handlers: its route class turns every refusal into
``{"error": {"code", "detail"}}`` itself (401 unauthorized, 422 malformed body, 409 protocol
refusal, 503 transient store failure), so it behaves the same in any app that mounts it.
Blocking participant operations (prepare waits, commit exports) run in worker threads, never
on the event loop. A prepare whose client disconnects stops waiting at once (its thread is
freed; see :class:`~rollout_checkpoint.protocol.Cancellation`).
"""

from __future__ import annotations

import hmac
import inspect
import logging
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, BackgroundTasks, FastAPI, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CheckpointError
from ..protocol import (
    AsyncParticipantControl,
    Cancellation,
    CommitReply,
    ParticipantControl,
    ParticipantStatus,
    PrepareReport,
    RestoreReply,
    ResumeReply,
    launches_deferred,
)
from ..store import ObjectStore, open_store
from ..telemetry import extracted, log_fields
from ._token_rules import check_server_token
from ._wire import (
    CHECKPOINT_ROUTE_PREFIX,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    UNAUTHORIZED,
    CheckpointRequest,
    CollectRequest,
    CommitRequest,
    ErrorReply,
    ForgetReply,
    ForgetRequest,
    RenewReply,
    RestoreRequest,
    RetireReply,
    RetireRequest,
    StoreMismatchError,
    UnsupportedOperationError,
    status_for,
)

__all__ = [
    "CONTROL_THREADS",
    "checkpoint_router",
    "control_app",
    "error_response",
    "install_error_handlers",
    "install_participant",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

_STORES_KEPT = 32

CONTROL_THREADS = 32
"""Worker threads one router may occupy at once for the operations that wait (prepare, commit,
collect, restore: a prepare holds one until it is ready)."""

QUICK_THREADS = 8
"""Worker threads of their own for the operations that never wait (status, resume, renew,
abort-restore, retire, forget), so a pile of parked prepares can never lock out the abort."""

DISCONNECT_POLL_SECONDS = 0.1
"""How often a waiting prepare checks that its client is still connected."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorReply, "description": "missing or wrong bearer token; nothing applied"},
    409: {"model": ErrorReply, "description": "refused by the protocol (stable error code)"},
    422: {"model": ErrorReply, "description": "malformed body or invalid stored state"},
}

_bearer = HTTPBearer(auto_error=False, scheme_name="ControlToken", description="the server's control token")


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one error shape of the control plane."""
    return JSONResponse({"error": {"code": code, "detail": detail}}, status_code=status, headers=headers)


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        loc = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{loc}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "malformed request"


class _Unauthorized(Exception):
    pass


class _TokenCheck:
    """Constant-time bearer check. Holds the token privately; its repr never shows it."""

    def __init__(self, token: str) -> None:
        self._token = check_server_token(token).encode("ascii")

    def __repr__(self) -> str:
        return "_TokenCheck(<redacted>)"

    def request_ok(self, request: Request) -> bool:
        """Exactly one ``Authorization`` header, a bearer token that matches (two headers, even
        one right and one wrong, are refused: proxies disagree on which one wins)."""
        headers = request.headers.getlist("authorization")
        return len(headers) == 1 and self.header_ok(headers[0])

    def header_ok(self, authorization: str | None) -> bool:
        scheme, _, credentials = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and self.matches(credentials.strip())

    def matches(self, credentials: str) -> bool:
        return hmac.compare_digest(credentials.encode("utf-8", "surrogateescape"), self._token)

    async def __call__(
        self, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
    ) -> None:
        # Also checked by the route class before the body is parsed; kept as a dependency so
        # the OpenAPI document declares the security scheme on every route.
        if credentials is None or not self.matches(credentials.credentials):
            raise _Unauthorized()


def _route_class(check: _TokenCheck) -> type[APIRoute]:
    class ControlRoute(APIRoute):
        """Authenticates before anything is parsed; maps every failure to the error shape."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                if not check.request_ok(request):
                    return _unauthorized()
                try:
                    with extracted(request.headers):  # the caller's trace continues here
                        return await handler(request)
                except _Unauthorized:
                    return _unauthorized()
                except RequestValidationError as exc:
                    return error_response(422, INVALID_REQUEST, _describe(exc))
                except HTTPException as exc:
                    # FastAPI's own refusals, e.g. a body it cannot even decode (400)
                    status = 422 if exc.status_code == 400 else exc.status_code
                    return error_response(status, INVALID_REQUEST, f"body: {exc.detail}")
                except CheckpointError as exc:
                    return error_response(status_for(exc), exc.code, exc.message)
                except Exception:
                    log.exception(
                        "checkpoint control %s failed unexpectedly",
                        request.url.path,
                        extra=log_fields(error_code=INTERNAL_ERROR),
                    )
                    return error_response(500, INTERNAL_ERROR, "internal error; see the server log")

            return guarded

    return ControlRoute


def _unauthorized() -> JSONResponse:
    return error_response(
        401, UNAUTHORIZED, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
    )


def checkpoint_router(
    participant: ParticipantControl,
    *,
    token: str,
    store: str | ObjectStore | None = None,
    prefix: str = CHECKPOINT_ROUTE_PREFIX,
    threads: int = CONTROL_THREADS,
    store_options: Mapping[str, Any] | None = None,
) -> APIRouter:
    """The control routes of ``participant``, protected by ``token``.

    ``store`` is where commits go and restores read from; a request naming another store is
    refused (``store_mismatch``). Without one the request's store URL is opened, with
    ``store_options`` (``accept_unsafe_store=True`` in the worker of a server that accepts it).
    """
    check = _TokenCheck(token)
    configured = open_store(store) if store is not None else None
    limiter = anyio.CapacityLimiter(threads)
    quick_limiter = anyio.CapacityLimiter(QUICK_THREADS)
    stores: dict[str, ObjectStore] = {}

    async def blocking(fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=limiter)

    async def quick(fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=quick_limiter)

    def target(requested: str | None) -> str | ObjectStore:
        if configured is not None:
            if requested is not None and requested.rstrip("/") != configured.url.rstrip("/"):
                raise StoreMismatchError(
                    f"this server writes to {configured.url}, not {requested}", store=configured.url
                )
            return configured
        if requested is None:
            raise StoreMismatchError("this server has no store of its own; name one in 'store'")
        opened = stores.get(requested)
        if opened is None:  # opening an S3 store builds a client: once per URL, not per call
            opened = open_store(requested, **dict(store_options or {}))
            if len(stores) >= _STORES_KEPT:
                stores.pop(next(iter(stores)))
            stores[requested] = opened
        return opened

    router = APIRouter(
        prefix=prefix,
        tags=["checkpoint"],
        route_class=_route_class(check),
        dependencies=[Security(check)],
        responses=_ERRORS,
    )

    @router.get("/status", response_model=ParticipantStatus, summary="capabilities, phase and counts")
    async def status() -> ParticipantStatus:
        return await quick(participant.status)

    cancellable = "cancel" in inspect.signature(participant.prepare).parameters
    briefable = "brief" in inspect.signature(participant.commit).parameters

    @router.post("/prepare", response_model=PrepareReport, summary="close admission, wait for boundaries")
    async def prepare(body: CheckpointRequest, request: Request) -> PrepareReport:
        if not cancellable:
            return await blocking(participant.prepare, body.checkpoint_id, body.deadline_ts)
        cancel = Cancellation()
        call: Callable[[str, float], PrepareReport] = partial(participant.prepare, cancel=cancel)  # type: ignore[call-arg]
        report: PrepareReport | None = None
        error: Exception | None = None
        async with anyio.create_task_group() as watching:
            watching.start_soon(_cancel_on_disconnect, request, cancel)
            try:
                report = await blocking(call, body.checkpoint_id, body.deadline_ts)
            except Exception as exc:  # raised as is below, not wrapped in an exception group
                error = exc
            finally:
                watching.cancel_scope.cancel()
        if error is not None:
            raise error
        assert report is not None
        return report

    @router.post("/renew", response_model=RenewReply, summary="extend the active checkpoint's lease")
    async def renew(body: CheckpointRequest) -> RenewReply:
        method = getattr(participant, "renew", None)
        if method is None:
            raise UnsupportedOperationError("this participant has no lease to renew")
        await quick(method, body.checkpoint_id, body.deadline_ts)
        return RenewReply(checkpoint_id=body.checkpoint_id, deadline_ts=body.deadline_ts)

    def publisher() -> AsyncParticipantControl:
        if not isinstance(participant, AsyncParticipantControl):
            raise UnsupportedOperationError("this participant cannot publish asynchronously")
        return participant

    @router.post("/commit", response_model=CommitReply, summary="export once, manifest last (or freeze)")
    async def commit(body: CommitRequest) -> CommitReply:
        store = target(body.store)
        method: Any = participant.commit
        options: dict[str, Any] = {}
        if body.publication == "async":
            method, options["publication"] = publisher().commit, "async"
        if body.part is not None:  # a worker group's worker writes its share as a part
            options["part"] = body.part
        if body.brief and briefable:  # a remote participant or a worker group: brief below too
            options["brief"] = True
        call = partial(method, **options)
        reply: CommitReply = await blocking(
            call, body.checkpoint_id, store, body.deadline_ts, body.executions()
        )
        if body.brief:  # the caller reads them from the committed manifest (a worker group)
            reply = reply.model_copy(update={"executions": (), "restarts": ()})
        return reply

    @router.post("/collect", response_model=CommitReply, summary="wait for an asynchronous commit's upload")
    async def collect(body: CollectRequest) -> CommitReply:
        reply: CommitReply = await blocking(publisher().collect, body.checkpoint_id, body.deadline_ts)
        if body.brief:  # the caller reads them from the committed manifest
            reply = reply.model_copy(update={"executions": (), "restarts": ()})
        return reply

    @router.post("/restore", response_model=RestoreReply, summary="install a checkpoint as attempt N+1")
    async def restore(body: RestoreRequest) -> RestoreReply:
        return await blocking(
            participant.restore,
            body.checkpoint_id,
            body.source_checkpoint_id,
            target(body.store),
            body.deadline_ts,
            body.executions(),
        )

    @router.post("/resume", response_model=ResumeReply, summary="reopen admission (also the abort)")
    async def resume(body: CheckpointRequest, after_reply: BackgroundTasks) -> ResumeReply:
        reply, starts = await quick(_resume_deferring_uploads, body.checkpoint_id, body.deadline_ts)
        for start in starts:  # the upload an asynchronous commit froze starts once this reply is sent
            after_reply.add_task(start)
        return reply

    def _resume_deferring_uploads(
        checkpoint_id: str, deadline: float
    ) -> tuple[ResumeReply, list[Callable[[], None]]]:
        with launches_deferred() as starts:
            return participant.resume(checkpoint_id, deadline), starts

    @router.post("/abort-restore", response_model=ResumeReply, summary="undo a restore that failed elsewhere")
    async def abort_restore(body: CheckpointRequest) -> ResumeReply:
        return await quick(participant.abort_restore, body.checkpoint_id, body.deadline_ts)

    @router.post("/retire", response_model=RetireReply, summary="tombstone attempts everywhere here")
    async def retire(body: RetireRequest) -> RetireReply:
        await quick(participant.retire, list(body.executions), body.deadline_ts)
        return RetireReply(retired=len(body.executions))

    @router.post("/forget", response_model=ForgetReply, summary="drop tombstones of finished rollouts")
    async def forget(body: ForgetRequest) -> ForgetReply:
        await quick(participant.forget, list(body.rollout_ids))
        return ForgetReply(forgotten=len(body.rollout_ids))

    return router


async def _cancel_on_disconnect(request: Request, cancel: Cancellation) -> None:
    """Cancel ``cancel`` (in a thread: it takes the participant's lock) once the client is gone."""
    while not await request.is_disconnected():
        await anyio.sleep(DISCONNECT_POLL_SECONDS)
    await anyio.to_thread.run_sync(cancel.cancel)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every :class:`CheckpointError` an app's own routes raise (a stale attempt, closed
    admission, an unknown session, a bad execution id) and every request FastAPI refuses (422
    ``invalid_request``) in the control plane's error shape and statuses, never a 500."""

    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CheckpointError)
        return error_response(status_for(exc), exc.code, exc.message)

    async def invalid(request: Request, exc: Exception) -> Response:
        # a path, query or body value outside what the route declares: the same error shape
        assert isinstance(exc, RequestValidationError)
        return error_response(422, INVALID_REQUEST, _describe(exc))

    async def http(request: Request, exc: Exception) -> Response:
        # Starlette's own answers (no such route, wrong method) in the same shape, with a code
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))

    app.add_exception_handler(CheckpointError, handler)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http)


def install_participant(
    app: FastAPI, participant: ParticipantControl, *, token: str, store: str | ObjectStore | None = None
) -> None:
    """Mount ``participant``'s control routes on ``app``."""
    app.include_router(checkpoint_router(participant, token=token, store=store))


def control_app(
    participant: ParticipantControl, *, token: str, store: str | ObjectStore | None = None
) -> FastAPI:
    """A FastAPI app serving only the control routes (and its OpenAPI document)."""
    caps = participant.capabilities()
    app = FastAPI(title=f"rollout-checkpoint {caps.kind}/{caps.instance}", version="1")
    install_participant(app, participant, token=token, store=store)
    return app
