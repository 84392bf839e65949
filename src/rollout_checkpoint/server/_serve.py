"""Run a checkpointable server with one or several uvicorn worker processes.

A server is described by a *build* function, ``"package.module:function"``, that takes a
:class:`WorkerContext` and returns a :class:`ServedApp` (the FastAPI app and its participant).
With one worker the participant is mounted directly. With ``workers > 1`` the main process
runs a :class:`~rollout_checkpoint.server._workers.WorkerGroup` on a private Unix socket and
uvicorn starts the workers; each worker builds its own app and participant, serves it on its
own private socket (for the group and for forwarded sessions), registers with the group, and
serves the shared port through a :class:`~rollout_checkpoint.server._routing.WorkerFrontend`.

The control token reaches a build function as :attr:`WorkerContext.token` (in worker
processes it travels in the ``ROLLOUT_CHECKPOINT_TOKEN`` environment variable, never on a
command line). ``start_paused`` starts every participant paused (admission closed until a
restore or an explicit resume): a replacement server's choice. Worker processes exit within
a second or two of their main process's death, even a SIGKILL (see :mod:`._orphans`), so a
replacement can bind the port. The private sockets live in a scratch folder
(:class:`~rollout_checkpoint.server._scratch.ScratchFolder`) that a SIGKILLed server's
replacement removes. A build function whose answer is not a :class:`ServedApp` stops the whole
server with one error in the main process (the workers report it over the group socket).

A server checks its store when it starts, before it listens: conditional puts must be atomic
there (an S3 endpoint is probed, once per process) unless ``accept_unsafe_store`` accepts the
risk; worker processes learn that choice from ``ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE=1``.

uvicorn's supervisor pings every worker process about twice a second and kills (then replaces) one
that does not answer within ``worker_healthcheck_timeout`` seconds. A worker answers from a thread
of its own, but that thread needs the interpreter: a commit of tens of thousands of rollouts can
hold it in one native call (an Arrow conversion, a garbage collection) for seconds on a loaded
host, and uvicorn's own default (5 s) took such a busy, healthy worker for hung and lost its
state. :data:`WORKER_HEALTHCHECK_TIMEOUT_S` (60 s) is the default here; a worker process that
exits is noticed at once whatever the timeout, and one that truly hangs is still replaced (and
its replacement refused by the coordinator's incarnation check).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
import uvicorn
from fastapi import APIRouter, FastAPI, Query, Security
from pydantic import BaseModel, ConfigDict, Field
from uvicorn.config import STARTUP_FAILURE

from ..errors import CheckpointError, InvalidArgumentError, UnknownExecutionError
from ..ids import Identifier
from ..protocol import Capabilities, ParticipantControl
from ..store import ObjectStore, open_store
from ..tokens import ObjectStoreTokenStore
from ._client import RemoteParticipant
from ._orphans import exit_with, exit_with_env
from ._router import _route_class, _TokenCheck, checkpoint_router, install_participant
from ._routing import OwnerSigner, Resolver, StampOwner, WorkerFrontend
from ._scratch import ScratchFolder
from ._token_rules import check_server_token
from ._tokens import token_store_app
from ._wire import CHECKPOINT_ROUTE_PREFIX
from ._workers import WorkerGroup

__all__ = [
    "TOKEN_ENV",
    "UNSAFE_STORE_ENV",
    "WORKER_HEALTHCHECK_TIMEOUT_S",
    "GroupStartup",
    "ServedApp",
    "WorkerContext",
    "check_served",
    "group_app",
    "load_build",
    "run_server",
    "run_token_server",
    "serve_thread",
    "token_worker_app",
    "worker_app",
]

log = logging.getLogger(__name__)

TOKEN_ENV = "ROLLOUT_CHECKPOINT_TOKEN"
_BUILD_ENV = "ROLLOUT_CHECKPOINT_WORKER_BUILD"
_DIR_ENV = "ROLLOUT_CHECKPOINT_WORKER_DIR"
_STORE_ENV = "ROLLOUT_CHECKPOINT_WORKER_STORE"
_COUNT_ENV = "ROLLOUT_CHECKPOINT_WORKERS"
_PAUSED_ENV = "ROLLOUT_CHECKPOINT_WORKER_START_PAUSED"
_MAIN_ENV = "ROLLOUT_CHECKPOINT_WORKER_MAIN_PID"  # a worker dies with its server's main process
UNSAFE_STORE_ENV = "ROLLOUT_CHECKPOINT_ACCEPT_UNSAFE_STORE"
_GROUP_SOCKET = "group.sock"
WORKER_HEALTHCHECK_TIMEOUT_S = 60
"""Seconds a worker process may leave uvicorn's health-check ping unanswered before it is killed
and replaced (``run_server(..., worker_healthcheck_timeout=)``, ``serve --worker-healthcheck-timeout``)."""


def _check_healthcheck_timeout(seconds: int) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise InvalidArgumentError(
            f"worker_healthcheck_timeout must be a whole number of seconds >= 1, got {seconds!r}"
        )


@dataclass(frozen=True)
class WorkerContext:
    """What a build function learns about the process it builds for: its worker id, the
    server's store, how many workers the server runs, its control ``token`` (for clients the
    build makes of other servers; never shown in a repr) and whether it ``start_paused``."""

    worker_id: str
    store: ObjectStore
    workers: int
    token: str = field(default="", repr=False)
    start_paused: bool = False


@dataclass(frozen=True)
class ServedApp:
    """A build function's answer: the app to serve and the participant behind its control routes."""

    app: FastAPI
    participant: ParticipantControl


