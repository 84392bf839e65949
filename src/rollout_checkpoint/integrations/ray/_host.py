"""``ParticipantHost``: participants served inside a Ray actor.

The host builds a participant from a build function (``package.module:function`` taking a
:class:`~rollout_checkpoint.server.WorkerContext`, exactly what ``rollout-checkpoint serve``
takes) and serves its app on the node's address (from Ray, never assumed): with one worker in a
thread of the actor, with ``workers > 1`` as a child ``rollout-checkpoint serve`` process group
that exits with the actor. The data plane (an agent calling the model) uses :meth:`endpoint`;
the control plane is the actor's ``control_*`` methods (no HTTP token needed: Ray authenticates
the caller), which :class:`~rollout_checkpoint.integrations.ray.RayParticipant` drives.

When Ray reconstructs the actor (``max_restarts``), ``__init__`` runs again in a new process:
the participant comes back empty, with a new incarnation, and starts paused, so no retried
request is served on empty state until a coordinator restores it (``Coordinator.recover``).

Control methods run in concurrency groups (:data:`CONCURRENCY_GROUPS`): a prepare parked until
its deadline holds a ``control`` thread, while ``status``, ``resume`` and ``health`` answer from
the ``quick`` group.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import ray
import uvicorn

from ...errors import InvalidArgumentError, ParticipantRestartedError
from ...ids import PackedExecutions, check_packed, unpack_executions
from ...protocol import (
    Capabilities,
    CommitReply,
    ParticipantControl,
    ParticipantStatus,
    PrepareReport,
    RestoreReply,
    ResumeReply,
)
from ...server import (
    CHECKPOINT_ROUTE_PREFIX,
    EXIT_WITH_ENV,
    TOKEN_ENV,
    RemoteParticipant,
    StoreMismatchError,
    WorkerContext,
    install_participant,
    load_build,
    open_server_store,
)
from ...server import ParticipantUnreachableError as _Unreachable
from ...store import ObjectStore
from ._tokens import TokenSource

__all__ = ["CONCURRENCY_GROUPS", "ParticipantHost", "host_actor"]

CONCURRENCY_GROUPS: dict[str, int] = {"control": 8, "quick": 4}
"""The actor's concurrency groups: ``control`` runs prepare, commit, collect and restore (which
may wait until their deadline), ``quick`` everything that must answer while they wait."""

STARTUP_TIMEOUT_S = 120.0


def _reconstructed() -> bool:
    """Whether Ray restarted this actor (``False`` outside an actor)."""
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # not in an actor (a mixin used directly, a unit test)
        return False


def _node_address() -> str:
    if not ray.is_initialized():
        return "127.0.0.1"
    return str(ray.get_runtime_context().worker.node_ip_address)  # the node's address, from Ray


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class ParticipantHost:
    """Serves one participant (its app and control) inside a Ray actor; see the module doc.

    ``build``: ``package.module:function``. ``store``: the store URL (S3 or any fsspec URL every
    node reaches: nothing assumes a shared file system). ``token``: where this node reads the
    control token. ``settings``: plain environment variables for the build (never a secret:
    they travel as an actor argument). ``port`` 0 picks a free one. ``start_paused``: start
    paused even on the first start (a reconstructed actor always does).

    As a mixin, call :meth:`start_participant` from your actor's ``__init__`` and create the
    actor class with ``concurrency_groups`` including :data:`CONCURRENCY_GROUPS`.
    """

    def __init__(
        self,
        build: str,
        *,
        store: str,
        token: TokenSource | None = None,
        settings: Mapping[str, str] | None = None,
        workers: int = 1,
        port: int = 0,
        accept_unsafe_store: bool = False,
        start_paused: bool = False,
        name: str = "",
    ) -> None:
        self.start_participant(
            build,
            store=store,
            token=token,
            settings=settings,
            workers=workers,
            port=port,
            accept_unsafe_store=accept_unsafe_store,
            start_paused=start_paused,
            name=name,
        )

    def start_participant(
        self,
        build: str,
        *,
        store: str,
        token: TokenSource | None = None,
        settings: Mapping[str, str] | None = None,
        workers: int = 1,
        port: int = 0,
        accept_unsafe_store: bool = False,
        start_paused: bool = False,
        name: str = "",
    ) -> None:
        """Build and serve the participant (see the class doc); returns once it answers."""
        if workers < 1:
            raise InvalidArgumentError(f"workers must be >= 1, got {workers}")
        self._rc_reconstructed = _reconstructed()
        paused = start_paused or self._rc_reconstructed
        secret = (token or TokenSource()).read()
        os.environ.update(dict(settings or {}))
        self._rc_name = name
        self._rc_workers = workers
        self._rc_store_url = store
        self._rc_address = _node_address()
        self._rc_server: uvicorn.Server | None = None
        self._rc_thread: threading.Thread | None = None
        self._rc_child: subprocess.Popen[bytes] | None = None
        self._rc_target: ObjectStore = open_server_store(store, accept_unsafe_store=accept_unsafe_store)
        if workers == 1:
            self._rc_participant: ParticipantControl = self._serve_thread(build, secret, port, paused)
        else:
            self._rc_participant = self._serve_group(
                build, secret, port, workers, paused, accept_unsafe_store
            )
        self._rc_incarnation = self._rc_participant.status().incarnation
        self._rc_briefable = "brief" in inspect.signature(self._rc_participant.commit).parameters

    # -- serving ---------------------------------------------------------------------------------
    def _serve_thread(self, build: str, token: str, port: int, paused: bool) -> ParticipantControl:
        from ...server._serve import check_served, pause_served  # the CLI's own checks

        context = WorkerContext("w0", self._rc_target, 1, token, paused)
        served = check_served(build, load_build(build)(context))
        if paused:
            pause_served(build, served)
        install_participant(served.app, served.participant, token=token, store=self._rc_target)
        sock = _bind(self._rc_address, port)
        self._rc_port = int(sock.getsockname()[1])
        server = uvicorn.Server(uvicorn.Config(served.app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="rc-serve")
        thread.start()
        end = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > end:
                raise _Unreachable(f"the server of {build} did not start at {self._rc_endpoint()}")
            thread.join(0.02)
        self._rc_server, self._rc_thread = server, thread
        return served.participant

    def _serve_group(
        self, build: str, token: str, port: int, workers: int, paused: bool, unsafe: bool
    ) -> ParticipantControl:
        if port == 0:
            with contextlib.closing(_bind(self._rc_address, 0)) as probe:
                port = int(probe.getsockname()[1])
        self._rc_port = port
        args = [*("serve", build, "--store", self._rc_store_url, "--host", self._rc_address)]
        args += ["--port", str(port), "--workers", str(workers)]
        args += ["--start-paused"] if paused else []
        args += ["--accept-unsafe-store"] if unsafe else []
        # the token in the child's environment only (never its command line); the child and its
        # workers exit with this actor's process (a killed actor leaves no server on the port)
        env = {**os.environ, TOKEN_ENV: token, EXIT_WITH_ENV: str(os.getpid())}
        self._rc_child = subprocess.Popen(
            [sys.executable, "-c", "from rollout_checkpoint.cli import main; main()", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        remote = RemoteParticipant(self._rc_endpoint(), token=token, attempts=1, default_timeout_s=5.0)
        end = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._rc_child.poll() is not None:
                raise _Unreachable(f"the {build} server group exited with {self._rc_child.returncode}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                reply = httpx.get(
                    f"{self._rc_endpoint()}{CHECKPOINT_ROUTE_PREFIX}/status",
                    headers={"Authorization": f"Bearer {token}"},
                    trust_env=False,
                )
                if reply.status_code == 200 and reply.json().get("workers") == workers:
                    return remote
            if time.monotonic() > end:
                raise _Unreachable(f"the {build} server group did not start in {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    # -- lifecycle ---------------------------------------------------------------------------------
    @ray.method(concurrency_group="quick")
    def endpoint(self) -> str:
        """The data-plane URL (``http://<node address>:<port>``), valid until the actor moves."""
        return self._rc_endpoint()

    def _rc_endpoint(self) -> str:
        host = f"[{self._rc_address}]" if ":" in self._rc_address else self._rc_address
        return f"http://{host}:{self._rc_port}"

    @ray.method(concurrency_group="quick")
    def health(self) -> dict[str, Any]:
        """Whether the server answers, with what a supervisor reports: ``incarnation``,
        ``reconstructed`` (Ray restarted this actor), ``node_id``, ``endpoint``, ``pid``."""
        status = self._rc_participant.status()
        alive = self._rc_child is None or self._rc_child.poll() is None
        return {
            "ok": alive and (self._rc_thread is None or self._rc_thread.is_alive()),
            "name": self._rc_name,
            "incarnation": status.incarnation,
            "phase": status.phase.value,
            "reconstructed": self._rc_reconstructed,
            "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else "",
            "endpoint": self._rc_endpoint(),
            "pid": os.getpid(),
            "workers": self._rc_workers,
        }

    @ray.method(concurrency_group="quick")
    def shutdown(self) -> None:
        """Stop serving (the actor stays; ``ray.kill`` it after)."""
        if self._rc_server is not None:
            self._rc_server.should_exit = True
            if self._rc_thread is not None:
                self._rc_thread.join(10)
        if self._rc_child is not None and self._rc_child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._rc_child.pid, signal.SIGTERM)
            try:
                self._rc_child.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._rc_child.pid, signal.SIGKILL)
                self._rc_child.wait(10)
        close = getattr(self._rc_participant, "close", None)
        if callable(close):
            close()

    # -- control (what RayParticipant calls) ----------------------------------------------------
    def _expect(self, expect: str | None, operation: str) -> None:
        """Refuse an operation meant for another incarnation (Ray retried it onto this one)."""
        if expect is not None and expect != self._rc_incarnation:
            raise ParticipantRestartedError(
                f"{self._rc_label()}: {operation} was meant for incarnation {expect}, but this is "
                f"{self._rc_incarnation} (the actor restarted; Ray retried the call onto the "
                "replacement, whose state is empty): recover before the next checkpoint",
                participant=self._rc_label(),
                expected=expect,
                actual=self._rc_incarnation,
            )

    def _rc_label(self) -> str:
        return self._rc_name or self._rc_endpoint()

    def _store(self, url: str) -> ObjectStore:
        if url.rstrip("/") != self._rc_target.url.rstrip("/"):
            raise StoreMismatchError(
                f"{self._rc_label()} writes to {self._rc_target.url}, not {url}",
                expected=self._rc_target.url,
                got=url,
            )
        return self._rc_target

    @ray.method(concurrency_group="quick")
    def control_capabilities(self) -> Capabilities:
        return self._rc_participant.capabilities()

    @ray.method(concurrency_group="quick")
    def control_status(self) -> ParticipantStatus:
        return self._rc_participant.status()

    @ray.method(concurrency_group="control")
    def control_prepare(
        self, checkpoint_id: str, deadline: float, expect: str | None = None
    ) -> PrepareReport:
        self._expect(expect, "prepare")
        return self._rc_participant.prepare(checkpoint_id, deadline)

    @ray.method(concurrency_group="quick")
    def control_renew(self, checkpoint_id: str, deadline: float, expect: str | None = None) -> None:
        self._expect(expect, "renew")
        renew: Callable[[str, float], None] = getattr(self._rc_participant, "renew")  # noqa: B009
        renew(checkpoint_id, deadline)

    @ray.method(concurrency_group="control")
    def control_commit(
        self,
        checkpoint_id: str,
        store: str,
        deadline: float,
        scope_ids: Sequence[str] | None = None,
        expect: str | None = None,
        brief: bool = False,
    ) -> CommitReply:
        """``scope_ids``: the scope in the HTTP routes' compact form (``rollout_id#attempt``
        strings, checked in one pass); ``brief``: answer without the executions and restarts
        lists (the coordinator reads neither), as the HTTP route's ``brief``."""
        self._expect(expect, "commit")
        scope = None if scope_ids is None else _packed_scope(scope_ids)
        target = self._store(store)
        if brief and self._rc_briefable:  # a worker group: the lists never cross its hop either
            commit: Any = self._rc_participant.commit
            reply: CommitReply = commit(checkpoint_id, target, deadline, scope, brief=True)
        else:
            reply = self._rc_participant.commit(checkpoint_id, target, deadline, scope)
        if brief:
            reply = reply.model_copy(update={"executions": (), "restarts": ()})
        return reply

    @ray.method(concurrency_group="control")
    def control_restore(
        self,
        checkpoint_id: str,
        source_checkpoint_id: str,
        store: str,
        deadline: float,
        scope_ids: Sequence[str] | None = None,
    ) -> RestoreReply:
        scope = None if scope_ids is None else _packed_scope(scope_ids)
        return self._rc_participant.restore(
            checkpoint_id, source_checkpoint_id, self._store(store), deadline, scope
        )

    @ray.method(concurrency_group="quick")
    def control_resume(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        return self._rc_participant.resume(checkpoint_id, deadline)

    @ray.method(concurrency_group="quick")
    def control_abort_restore(self, checkpoint_id: str, deadline: float) -> ResumeReply:
        return self._rc_participant.abort_restore(checkpoint_id, deadline)

    @ray.method(concurrency_group="quick")
    def control_retire(self, executions: Sequence[str], deadline: float) -> None:
        """``executions`` in the compact form (``rollout_id#attempt`` strings)."""
        self._rc_participant.retire(unpack_executions(executions, "executions"), deadline)

    @ray.method(concurrency_group="quick")
    def control_forget(self, rollout_ids: Sequence[str]) -> None:
        self._rc_participant.forget(rollout_ids)


def host_actor(cls: type[Any] = ParticipantHost, **options: Any) -> Any:
    """The Ray actor class of ``cls`` (a :class:`ParticipantHost` or a subclass) with its
    concurrency groups; ``options`` are ``ray.remote``'s (``max_restarts`` ...)."""
    groups = {**CONCURRENCY_GROUPS, **options.pop("concurrency_groups", {})}
    remote: Any = ray.remote
    return remote(concurrency_groups=groups, **options)(cls)


def _packed_scope(scope_ids: Sequence[str]) -> PackedExecutions:
    """A scope sent packed, checked in one pass and unpacked only when the participant reads it."""
    check_packed(scope_ids, "scope_ids")
    return PackedExecutions(list(scope_ids))
