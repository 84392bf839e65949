"""Reference servers: the demo's participants as HTTP apps, built only from the public SDK.

Each build function takes a :class:`~rollout_checkpoint.server.WorkerContext` and returns the
app and its participant, so ``rollout-checkpoint serve KIND`` (and :func:`run_server`) serve
it with one or several worker processes. They double as the integration example: a route that
starts new work awaits admission (parked, not failed, while a checkpoint runs), every blocking
SDK call runs off the event loop, and every refusal is the control plane's error body.

Routes live under ``/ng-rollout/<rollout_id>/`` so that a multi-worker server places each
rollout on one worker. Settings come from the environment (inherited by worker processes):
``ROLLOUT_CHECKPOINT_DEMO_SEED``, ``..._TOKEN_DELAY``, ``..._CONCURRENCY``, ``..._DELIVERY``,
``..._ENV`` (the resources server's environment), ``..._MODEL_URL``, ``..._RESOURCES_URLS``
(JSON ``{env: url}``) and ``..._TOKENS_URL`` (else the token store on the server's store).
``..._RESOLVE`` (``package.module:function``, optional) maps a peer's name (``model`` or an
environment's) to its URL when a rollout attempt starts, for peers that may move (Ray actors):
the agent then never keeps a URL captured when it was built.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections.abc import Callable
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from ..errors import CheckpointError
from ..format.records import AgentBoundaryRecord
from ..ids import ID_MAX_LENGTH, ID_PATTERN, ExecutionId, Identifier
from ..participants import AgentParticipant, FakeGenerationBackend, PolicyModelParticipant
from ..participants.environments import make_participant, reference_environments
from ..server import (
    TOKEN_ENV,
    AsyncAdmission,
    RemoteTokenStore,
    ServedApp,
    WorkerContext,
    error_from_wire,
    install_error_handlers,
    run_blocking,
)
from ..tokens import ObjectStoreTokenStore

__all__ = ["build_agent", "build_model", "build_resources", "settings", "warm_store"]

PREFIX = "ROLLOUT_CHECKPOINT_DEMO_"
SESSION = "env"
POLICY_VERSION = "v1"
WAIT_SECONDS = 120.0


def settings() -> dict[str, str]:
    return {k[len(PREFIX) :].lower(): v for k, v in os.environ.items() if k.startswith(PREFIX)}


# what the routes accept, declared in the OpenAPI document so a generated client sends valid
# requests; a value outside them is a 422 ``invalid_request`` (never a 500)
RolloutIdPath = Annotated[
    str,
    Path(pattern=ID_PATTERN.pattern, max_length=ID_MAX_LENGTH, description="a rollout id (no '..')"),
]
AttemptQuery = Annotated[int, Query(ge=0, le=2**31 - 1, description="the attempt, 0-based")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Generate(_Body):
    attempt: int = Field(ge=0)
    call_id: Identifier
    prompt_token_ids: list[int] = Field(max_length=4096)
    max_tokens: int = Field(default=12, ge=1, le=4096)


class Attempt(_Body):
    attempt: int = Field(ge=0)


class Seed(_Body):
    attempt: int = Field(ge=0)
    seed: int


class Step(_Body):
    attempt: int = Field(ge=0)
    action: int = Field(ge=0)


class Run(_Body):
    attempt: int = Field(ge=0)
    env: str
    seed: int
    turns: int = Field(ge=1, le=1000)
    max_tokens: int = Field(default=12, ge=1, le=4096)
    restart_only: bool = False


def _tokens(context: WorkerContext) -> ObjectStoreTokenStore | RemoteTokenStore:
    url = settings().get("tokens_url")
    if url:
        return RemoteTokenStore(url, token=context.token or os.environ[TOKEN_ENV])
    return ObjectStoreTokenStore(context.store)


def warm_store(context: WorkerContext) -> None:
    """Pay the store's first-use costs when the worker starts, not inside the first checkpoint's
    pause: on S3, the client session and the conditional-put probe (cached per process; an
    endpoint that cannot be reached fails the start, with the store error). A store opened with
    the risk accepted makes no conditional-put probe: none is run."""
    if getattr(context.store, "accept_unsafe_store", False):
        return
    probe = getattr(context.store, "probe_conditional_writes", None)
    if callable(probe):
        probe()


def _resolver(spec: str) -> Callable[[str], str] | None:
    """The ``package.module:function`` that names a peer's URL now, if configured."""
    if not spec:
        return None
    module, _, name = spec.partition(":")
    function: Callable[[str], str] = getattr(importlib.import_module(module), name)
    return function