Build = Callable[[WorkerContext], ServedApp]


def load_build(spec: str) -> Build:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"build must be 'package.module:function', got {spec!r}")
    build: Build = getattr(importlib.import_module(module), name)
    if not callable(build):
        raise InvalidArgumentError(f"build {spec!r} is a {type(build).__name__}, not a function")
    return build


def build_served(spec: str, context: WorkerContext) -> ServedApp:
    """Call the build function ``spec`` names; anything but a :class:`ServedApp` is one clear
    error naming the expected type (``serve`` prints it as one line)."""
    return check_served(spec, call_build(spec, load_build(spec), context))


def call_build(spec: str, build: Build, context: WorkerContext) -> object:
    """What ``build(context)`` returns; an exception it raises is one clear error naming the
    build and the exception (:class:`~rollout_checkpoint.errors.InvalidArgumentError`; the
    traceback is logged at debug level), not a traceback per worker start."""
    try:
        return build(context)
    except Exception as exc:
        log.debug("build function %s raised", spec, exc_info=True)
        what = exc.message if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
        raise InvalidArgumentError(f"build function {spec!r} failed: {what}") from exc


def pause_served(spec: str, served: ServedApp) -> None:
    """Start the participant of ``served`` paused (``serve --start-paused``); one that cannot
    (not a :class:`~rollout_checkpoint.protocol.Participant` nor anything with ``start_paused()``)
    is one clear error."""
    start = getattr(served.participant, "start_paused", None)
    if not callable(start):
        raise InvalidArgumentError(
            f"build function {spec!r}: its participant ({type(served.participant).__name__}) cannot "
            "start paused (it has no start_paused())"
        )
    start()


def check_served(spec: str, served: object) -> ServedApp:
    """``served`` (what the build function ``spec`` returned), if it is a :class:`ServedApp` whose
    participant is one; else :class:`~rollout_checkpoint.errors.InvalidArgumentError`."""
    if not isinstance(served, ServedApp):
        raise InvalidArgumentError(
            f"build function {spec!r} returned a {type(served).__name__}; it must return "
            "rollout_checkpoint.server.ServedApp(app=<FastAPI app>, participant=<participant>)"
        )
    if not isinstance(served.participant, ParticipantControl):
        raise InvalidArgumentError(
            f"build function {spec!r}: ServedApp.participant is a {type(served.participant).__name__}, "
            "not a participant (rollout_checkpoint.protocol.ParticipantControl)"
        )
    return served


