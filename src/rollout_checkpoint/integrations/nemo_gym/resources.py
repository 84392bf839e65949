"""Make an existing Gym resources server a checkpoint participant, without changing Gym.

:func:`attach` takes the Gym server object and the FastAPI app its ``setup_webserver()`` built:

* it mounts the SDK's control routes (bearer token) on the app, and answers the app's SDK
  errors (``stale_attempt``, ``admission_closed``) in the control plane's error shape;
* it adds one ASGI middleware *innermost* (after Gym's session-cookie and rollout-prefix
  middlewares, so it sees both the cookie's session id and the stripped rollout id). For every
  session route it keys the session by ``(rollout id, attempt, Gym session id)``; a request
  without a rollout identity is refused (400 ``rollout_id_required``, naming the setting to
  turn on), never served into state that could not be restored. Opening and mutating routes
  run under the session's lock, admitted through the participant (parked, not failed, while a
  checkpoint's prepare holds admission closed; prepare waits for the ones already running);
  after the handler answers, the server's own dict entry is taken as the session's new state
  (encoded by the spec's codec) and the reply carries the revision in ``x-rc-revision``;
* a restore installs the decoded states into the server's own dict, under the replacement
  attempt; a retire removes them.

:func:`checkpointed` is the subclass form: ``checkpointed(BlackjackEnv).run_webserver()``
starts a Gym server through Gym's own start-up with the participant attached.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope, Send

from ...errors import CheckpointError, InvalidArgumentError, UnknownExecutionError
from ...format.binary_payloads import binary_payload
from ...format.records import RECORD_SCHEMA_VERSION, Record, ResourceSnapshotRecord
from ...ids import ExecutionId
from ...participants import ResourcesParticipant
from ...protocol import Export, scope_test
from ...server import error_response, install_error_handlers, install_participant, status_for
from .identity import (
    IDENTITY_SETTING,
    RolloutIdentityRequiredError,
    execution_from_capture_key,
    execution_from_episode_id,
)
from .specs import RESTART_ONLY_CLOSE_ROUTES, SessionSpec, spec_for

__all__ = [
    "INSTANCE_HEADER",
    "REVISION_HEADER",
    "SESSION_HEADER",
    "START_PAUSED_ENV",
    "GymResourcesParticipant",
    "attach",
    "checkpointed",
    "is_checkpointed",
    "start_paused_if_asked",
]

_LOG = logging.getLogger(__name__)

REVISION_HEADER = "x-rc-revision"
SESSION_HEADER = "x-rc-session"
INSTANCE_HEADER = "x-rc-instance"
SESSION_ID_KEY = "session_id"  # Gym's key in the signed session cookie
WAIT_SECONDS = 300.0
START_PAUSED_ENV = "ROLLOUT_CHECKPOINT_START_PAUSED"
"""Set to ``1`` for a replacement server: it admits nothing until a coordinator restores (or
resumes) it, so a request of a dead attempt that Gym's client retries into the replacement
parks, and the restore's fence then refuses it (``stale_attempt``) instead of serving it."""


def start_paused_if_asked(participant: Any) -> None:
    """Start ``participant`` paused (:meth:`~rollout_checkpoint.protocol.Participant.start_paused`)
    when :data:`START_PAUSED_ENV` asks for it: admission stays closed until a restore or an
    explicit resume."""
    if os.environ.get(START_PAUSED_ENV) == "1":
        participant.start_paused()


