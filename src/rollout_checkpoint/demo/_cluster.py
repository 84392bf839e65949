"""The demo with every server a real process on 127.0.0.1 (``rollout-checkpoint demo``).

:func:`run_cluster_demo` starts the token store, the policy model, the agent and one resources
server per reference environment (``rollout-checkpoint serve KIND``, see :mod:`._servers`) and a
coordinator process (:func:`coordinator_main`) that dispatches the rollouts to the agent server,
hands finished ones off in its registry and checkpoints every ``checkpoint_every`` seconds.
With ``kill``, once a checkpoint is published and rollouts are still running, that process is
SIGKILLed. Restore installs state into participants that hold none, so the demo then restarts
every process (what died, and the others, whose live state a restore replaces); the new
coordinator aborts any checkpoint left open, restores the latest published checkpoint, resumes
and dispatches what remains (continued rollouts as attempt N+1 from their boundary, fresh ones
from their input). The same seed is then run uninterrupted in-process, and the final states and
rewards are compared. Progress goes through a JSON state file the coordinator rewrites
atomically; the token travels only in the environment of the processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from pydantic import JsonValue

from ..coordinator import Coordinator
from ..errors import CheckpointError
from ..ids import ExecutionId
from ..participants.environments import reference_environments
from ..published import list_published
from ..recovery import load_checkpoint
from ..registry import LiveExecutionRegistry
from ..server import CHECKPOINT_ROUTE_PREFIX, TOKEN_ENV, RemoteParticipant, RemoteTokenStore
from ..store import ObjectStore, open_store
from ._run import DemoReport, _join, _threads
from ._workload import DemoWorld, Ledger, RolloutSpec, rollout_specs

__all__ = ["KILLABLE", "coordinator_main", "run_cluster_demo"]

KILLABLE = ("model", "agent", "resources", "tokens", "coordinator")
Progress = Callable[[str], None]
_ENV_PREFIX = "ROLLOUT_CHECKPOINT_DEMO_"
_MAX_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port_free(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                return
            except OSError:
                if time.monotonic() > end:
                    raise CheckpointError(
                        f"port {port} is still taken {timeout:.0f} s after its server died"
                    ) from None
        time.sleep(0.05)


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# -- the coordinator process ----------------------------------------------------------------------


def _latest_of_run(store: ObjectStore, rollout_ids: set[str]) -> str | None:
    """The newest published checkpoint of this run (an earlier run may share the store)."""
    for published in list_published(store):  # newest first
        if published.record is None:
            continue
        plan = load_checkpoint(store, published.checkpoint_id)
        if set(plan.rollouts) <= rollout_ids:
            return published.checkpoint_id
    return None


class _State:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.value = _read_json(path) or {"results": {}, "pauses_ms": [], "checkpoints": [], "restores": []}

    def save(self) -> None:
        _write_json(self.path, self.value)


def coordinator_main(config_path: str) -> int:
    """The coordinator process: restore the latest checkpoint if there is one, dispatch, hand off,
    checkpoint periodically, exit 0 once every rollout handed off a result."""
    config = json.loads(Path(config_path).read_text())
    token = os.environ[TOKEN_ENV]
    store = open_store(config["store"])
    urls: dict[str, str] = config["urls"]
    state = _State(Path(config["state"]))
    remotes = [RemoteParticipant(urls[name], token=token) for name in config["participants"]]
    registry = LiveExecutionRegistry()
    coordinator = Coordinator(store, remotes, registry, RemoteTokenStore(urls["tokens"], token=token))
    specs = {s["rollout_id"]: s for s in config["specs"]}
    modes = {env.name: env.mode for env in reference_environments()}
    agent = httpx.Client(base_url=urls["agent"], timeout=120)
    running: dict[str, ExecutionId] = {}

    def dispatch(execution: ExecutionId) -> None:
        spec = specs[execution.rollout_id]
        response = agent.post(
            f"/ng-rollout/{execution.rollout_id}/run",
            json={
                "attempt": execution.attempt,
                "env": spec["env"],
                "seed": spec["seed"],
                "turns": spec["turns"],
                "max_tokens": _MAX_TOKENS,
                "restart_only": modes[spec["env"]] == "restart_only",
            },
        )
        if response.status_code >= 300:
            raise CheckpointError(f"{execution}: the agent refused the run: {response.text}")
        running[execution.rollout_id] = execution

    latest = _latest_of_run(store, set(specs)) if config.get("restore") else None
    if latest is not None:
        for remote in remotes:  # a checkpoint the dead coordinator left open is aborted
            active = remote.status().checkpoint_id
            if active is not None:
                remote.resume(active, time.time() + 60)
        skip = config.get("skip")
        if skip:  # the negative control: restore without one kind, which must be refused
            kept = [r for r in remotes if r.capabilities().kind != skip]
            coordinator = Coordinator(store, kept, registry, RemoteTokenStore(urls["tokens"], token=token))
        try:
            restored = coordinator.restore(latest, deadline_s=120)
        except CheckpointError as exc:
            state.value.setdefault("errors", []).append(f"restore refused ({exc.code}): {exc.message}")
            state.value["restore_refused"] = exc.code
            state.save()
            return 2
        coordinator.resume(restored.restore_id)
        plan = restored.plan
        state.value["restores"].append(
            {
                "checkpoint_id": plan.checkpoint_id,
                "restore_id": restored.restore_id,
                **plan.counts(),
                "fresh_reasons": sorted({p.reason for p in plan.fresh}),
            }
        )
        for rollout_id, entry in plan.rollouts.items():
            if entry.disposition == "completed":
                info = registry.get(rollout_id)
                if info.result is not None:
                    state.value["results"][rollout_id] = info.result.result
                continue
            nxt = entry.execution.next_attempt()
            if entry.disposition == "fresh_dispatch":
                registry.start(nxt)
            dispatch(nxt)
    else:
        for rollout_id, spec in specs.items():
            execution = registry.dispatch(
                rollout_id, input_digest=spec["digest"], restart_only=modes[spec["env"]] == "restart_only"
            )
            registry.start(execution)
            dispatch(execution)
    state.save()
    every = float(config["checkpoint_every"])
    next_checkpoint = time.monotonic() + every
    while running:
        for rollout_id, execution in list(running.items()):
            result = agent.get(
                f"/ng-rollout/{rollout_id}/result", params={"attempt": execution.attempt}
            ).json()
            if result.get("status") == "done":
                outcome: dict[str, JsonValue] = {
                    "summary": result["summary"],
                    "reward": result["reward"],
                    "cuts_continued": result.get("cuts_continued", 0),
                    "restored_turn": result.get("restored_turn"),
                    "first_turn": result.get("first_turn"),
                }
                registry.finish(execution)
                registry.hand_off(execution, outcome, reward=float(result["reward"]))
                state.value["results"][rollout_id] = outcome
                del running[rollout_id]
            elif result.get("status") in ("failed", "unknown"):
                state.value.setdefault("errors", []).append(f"{execution}: {result.get('error', result)}")
                state.save()
                return 1
        if running and time.monotonic() >= next_checkpoint:
            outcome_ = coordinator.checkpoint(deadline_s=120)
            state.value["pauses_ms"].append(outcome_.pause_seconds * 1000)
            state.value["checkpoints"].append(outcome_.checkpoint_id)
            counts = load_checkpoint(store, outcome_.checkpoint_id).counts()
            state.value["continuable"] = int(counts.get("continue", 0))
            next_checkpoint = time.monotonic() + every
        state.save()
        time.sleep(0.05)
    state.value["done"] = True
    state.save()
    return 0


# -- the parent: processes, kills, restarts, the report ---------------------------------------------


class _Cluster:
    def __init__(
        self, store_url: str, workdir: Path, *, seed: int, workers: int, token_delay: float, token: str
    ) -> None:
        self.store_url = store_url
        self.workdir = workdir
        self.envs = [env.name for env in reference_environments()]
        self.names = ["tokens", "model", "agent", *self.envs]
        self.urls = {name: f"http://127.0.0.1:{_free_port()}" for name in self.names}
        self.env = {
            **os.environ,
            TOKEN_ENV: token,
            f"{_ENV_PREFIX}SEED": str(seed),
            f"{_ENV_PREFIX}TOKEN_DELAY": str(token_delay),
            f"{_ENV_PREFIX}CONCURRENCY": "64",
            f"{_ENV_PREFIX}TOKENS_URL": self.urls["tokens"],
            f"{_ENV_PREFIX}MODEL_URL": self.urls["model"],
            f"{_ENV_PREFIX}RESOURCES_URLS": json.dumps({e: self.urls[e] for e in self.envs}),
        }
        self.workers = workers
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.token = token

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-c", "from rollout_checkpoint.cli import main; main()", *args]
            if args[0] == "serve"
            else [
                sys.executable,
                "-c",
                "import sys; from rollout_checkpoint.demo._cluster import coordinator_main; "
                "sys.exit(coordinator_main(sys.argv[1]))",
                *args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def start_servers(self) -> None:
        # the token store first: the model server asks it for its name when it starts
        for group in (["tokens"], [n for n in self.names if n != "tokens"]):
            for name in group:
                self._start_server(name)
            for name in group:
                self._wait_ready(name)

    def _start_server(self, name: str) -> None:
        kind = "resources" if name in self.envs else name
        env = {**self.env, f"{_ENV_PREFIX}ENV": name} if name in self.envs else self.env
        port = self.urls[name].rsplit(":", 1)[1]
        workers = "1" if name in ("tokens", "model") else str(self.workers)
        _wait_port_free(int(port))  # a killed server's workers may still hold it a moment
        self._spawn(
            name, ["serve", kind, "--store", self.store_url, "--port", port, "--workers", workers], env
        )

    def _wait_ready(self, name: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        path = "/v1/tokens/name" if name == "tokens" else f"{CHECKPOINT_ROUTE_PREFIX}/status"
        expect = 1 if name in ("tokens", "model") else self.workers
        while time.monotonic() < end:
            if self.procs[name].poll() is not None:
                raise CheckpointError(f"the {name} server exited; see {self.workdir / (name + '.log')}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = httpx.get(
                    f"{self.urls[name]}{path}", headers={"Authorization": f"Bearer {self.token}"}
                )
                if response.status_code == 200 and (
                    name == "tokens" or response.json().get("workers") == expect
                ):
                    return
            time.sleep(0.1)
        raise CheckpointError(f"the {name} server did not start in {timeout:.0f} s")

    def start_coordinator(self, config: Path) -> None:
        self._spawn("coordinator", [str(config)], self.env)

    def kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def kill_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def _uninterrupted(specs: list[RolloutSpec], seed: int, token_delay: float, timeout: float) -> dict[str, Any]:
    from ..store import MemoryStore

    world = DemoWorld(
        MemoryStore(f"demo-reference-{uuid.uuid4().hex}"),
        seed=seed,
        token_delay=token_delay,
        concurrency=max(8, len(specs)),
    )
    ledger = Ledger()
    jobs: list[tuple[RolloutSpec, ExecutionId, Any]] = []
    for spec in specs:
        execution = world.registry.dispatch(
            spec.rollout_id,
            input_digest=spec.digest,
            restart_only=world.envs[spec.env].mode == "restart_only",
        )
        world.registry.start(execution)
        jobs.append((spec, execution, None))
    errors: list[str] = []
    _join(_threads(world, jobs, ledger, errors, max_tokens=_MAX_TOKENS), timeout)
    world.close()
    return dict(ledger.results)


def run_cluster_demo(
    store: ObjectStore,
    *,
    rollouts: int = 6,
    turns: int = 4,
    seed: int = 7,
    kill: str | Sequence[str] | None = None,
    checkpoint_every: float = 1.0,
    workers: int = 2,
    token_delay: float = 0.05,
    skip_restore: str | None = None,
    progress: Progress | None = None,
    timeout: float = 600.0,
) -> tuple[DemoReport, dict[str, Any]]:
    """Run the multi-process demo; returns the report and extra figures (pause p50/max...)."""
    kills = [kill] if isinstance(kill, str) else list(kill or [])
    if skip_restore is not None and not kills:
        kills = ["coordinator"]  # a restore needs a crash: the coordinator's is the smallest
    for name in kills:
        if name not in KILLABLE:
            raise ValueError(f"kill takes one of {', '.join(KILLABLE)}, not {name!r}")
    say = progress or (lambda _line: None)
    report = DemoReport(rollouts=rollouts, turns=turns, seed=seed)
    workdir = Path(tempfile.mkdtemp(prefix="rollout-checkpoint-demo-"))
    cluster = _Cluster(
        store.url,
        workdir,
        seed=seed,
        workers=workers,
        token_delay=token_delay,
        token=secrets.token_urlsafe(24),
    )
    specs = rollout_specs(rollouts, turns, seed, cluster.envs, prefix=f"run{uuid.uuid4().hex[:8]}")
    config = workdir / "config.json"
    state_path = workdir / "state.json"
    _write_json(
        config,
        {
            "store": store.url,
            "urls": cluster.urls,
            "participants": ["model", "agent", *cluster.envs],
            "specs": [{**asdict(s), "digest": s.digest} for s in specs],
            "checkpoint_every": checkpoint_every,
            "state": str(state_path),
            "skip": skip_restore,
            "restore": False,
        },
    )
    extra: dict[str, Any] = {"killed": [], "restarts": 0, "workdir": str(workdir)}
    end = time.monotonic() + timeout
    try:
        cluster.start_servers()
        cluster.start_coordinator(config)
        say(
            f"1. {len(cluster.names)} servers ({', '.join(cluster.names)}; {workers} workers for the agent "
            f"and each environment) and a coordinator running {rollouts} rollouts, checkpoint every "
            f"{checkpoint_every:g} s"
        )
        for round_, name in enumerate(kills):
            victim = cluster.envs[0] if name == "resources" else name
            if round_ == 0:  # mid-run: once a checkpoint lets at least half the rollouts continue
                while time.monotonic() < end:
                    state = _read_json(state_path)
                    if 2 * int(state.get("continuable", 0)) >= rollouts:
                        break
                    if state.get("done") or cluster.procs["coordinator"].poll() is not None:
                        break
                    time.sleep(0.05)
            # a later kill comes right after the restart, before the replacement got going
            cluster.kill(victim)
            extra["killed"].append(victim)
            published = len(list_published(store))
            say(
                f"{2 + 2 * round_}. SIGKILLed the {victim} process ({published} checkpoints published so far)"
            )
            cluster.kill_all()  # restore installs into participants without live state: all restart
            settings = _read_json(config)
            settings["restore"] = True  # from now on the coordinator starts from this run's checkpoint
            _write_json(config, settings)
            cluster.start_servers()
            cluster.start_coordinator(config)
            extra["restarts"] += 1
            say(f"{3 + 2 * round_}. restarted every process; the coordinator restores the latest checkpoint")
        coordinator = cluster.procs["coordinator"]
        while coordinator.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        if coordinator.poll() is None:
            report.errors.append(f"the run did not finish in {timeout:.0f} s")
        elif coordinator.returncode != 0:
            report.errors.append(f"the coordinator exited with {coordinator.returncode}; see {workdir}")
    finally:
        cluster.kill_all()
    state = _read_json(state_path)
    report.errors.extend(state.get("errors", []))
    results: dict[str, Any] = state.get("results", {})
    pauses = [float(p) for p in state.get("pauses_ms", [])]
    restores = state.get("restores", [])
    report.checkpoints_published = len(list_published(store))
    report.checkpoint_ids = list(state.get("checkpoints", []))
    if restores:
        report.restore_id = restores[-1]["restore_id"]
        report.continued = int(restores[-1].get("continue", 0))
        report.fresh_dispatch = int(restores[-1].get("fresh_dispatch", 0))
    report.generation_cuts_continued = sum(int(r.get("cuts_continued", 0)) for r in results.values())
    # a continued attempt that ran a turn at or before its restored boundary repeated a model call
    # and a tool call that had already completed
    repeated = sum(
        1
        for r in results.values()
        if r.get("restored_turn") is not None and int(r.get("first_turn", 0)) <= int(r["restored_turn"])
    )
    report.repeated_model_calls = report.repeated_tool_calls = repeated
    report.completed = len(results)
    report.lost_results = rollouts - len(results)
    report.pause_ms = round(max(pauses, default=0.0), 3)
    report.pause_ms_max = report.pause_ms
    report.pause_ms_p50 = round(statistics.median(pauses), 3) if pauses else 0.0
    extra["restore_refused"] = state.get("restore_refused")
    say(f"{2 + 2 * len(kills)}. {report.completed}/{rollouts} results, {len(pauses)} checkpoints")
    expected = _uninterrupted(specs, seed, token_delay, timeout)
    final = {k: {"summary": v["summary"], "reward": v["reward"]} for k, v in results.items()}
    report.mismatched = sorted(
        s.rollout_id for s in specs if final.get(s.rollout_id) != expected.get(s.rollout_id)
    )
    report.matches_uninterrupted = not report.mismatched and len(expected) == rollouts
    say(
        f"{3 + 2 * len(kills)}. same seed uninterrupted (in-process): final environment states and rewards "
        + ("match" if report.matches_uninterrupted else "DIFFER for " + ", ".join(report.mismatched))
    )
    return report, extra