@contextlib.contextmanager
def serve_thread(app: Any, *, uds: str, log_level: str = "warning") -> Iterator[uvicorn.Server]:
    """Serve ``app`` on a Unix socket from a daemon thread (its own event loop)."""
    server = uvicorn.Server(uvicorn.Config(app, uds=uds, log_level=log_level, lifespan="off"))
    thread = threading.Thread(target=server.run, name=f"uds-{os.path.basename(uds)}", daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            raise RuntimeError(f"the server on {uds} did not start")
        thread.join(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)


def open_server_store(url: str, *, accept_unsafe_store: bool = False) -> ObjectStore:
    """Open a server's store and refuse it unless its conditional puts are atomic (an S3
    endpoint is probed now, so the first checkpoint's pause does not pay for it) or the risk is
    accepted: a server that would fail its first commit does not start (one typed error)."""
    target = open_store(url, accept_unsafe_store=True) if accept_unsafe_store else open_store(url)
    target.require_atomic_commits(accept_risk=accept_unsafe_store)
    return target


def _worker_store_options() -> dict[str, Any]:
    """How a worker process opens stores, as its server's main process chose (the environment)."""
    return {"accept_unsafe_store": True} if os.environ.get(UNSAFE_STORE_ENV) == "1" else {}


def _worker_store(url: str) -> ObjectStore:
    return open_store(url, **_worker_store_options())


# -- the group (main process) ------------------------------------------------------------------------


class _Register(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Identifier
    socket: str = Field(max_length=1024)
    pid: int = Field(gt=0)
    capabilities: Capabilities


class _Address(BaseModel):
    worker_id: str
    socket: str
    pid: int


class _Refusal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: Identifier
    detail: str = Field(max_length=4000)


class GroupStartup:
    """What the workers of a group told its main process while starting: the first refusal of
    the build function's answer (every worker would refuse it the same way, so the server stops
    and the main process says it in one line instead of restarting workers in a loop)."""

    def __init__(self, on_refusal: Callable[[], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._on_refusal = on_refusal
        self.refusal: str | None = None

    def refuse(self, detail: str) -> None:
        with self._lock:
            if self.refusal is not None:
                return
            self.refusal = detail
        if self._on_refusal is not None:
            self._on_refusal()


class _HideStartupFailure(logging.Filter):
    """uvicorn's own line about a worker that failed to start, once the group holds the reason."""

    def __init__(self, startup: GroupStartup) -> None:
        super().__init__()
        self._startup = startup

    def filter(self, record: logging.LogRecord) -> bool:
        return self._startup.refusal is None or "failed to start" not in record.getMessage()


def group_app(
    group: WorkerGroup, *, token: str, store: str | ObjectStore, startup: GroupStartup | None = None
) -> FastAPI:
    """The group's private app: the control routes over the merged participant, plus the roster
    routes the workers use (register, resolve an owner or a rollout, refuse the build's answer)."""
    check = _TokenCheck(token)
    app = FastAPI(title="rollout-checkpoint worker group")
    app.include_router(checkpoint_router(group, token=token, store=store))
    roster = APIRouter(prefix="/workers", route_class=_route_class(check), dependencies=[Security(check)])

    @roster.post("/register", response_model=list[_Address])
    def register(body: _Register) -> list[_Address]:
        group.register(body.worker_id, body.socket, body.pid, body.capabilities)
        return [_Address(worker_id=w.worker_id, socket=w.socket, pid=w.pid) for w in group.workers()]

    @roster.get("", response_model=list[_Address])
    def workers() -> list[_Address]:
        return [_Address(worker_id=w.worker_id, socket=w.socket, pid=w.pid) for w in group.workers()]

    @roster.get("/resolve", response_model=_Address)
    def resolve(
        owner: Annotated[str | None, Query(max_length=256)] = None,
        rollout: Annotated[str | None, Query(max_length=256)] = None,
    ) -> _Address:
        found = group.resolve_owner(owner) if owner else group.place_rollout(rollout) if rollout else None
        if found is None:
            raise UnknownExecutionError("no live worker holds that owner or rollout")
        return _Address(worker_id=found.worker_id, socket=found.socket, pid=found.pid)

    @roster.post("/refused", status_code=204)
    def refused(body: _Refusal) -> None:
        if startup is not None:
            startup.refuse(body.detail)

    app.include_router(roster)
    return app


def run_server(
    build: str,
    *,
    store: str,
    host: str,
    port: int,
    token: str,
    workers: int = 1,
    log_level: str = "warning",
    startup_timeout_s: float = 60.0,
    accept_unsafe_store: bool = False,
    start_paused: bool = False,
    worker_healthcheck_timeout: int = WORKER_HEALTHCHECK_TIMEOUT_S,
) -> None:
    """Serve until interrupted (SIGINT/SIGTERM). See the module docstring. ``start_paused``:
    every participant starts with admission closed until a restore or an explicit resume.
    ``worker_healthcheck_timeout`` (seconds, ``workers > 1``): how long a worker process may leave
    uvicorn's health-check ping unanswered (busy in a long commit) before it is replaced.

    Raises :class:`~rollout_checkpoint.errors.ConditionalWriteUnsupportedError` before listening
    when the store's conditional puts are not atomic and ``accept_unsafe_store`` is false, and
    :class:`~rollout_checkpoint.errors.InvalidValueError` for a token that is not printable ASCII
    or shorter than 16 characters (``MIN_TOKEN_LENGTH``)."""
    check_server_token(token)
    if workers < 1:
        raise ValueError("workers must be >= 1")
    _check_healthcheck_timeout(worker_healthcheck_timeout)
    exit_with_env()  # started by a process it must not outlive (``demo``)
    target = open_server_store(store, accept_unsafe_store=accept_unsafe_store)
    if workers == 1:
        served = build_served(build, WorkerContext("w0", target, 1, token, start_paused))
        if start_paused:
            pause_served(build, served)
        install_participant(served.app, served.participant, token=token, store=target)
        uvicorn.run(served.app, host=host, port=port, log_level=log_level)
        return
    scratch = ScratchFolder()  # removes the scratch folders of SIGKILLed servers first
    directory = str(scratch.path)
    group = WorkerGroup(target, expected_workers=workers, token=token)
    # a refusal stops the server at once (uvicorn's supervisor takes SIGTERM as "exit")
    startup = GroupStartup(lambda: os.kill(os.getpid(), signal.SIGTERM))
    hide = _HideStartupFailure(startup)
    uvicorn_log = logging.getLogger("uvicorn.error")
    try:
        with serve_thread(
            group_app(group, token=token, store=target, startup=startup),
            uds=os.path.join(directory, _GROUP_SOCKET),
        ):
            os.environ.update(
                {
                    TOKEN_ENV: token,
                    _BUILD_ENV: build,
                    _DIR_ENV: directory,
                    _STORE_ENV: target.url,
                    _COUNT_ENV: str(workers),
                    _PAUSED_ENV: "1" if start_paused else "0",
                    _MAIN_ENV: str(os.getpid()),
                    UNSAFE_STORE_ENV: "1" if accept_unsafe_store else "0",
                }
            )
            uvicorn_log.addFilter(hide)
            uvicorn.run(
                "rollout_checkpoint.server._serve:worker_app",
                factory=True,
                workers=workers,
                host=host,
                port=port,
                log_level=log_level,
                timeout_graceful_shutdown=5,
                timeout_worker_healthcheck=worker_healthcheck_timeout,
            )
    finally:
        uvicorn_log.removeFilter(hide)
        group.close()
        scratch.close()
    if startup.refusal is not None:  # the workers refused the build's answer: uvicorn stopped
        raise InvalidArgumentError(startup.refusal)


def run_token_server(
    store: str,
    *,
    host: str,
    port: int,
    token: str,
    workers: int = 1,
    log_level: str = "warning",
    accept_unsafe_store: bool = False,
    worker_healthcheck_timeout: int = WORKER_HEALTHCHECK_TIMEOUT_S,
) -> None:
    """Serve the reference token store (``rollout-checkpoint serve tokens``). Its shards are
    immutable and uniquely named on the object store, so worker processes need no group. The
    store is checked (and ``worker_healthcheck_timeout`` applied) as :func:`run_server` does."""
    check_server_token(token)
    if workers < 1:
        raise ValueError("workers must be >= 1")
    _check_healthcheck_timeout(worker_healthcheck_timeout)
    exit_with_env()
    target = open_server_store(store, accept_unsafe_store=accept_unsafe_store)
    if workers == 1:
        app = token_store_app(ObjectStoreTokenStore(target), token=token)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
        return
    os.environ.update(
        {
            TOKEN_ENV: token,
            _STORE_ENV: target.url,
            UNSAFE_STORE_ENV: "1" if accept_unsafe_store else "0",
            _MAIN_ENV: str(os.getpid()),
        }
    )
    uvicorn.run(
        "rollout_checkpoint.server._serve:token_worker_app",
        factory=True,
        workers=workers,
        host=host,
        port=port,
        log_level=log_level,
        timeout_worker_healthcheck=worker_healthcheck_timeout,
    )


def token_worker_app() -> FastAPI:
    """uvicorn's app factory for token-store worker processes."""
    _exit_with_main()
    return token_store_app(
        ObjectStoreTokenStore(_worker_store(os.environ[_STORE_ENV])), token=os.environ[TOKEN_ENV]
    )


# -- one worker process ---------------------------------------------------------------------------------


_keep: list[Any] = []  # the private server's context manager lives as long as the worker


def worker_app() -> WorkerFrontend:
    """uvicorn's app factory in every worker process (configured through the environment)."""
    _exit_with_main()
    token = os.environ[TOKEN_ENV]
    directory = os.environ[_DIR_ENV]
    store = _worker_store(os.environ[_STORE_ENV])
    workers = int(os.environ[_COUNT_ENV])
    worker_id = f"w{os.getpid()}"
    spec = os.environ[_BUILD_ENV]
    group_socket = os.path.join(directory, _GROUP_SOCKET)
    paused = os.environ.get(_PAUSED_ENV) == "1"
    try:
        served = build_served(spec, WorkerContext(worker_id, store, workers, token, paused))
        if paused:
            pause_served(spec, served)
    except InvalidArgumentError as exc:
        # every worker would refuse it alike: tell the main process, which stops the server
        # (STARTUP_FAILURE) and says it in one line, instead of a loop of crashing workers
        _refuse(group_socket, token, worker_id, exc.message)
        raise SystemExit(STARTUP_FAILURE) from None
    caps = served.participant.capabilities()
    signer = OwnerSigner(token, f"{caps.kind}/{caps.instance}")
    # private socket: the worker's own participant (for the group) and forwarded sessions
    served.app.include_router(
        checkpoint_router(served.participant, token=token, store_options=_worker_store_options())
    )
    socket = os.path.join(directory, f"{worker_id}.sock")
    private = serve_thread(StampOwner(served.app, worker_id, signer), uds=socket)
    private.__enter__()
    _keep.append(private)
    _register(group_socket, token, worker_id, socket, caps)
    group = RemoteParticipant("http://group", token=token, uds=group_socket)
    control = FastAPI()
    control.include_router(checkpoint_router(group, token=token, store=store))
    return WorkerFrontend(
        served.app,
        control,
        control_prefix=CHECKPOINT_ROUTE_PREFIX,
        worker_id=worker_id,
        signer=signer,
        resolver=Resolver(group_socket, token),
    )


def _exit_with_main() -> None:
    """A worker dies with its server's main process (even a SIGKILLed one): never an orphan
    holding the port."""
    main = os.environ.get(_MAIN_ENV, "")
    if main.isdigit():
        exit_with(int(main))


def _refuse(group_socket: str, token: str, worker_id: str, detail: str) -> None:
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.Client(
            transport=httpx.HTTPTransport(uds=group_socket, retries=5),
            base_url="http://group",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as client,
    ):
        client.post("/workers/refused", json={"worker_id": worker_id, "detail": detail[:4000]})


def _register(group_socket: str, token: str, worker_id: str, socket: str, caps: Capabilities) -> None:
    body = {
        "worker_id": worker_id,
        "socket": socket,
        "pid": os.getpid(),
        "capabilities": caps.model_dump(mode="json"),
    }
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=group_socket, retries=5),
        base_url="http://group",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ) as client:
        response = client.post("/workers/register", json=body)
    if response.status_code != 200:
        raise CheckpointError(f"worker {worker_id} could not join its server's group: {response.text}")