def build_model(context: WorkerContext) -> ServedApp:
    """The policy model over the deterministic fake generation backend."""
    warm_store(context)
    conf = settings()
    tokens = _tokens(context)
    backend = FakeGenerationBackend(
        seed=int(conf.get("seed", "0")),
        token_delay=float(conf.get("token_delay", "0.002")),
        concurrency=int(conf.get("concurrency", "8")),
        token_source=tokens,
    )
    model = PolicyModelParticipant(
        tokens,
        "policy",
        backend=backend,
        delivery=conf.get("delivery", "inline"),  # type: ignore[arg-type]
    )
    app = FastAPI(title="rollout-checkpoint reference policy model")
    install_error_handlers(app)

    @app.post("/ng-rollout/{rollout_id}/generate")
    async def generate(rollout_id: RolloutIdPath, body: Generate) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=body.attempt)
        result = await run_blocking(
            lambda: model.generate(
                execution,
                body.call_id,
                body.prompt_token_ids,
                max_tokens=body.max_tokens,
                policy_version=POLICY_VERSION,
                wait=WAIT_SECONDS,
            )
        )
        return {
            "token_ids": list(result.token_ids),
            "finish_reason": result.finish_reason,
            "continued_from_cut": result.continued_from is not None,
            "prefix_token_count": result.prefix_token_count,
        }

    @app.post("/ng-rollout/{rollout_id}/finish")
    async def finish(rollout_id: RolloutIdPath, body: Attempt) -> dict[str, bool]:
        await run_blocking(model.finish, ExecutionId(rollout_id=rollout_id, attempt=body.attempt))
        return {"finished": True}

    @app.get("/stats")
    async def stats() -> dict[str, int]:
        return dict(model.stats())

    return ServedApp(app=app, participant=model)


def build_resources(context: WorkerContext) -> ServedApp:
    """One reference environment (``..._ENV``, default blackjack) behind a resources participant."""
    warm_store(context)
    name = settings().get("env", "blackjack")
    envs = {env.name: env for env in reference_environments()}
    if name not in envs:
        raise ValueError(f"unknown environment {name!r}: one of {sorted(envs)}")
    env = envs[name]
    resources = make_participant(env)
    admission = AsyncAdmission(resources)
    app = FastAPI(title=f"rollout-checkpoint reference resources ({name})")
    install_error_handlers(app)

    def view(execution: ExecutionId) -> dict[str, Any]:
        state, revision = resources.state(execution, SESSION)
        return {
            "instance": resources.instance,
            "actions": env.actions,
            "obs": list(env.observe(state)),
            "revision": revision,
            "done": env.done(state),
            "reward": env.reward(state),
            "summary": dict(env.summary(state)),
        }

    @app.post("/ng-rollout/{rollout_id}/seed_session")
    async def seed_session(rollout_id: RolloutIdPath, body: Seed) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=body.attempt)
        await admission.call(
            lambda: resources.open_session(execution, SESSION, env.reset(body.seed)), timeout=WAIT_SECONDS
        )
        return await run_blocking(view, execution)

    @app.post("/ng-rollout/{rollout_id}/step")
    async def step(rollout_id: RolloutIdPath, body: Step) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=body.attempt)
        await run_blocking(
            lambda: resources.mutate(
                execution, SESSION, lambda s: env.step(s, body.action), wait=WAIT_SECONDS
            )
        )
        return await run_blocking(view, execution)

    @app.get("/ng-rollout/{rollout_id}/state")
    async def state(rollout_id: RolloutIdPath, attempt: AttemptQuery) -> dict[str, Any]:
        return await run_blocking(view, ExecutionId(rollout_id=rollout_id, attempt=attempt))

    @app.post("/ng-rollout/{rollout_id}/close_session")
    async def close_session(rollout_id: RolloutIdPath, body: Attempt) -> dict[str, bool]:
        await run_blocking(
            resources.end_session, ExecutionId(rollout_id=rollout_id, attempt=body.attempt), SESSION
        )
        return {"closed": True}

    return ServedApp(app=app, participant=resources)


class _Remote:
    """One rollout attempt's client to a reference server (its own cookie jar: one session)."""

    def __init__(self, base_url: str, rollout_id: str) -> None:
        self._client = httpx.Client(
            base_url=f"{base_url.rstrip('/')}/ng-rollout/{rollout_id}",
            timeout=WAIT_SECONDS + 30,
            trust_env=False,
        )

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, **params: Any
    ) -> dict[str, Any]:
        response = self._client.request(method, path, json=body, params=params or None)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise error_from_wire(str(error["code"]), str(error["detail"]))
            except (ValueError, KeyError, TypeError):
                raise CheckpointError(f"{path}: HTTP {response.status_code}") from None
        result: dict[str, Any] = response.json()
        return result

    def close(self) -> None:
        self._client.close()


def _agent_state(obs: list[int], actions: list[int], reward: float) -> bytes:
    return json.dumps({"obs": obs, "actions": actions, "reward": reward}, separators=(",", ":")).encode()