class GymResourcesParticipant(ResourcesParticipant):
    """A resources participant whose restored sessions also land in the Gym server's own dict
    (and whose retired sessions leave it)."""

    def __init__(self, server: Any, spec: SessionSpec | None, instance: str, **kwargs: Any) -> None:
        super().__init__(
            instance,
            mode="exported" if spec is not None else "restart_only",
            codec=spec.codec if spec else None,
            **kwargs,
        )
        self.server = server
        self.spec = spec
        self._tainted: dict[ExecutionId, str] = {}  # execution -> the read route that changed its state

    def _encode(
        self, execution: ExecutionId, session_id: str, revision: int, state: Any
    ) -> bytes | Exception | None:
        """As the base participant, but the snapshot is the binary ``resource_snapshot`` payload
        (the codec's bytes stored raw, not as base64 in JSON: ``docs/format.md``), so a codec
        that writes Parquet (``workplace_assistant``) lands in the archive as Parquet."""
        if self.mode != "exported":
            return None
        try:
            data: Any = self.codec.encode(state)
        except (TypeError, ValueError) as exc:
            return exc
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if type(data) is not bytes:
            return TypeError(f"the codec returned {type(data).__name__}, not bytes")
        header = {
            "schema_version": RECORD_SCHEMA_VERSION,
            "rollout_id": execution.rollout_id,
            "attempt": execution.attempt,
            "session_id": session_id,
            "revision": revision,
            "codec": self.codec.name,
        }
        return binary_payload(ResourceSnapshotRecord.kind, header, data)

    def taint(self, execution: ExecutionId, route: str) -> None:
        """A route declared read changed ``execution``'s state behind the participant's back:
        from now on its sessions are never exported, its rollout restarts from its input
        (``fresh_dispatch``), since no revision the agent recorded describes that state."""
        with self._cond:
            self._tainted.setdefault(execution, route)
            self._changed()

    def _export(self, scope: frozenset[ExecutionId] | None) -> Export:
        with self._cond:
            tainted = [e for e in self._tainted if e in self._by_execution]
            self._tainted = {e: self._tainted[e] for e in tainted}
        if not tainted:
            return super()._export(scope)
        in_scope = scope_test(scope)
        keys = {(e.rollout_id, e.attempt) for e in tainted}
        clean = frozenset(
            e for e in self._live_executions() if in_scope(e) and (e.rollout_id, e.attempt) not in keys
        )
        export = super()._export(clean)
        restarts = [e for e in tainted if in_scope(e)]
        restarts = [*export.restarts, *restarts]
        return Export(records=export.records, executions=export.executions, restarts=restarts)

    def _validate_restore(self, records: Sequence[Record]) -> Callable[[], list[ExecutionId]]:
        install = super()._validate_restore(records)

        def install_into_gym() -> list[ExecutionId]:
            restored = install()
            if self.spec is not None:
                for (_, session_id), session in self._sessions.items():
                    self.spec.install(self.server, session_id, session.state)
            return restored

        return install_into_gym

    def _retire_state(self, executions: Sequence[ExecutionId]) -> None:
        if self.spec is not None:
            for execution in self._covered_live(executions):
                for session_id in self._by_execution.get(execution, ()):
                    self.spec.drop(self.server, session_id)
        super()._retire_state(executions)


def _current_capture_key() -> str | None:
    from nemo_gym.rollout_correlation import current_rollout_id

    key: str | None = current_rollout_id()
    return key