def build_agent(context: WorkerContext) -> ServedApp:
    """The agent: ``POST /ng-rollout/<id>/run`` runs a rollout (multi-turn: the policy model for
    tokens, the environment's resources server for each action) in a thread; ``GET .../result``."""
    warm_store(context)
    conf = settings()
    model_url = conf.get("model_url", "")
    resources_urls: dict[str, str] = json.loads(conf.get("resources_urls", "{}"))
    agent = AgentParticipant("agent")
    admission = AsyncAdmission(agent)
    results: dict[ExecutionId, dict[str, Any]] = {}
    lock = threading.Lock()
    app = FastAPI(title="rollout-checkpoint reference agent")
    install_error_handlers(app)

    resolve = _resolver(conf.get("resolve", ""))

    def loop(execution: ExecutionId, body: Run, restored: AgentBoundaryRecord | None) -> None:
        model = _Remote(resolve("model") if resolve else model_url, execution.rollout_id)
        env = _Remote(resolve(body.env) if resolve else resources_urls[body.env], execution.rollout_id)
        a = {"attempt": execution.attempt}
        try:
            if restored is None:
                view = env.call("POST", "/seed_session", {**a, "seed": body.seed})
                actions: list[int] = []
                obs, turn, usage = list(view["obs"]), 0, 0
                agent.boundary(execution, _boundary(execution, 0, None, view, obs, actions, 0))
            else:
                view = env.call("GET", "/state", attempt=execution.attempt)  # restored, attempt N+1
                saved = json.loads(restored.agent_state or b"{}")
                obs, actions, turn = list(saved["obs"]), list(saved["actions"]), restored.turn_index
                usage = len(actions) * body.max_tokens
            continued = 0
            restored_turn = None if restored is None else restored.turn_index
            first_turn = turn + 1  # the first turn this attempt runs (completed ones are never redone)
            while True:
                turn += 1
                call_id = f"call-{turn}"
                agent.start_turn(execution, wait=WAIT_SECONDS)
                prompt = [body.seed % 997, turn, *obs, *actions[-4:]]
                with agent.awaiting_model(execution, call_id):
                    result = model.call(
                        "POST",
                        "/generate",
                        {**a, "call_id": call_id, "prompt_token_ids": prompt, "max_tokens": body.max_tokens},
                    )
                continued += bool(result["continued_from_cut"])
                action = sum(result["token_ids"]) % int(view["actions"])
                view = env.call("POST", "/step", {**a, "action": action})
                obs, actions = list(view["obs"]), [*actions, action]
                usage += len(result["token_ids"])
                if view["done"] or turn >= body.turns:
                    env.call("POST", "/close_session", a)
                    model.call("POST", "/finish", a)
                    agent.finish(execution)
                    outcome = {
                        "status": "done",
                        "summary": view["summary"],
                        "reward": view["reward"],
                        "cuts_continued": continued,
                        "restored_turn": restored_turn,
                        "first_turn": first_turn,
                    }
                    break
                agent.boundary(execution, _boundary(execution, turn, call_id, view, obs, actions, usage))
        except Exception as exc:  # reported, not raised: the framework decides (retire, redispatch)
            outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        finally:
            model.close()
            env.close()
        with lock:
            results[execution] = outcome

    @app.post("/ng-rollout/{rollout_id}/run", status_code=202)
    async def run(rollout_id: RolloutIdPath, body: Run) -> dict[str, Any]:
        execution = ExecutionId(rollout_id=rollout_id, attempt=body.attempt)
        restored = await admission.call(
            lambda: agent.begin(execution, restart_only=body.restart_only), timeout=WAIT_SECONDS
        )
        with lock:
            results[execution] = {"status": "running"}
        threading.Thread(target=loop, args=(execution, body, restored), daemon=True).start()
        return {"accepted": True, "continued": restored is not None}

    @app.get("/ng-rollout/{rollout_id}/result")
    async def result(rollout_id: RolloutIdPath, attempt: AttemptQuery) -> dict[str, Any]:
        with lock:
            return dict(
                results.get(ExecutionId(rollout_id=rollout_id, attempt=attempt), {"status": "unknown"})
            )

    return ServedApp(app=app, participant=agent)


def _boundary(
    execution: ExecutionId,
    turn: int,
    call_id: str | None,
    view: dict[str, Any],
    obs: list[int],
    actions: list[int],
    usage: int,
) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        boundary_index=turn,
        turn_index=turn,
        last_model_call_id=call_id,
        resource_revisions={view["instance"]: {SESSION: view["revision"]}},
        output_items=[{"turn": turn, "action": a} for a in actions[-3:]],
        usage={"output_tokens": usage},
        cookies={"affinity": view["instance"]},
        agent_state=_agent_state(obs, actions, float(view["reward"])),
    )