class _CheckpointMiddleware:
    """The innermost middleware (see the module docstring)."""

    def __init__(self, app: Any, *, participant: GymResourcesParticipant, wait: float) -> None:
        self.app = app
        self.participant = participant
        self.spec = participant.spec
        self.wait = wait

    def _route(self, path: str) -> str:
        spec = self.spec
        if spec is None:
            if path in RESTART_ONLY_CLOSE_ROUTES:
                return "close"
            return "mutate"
        for kind, routes in (
            ("open", spec.open_routes),
            ("mutate", spec.mutate_routes),
            ("read", spec.read_routes),
            ("close", spec.close_routes),
        ):
            if path in routes:
                return kind
        return "mutate" if spec.strict else "pass"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or path.startswith("/ng-control/")
            or (self.spec is not None and path in self.spec.passthrough_routes)
            or (self.spec is None and path in ("/aggregate_metrics", "/reverify_mode"))
        ):
            await self.app(scope, receive, send)
            return
        kind = self._route(path)
        if kind == "pass":
            await self.app(scope, receive, send)
            return
        body, receive = await _buffer_body(receive)
        try:
            execution = self._identity(body)
            session_id = str((scope.get("session") or {}).get(SESSION_ID_KEY) or "")
            if not session_id:
                raise RolloutIdentityRequiredError(
                    "the request carries no Gym session (cookie middleware missing?)"
                )
            await self._serve(kind, execution, session_id, scope, receive, send)
        except CheckpointError as exc:
            status = 400 if isinstance(exc, RolloutIdentityRequiredError) else status_for(exc)
            await error_response(status, exc.code, exc.message)(scope, receive, send)

    def _identity(self, body: bytes) -> ExecutionId:
        key = _current_capture_key()
        if key is not None:
            return execution_from_capture_key(key)
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        execution = execution_from_episode_id(doc.get("episode_id")) if isinstance(doc, dict) else None
        if execution is None:
            raise RolloutIdentityRequiredError(
                f"{self.participant.kind}/{self.participant.instance}: this request carries no rollout "
                f"identity, so its session could not be checkpointed: {IDENTITY_SETTING}"
            )
        return execution

    async def _serve(
        self, kind: str, execution: ExecutionId, session_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        p = self.participant
        if kind == "read" and self.spec is None:
            with p._cond:
                p.fence.check(execution)  # a stale attempt reads nothing
            await self.app(scope, receive, send)
            return
        async with p.session_work(execution, session_id, wait=self.wait) as work:
            if kind == "read":
                await self._read(work, execution, session_id, scope, receive, send)
                return
            if kind == "mutate" and not work.exists and self.spec is not None:
                # fail closed: state this participant does not hold (another worker's, or lost
                # in a crash) is never served from a blank slate
                raise UnknownExecutionError(
                    f"session {session_id} of {execution} is not open at {p.kind}/{p.instance} "
                    "(open it first; after a crash, continue the rollout from its checkpoint)"
                )
            messages: list[Message] = []

            async def capture(message: Message) -> None:
                messages.append(message)

            await self.app(scope, receive, capture)
            status = next((m["status"] for m in messages if m["type"] == "http.response.start"), 500)
            revision: int | None = work.revision
            if status < 400:
                revision = self._record(kind, work, session_id, messages)
        headers = [
            (INSTANCE_HEADER.encode(), p.instance.encode()),
            (SESSION_HEADER.encode(), session_id.encode()),
        ]
        if revision is not None:
            headers.append((REVISION_HEADER.encode(), str(revision).encode()))
        for message in messages:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *headers]}
            await send(message)

    async def _read(
        self, work: Any, execution: ExecutionId, session_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A read route, under the session's lock and admission like a mutation (so what it might
        change cannot slip past a checkpoint), with the server's entry compared before and after:
        a read that drops the entry ends the session, one that changes it makes the rollout
        restart from its input (``fresh_dispatch``); either way a warning names the route."""
        spec = self.spec
        assert spec is not None
        before = spec.read(self.participant.server, session_id)
        fingerprint = _fingerprint(spec, before)
        await self.app(scope, receive, send)
        if not work.exists:
            return
        after = spec.read(self.participant.server, session_id)
        path = scope.get("path", "")
        if after is None:
            _LOG.warning(
                "%s: read route %s dropped session %s of %s: the session ends (declare %s a close route)",
                spec.name,
                path,
                session_id,
                execution,
                path,
            )
            work.end()
        elif after is not before or _fingerprint(spec, after) != fingerprint:
            _LOG.warning(
                "%s: read route %s changed session %s of %s: the rollout restarts from its input "
                "(fresh_dispatch; declare %s a mutate route)",
                spec.name,
                path,
                session_id,
                execution,
                path,
            )
            self.participant.taint(execution, path)

    def _record(self, kind: str, work: Any, session_id: str, messages: list[Message]) -> int | None:
        """After a successful handler: the server's dict entry is the session's new state."""
        spec = self.spec
        if kind == "close":
            work.end()
            return None
        if spec is None:  # restart-only: track the session's life, never its state
            if _terminal(messages):
                work.end()
                return None
            revision: int = work.set(None)
            return revision
        state = spec.read(self.participant.server, session_id)
        if state is None:  # the server dropped it (a terminal step)
            work.end()
            return None
        revision = work.set(state)
        return revision


def _fingerprint(spec: SessionSpec, state: Any) -> bytes | None:
    """The codec's bytes of ``state`` (``None`` if it does not encode)."""
    if state is None:
        return None
    try:
        data = spec.codec.encode(state)
    except (TypeError, ValueError):
        return None
    return bytes(data)


def _terminal(messages: list[Message]) -> bool:
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and (doc.get("terminated") is True or doc.get("truncated") is True)


async def _buffer_body(receive: Receive) -> tuple[bytes, Receive]:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def attach(
    server: Any,
    app: Any,
    *,
    token: str | None = None,
    store: str | None = None,
    instance: str | None = None,
    spec: SessionSpec | bool | None = True,
    mount_control: bool = True,
    admission_wait: float = WAIT_SECONDS,
) -> GymResourcesParticipant:
    """Make the Gym resources ``server`` (whose ``setup_webserver()`` returned ``app``) a
    checkpoint participant; see the module docstring. ``spec=True`` looks the server's class up
    among the built-in specs (restart-only when none fits); pass a :class:`SessionSpec` for your
    own server, or ``None`` to force restart-only. ``token`` defaults to the
    ``ROLLOUT_CHECKPOINT_TOKEN`` environment variable and ``store`` to
    ``ROLLOUT_CHECKPOINT_STORE`` (without one, each request names its store).
    ``mount_control=False`` leaves the control routes to a worker group (several workers).

    Refused (``invalid_argument``): an app that already has a participant (attached twice), and
    a Gym agent or model server (they have their own checkpointed forms)."""
    _refuse_role(type(server))
    if getattr(app.state, "rollout_checkpoint_participant", None) is not None:
        raise InvalidArgumentError(
            f"{type(server).__name__}: this app already has a checkpoint participant attached "
            "(attach once, or use checkpointed(Class), not both)"
        )
    chosen = spec_for(server) if spec is True else (spec or None)
    name = instance or getattr(getattr(server, "config", None), "name", None) or type(server).__name__
    participant = GymResourcesParticipant(server, chosen, str(name), admission_wait=admission_wait)
    start_paused_if_asked(participant)
    if chosen is None:
        _LOG.warning("%s has no checkpoint spec: restart-only (its rollouts are dispatched afresh)", name)
    install_error_handlers(app)
    if mount_control:
        secret = token or os.environ.get("ROLLOUT_CHECKPOINT_TOKEN")
        if not secret:
            raise ValueError("attach needs a control token (token= or ROLLOUT_CHECKPOINT_TOKEN)")
        install_participant(
            app, participant, token=secret, store=store or os.environ.get("ROLLOUT_CHECKPOINT_STORE")
        )
    # innermost: Starlette runs user_middleware[0] first, so the last entry sees the request last
    from starlette.middleware import Middleware

    app.user_middleware.append(
        Middleware(_CheckpointMiddleware, participant=participant, wait=admission_wait)
    )
    app.state.rollout_checkpoint_participant = participant
    return participant


T = TypeVar("T")

_CHECKPOINTED_MARK = "__rollout_checkpoint_attached__"


def is_checkpointed(server_class: type) -> bool:
    """Whether ``server_class`` already attaches a participant (made by :func:`checkpointed`,
    or one of the SDK's checkpointed Gym classes)."""
    return bool(getattr(server_class, _CHECKPOINTED_MARK, False))


def _refuse_role(server_class: type) -> None:
    """Agents and model servers are not resources servers: name what checkpoints them."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in server_class.__mro__}
    if "nemo_gym.base_responses_api_agent.BaseResponsesAPIAgent" in names:
        raise InvalidArgumentError(
            f"{server_class.__name__} is a Gym agent, not a resources server: run "
            "CheckpointedGymnasiumAgent (gymnasium_agent) or CheckpointedSimpleAgent (simple_agent) "
            "from rollout_checkpoint.integrations.nemo_gym instead"
        )
    if "nemo_gym.base_responses_api_model.BaseResponsesAPIModel" in names:
        raise InvalidArgumentError(
            f"{server_class.__name__} is a Gym model server, not a resources server: run the "
            "checkpointed policy model server of rollout_checkpoint.integrations.nemo_gym.model instead"
        )


def checkpointed(server_class: type[T], *, spec: SessionSpec | bool | None = True) -> type[T]:
    """A subclass of the Gym resources ``server_class`` whose ``setup_webserver()`` attaches
    the participant (settings from the environment, see :func:`attach`), so that Gym's own
    ``run_webserver()`` starts it checkpointed.

    Refused (``invalid_argument``, one line): a class that is already checkpointed (it would
    attach twice), and a Gym agent or model server (naming what checkpoints those)."""
    _refuse_role(server_class)
    if is_checkpointed(server_class):
        raise InvalidArgumentError(
            f"{server_class.__name__} is already checkpointed: pass the Gym class itself, "
            "not the result of checkpointed()"
        )
    base: Any = server_class

    class Checkpointed(base):
        def setup_webserver(self) -> Any:
            app = super().setup_webserver()
            attach(self, app, spec=spec)
            return app

    setattr(Checkpointed, _CHECKPOINTED_MARK, True)
    Checkpointed.__name__ = Checkpointed.__qualname__ = f"Checkpointed{server_class.__name__}"
    Checkpointed.__module__ = server_class.__module__
    return Checkpointed
