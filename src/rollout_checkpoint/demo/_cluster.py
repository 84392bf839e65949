"""The demo with every server a real process on 127.0.0.1 (``rollout-checkpoint demo``).

:func:`run_cluster_demo` starts the token store, the policy model, the agent and one resources
server per reference environment (``rollout-checkpoint serve KIND``, see :mod:`._servers`) and a
coordinator process (:mod:`._cluster_coordinator`) that dispatches the rollouts to the agent
server, hands finished ones off in its registry and checkpoints every ``checkpoint_every`` s.
With ``kill``, once a checkpoint is published and rollouts are still running, this parent (the
supervisor) announces the kill in a control file, SIGKILLs that process and restarts only it;
the coordinator (the surviving one, or the replacement when the coordinator died) then restores
the latest published checkpoint into the survivors plus the replacement, resumes and finishes.
Only when a crash interrupts a restore before its next checkpoint does every server restart
(the coordinator asks with :data:`FRESH_EXIT`). The same seed is then run uninterrupted
in-process, and the final states and rewards are compared. The token travels only in the
environment of the processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
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

from ..errors import CheckpointError
from ..format.commit_log import list_published
from ..ids import ExecutionId
from ..participants.environments import reference_environments
from ..server import CHECKPOINT_ROUTE_PREFIX, EXIT_WITH_ENV, TOKEN_ENV
from ..store import ObjectStore
from ._cluster_coordinator import FRESH_EXIT, MAX_TOKENS, read_json, write_json
from ._run import DemoReport, _join, _threads
from ._workload import DemoWorld, Ledger, RolloutSpec, rollout_specs

__all__ = ["KILLABLE", "counted", "run_cluster_demo"]

KILLABLE = ("model", "agent", "resources", "tokens", "coordinator")
CRASH_WAIT_S = 60.0
"""Seconds the first crash waits (the run goes on, checkpointed) for a checkpoint that lets half
the rollouts continue and holds a generation cut of one of them; past that it comes anyway."""
Progress = Callable[[str], None]
_ENV_PREFIX = "ROLLOUT_CHECKPOINT_DEMO_"


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


# -- the parent: processes, kills, restarts, the report ---------------------------------------------


class _Cluster:
    def __init__(
        self,
        store_url: str,
        workdir: Path,
        *,
        seed: int,
        workers: int,
        token_delay: float,
        token: str,
        accept_unsafe_store: bool = False,
    ) -> None:
        self.store_url = store_url
        self.accept_unsafe_store = accept_unsafe_store
        self.workdir = workdir
        self.envs = [env.name for env in reference_environments()]
        self.names = ["tokens", "model", "agent", *self.envs]
        self.urls = {name: f"http://127.0.0.1:{_free_port()}" for name in self.names}
        self.env = {
            **os.environ,
            TOKEN_ENV: token,
            EXIT_WITH_ENV: str(os.getpid()),  # a SIGKILLed demo leaves no server running
            f"{_ENV_PREFIX}SEED": str(seed),
            f"{_ENV_PREFIX}TOKEN_DELAY": str(token_delay),
            f"{_ENV_PREFIX}CONCURRENCY": "64",
            f"{_ENV_PREFIX}TOKENS_URL": self.urls["tokens"],
            f"{_ENV_PREFIX}MODEL_URL": self.urls["model"],
            f"{_ENV_PREFIX}RESOURCES_URLS": json.dumps({e: self.urls[e] for e in self.envs}),
        }
        # every child's temporary folders (a server's rc-workers-* socket folder) live under the
        # run's own scratch folder: a SIGKILLed server never cleans up, so the parent does, and
        # a replacement server finds its predecessor's leftovers where the parent removes them
        # (a short name in the temp directory: the Unix socket paths below it must stay short)
        self.scratch = Path(tempfile.mkdtemp(prefix="rc"))
        self.env["TMPDIR"] = str(self.scratch)
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
                "import sys; from rollout_checkpoint.demo._cluster_coordinator import coordinator_main; "
                "sys.exit(coordinator_main(sys.argv[1]))",
                *args,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def start_servers(self, names: Sequence[str] | None = None) -> None:
        """Start these servers (default all) and wait until each answers with all its workers."""
        chosen = list(self.names if names is None else names)
        # the token store first: the model server asks it for its name when it starts
        for group in ([n for n in chosen if n == "tokens"], [n for n in chosen if n != "tokens"]):
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
        args = ["serve", kind, "--store", self.store_url, "--port", port, "--workers", workers]
        self._spawn(name, [*args, "--accept-unsafe-store"] if self.accept_unsafe_store else args, env)

    def _wait_ready(self, name: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        path = "/v1/tokens/name" if name == "tokens" else f"{CHECKPOINT_ROUTE_PREFIX}/status"
        expect = 1 if name in ("tokens", "model") else self.workers
        while time.monotonic() < end:
            if self.procs[name].poll() is not None:
                raise CheckpointError(f"the {name} server exited; see {self.workdir / (name + '.log')}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = httpx.get(
                    f"{self.urls[name]}{path}",
                    headers={"Authorization": f"Bearer {self.token}"},
                    trust_env=False,
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

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}


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
    _join(_threads(world, jobs, ledger, errors, max_tokens=MAX_TOKENS), timeout)
    world.close()
    return dict(ledger.results)


def _preflight(store: ObjectStore, *, accept_unsafe_store: bool) -> None:
    """Refuse a store the run could not publish to before any process starts (one typed error,
    nothing left running): conditional puts must be atomic there (an S3 endpoint is probed)
    unless the risk is accepted, and the store must take a write."""
    store.require_atomic_commits(accept_risk=accept_unsafe_store)
    key = f"demo-preflight/{uuid.uuid4().hex}"
    store.put(key, b"")
    store.delete(key)
    store.remove_empty_folders("demo-preflight/")


def _first_crash_moment(
    cluster: _Cluster, state_path: Path, rollouts: int, crash_wait: float, end: float
) -> str:
    """Wait, while the run goes on, for a published checkpoint that lets at least half the
    rollouts continue and holds a generation cut of one of them, for ``crash_wait`` seconds at
    most (then for any published checkpoint: a crash before the first would leave nothing to
    restore), or until the coordinator exits. Returns why a generation cut will not be continued
    (empty when the checkpoint holds one)."""
    give_up = time.monotonic() + crash_wait
    while time.monotonic() < end:
        state = read_json(state_path)
        if state.get("done") or cluster.procs["coordinator"].poll() is not None:
            return ""  # the caller reports that nothing was left to kill
        cuts = int(state.get("continuable_cuts", 0))
        if cuts > 0 and 2 * int(state.get("continuable", 0)) >= rollouts:
            return ""
        if time.monotonic() >= give_up and state.get("checkpoints"):
            if cuts > 0:
                return ""
            return (
                f"no checkpoint held a generation cut of a rollout to continue within {crash_wait:g} s "
                "(a slow or loaded machine; try more --turns)"
            )
        time.sleep(0.05)
    return ""


def counted(n: int, noun: str) -> str:
    """``1 checkpoint``, ``2 checkpoints``, ``0 checkpoints``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


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
    accept_unsafe_store: bool = False,
    progress: Progress | None = None,
    timeout: float = 600.0,
    workdir: Path | None = None,
    crash_wait: float = CRASH_WAIT_S,
) -> tuple[DemoReport, dict[str, Any]]:
    """Run the multi-process demo; returns the report and extra figures (pause p50/max, which
    processes restarted...). ``workdir`` holds the logs, the config and the state file (default:
    a new temporary directory). The first crash waits up to ``crash_wait`` seconds for a
    checkpoint worth crashing after (see :data:`CRASH_WAIT_S`); the report's
    ``not_demonstrated`` says what a crash that came without one did not show."""
    kills = [kill] if isinstance(kill, str) else list(kill or [])
    if skip_restore is not None and not kills:
        kills = ["coordinator"]  # a restore needs a crash: the coordinator's is the smallest
    for name in kills:
        if name not in KILLABLE:
            raise ValueError(f"kill takes one of {', '.join(KILLABLE)}, not {name!r}")
    _preflight(store, accept_unsafe_store=accept_unsafe_store)
    say = progress or (lambda _line: None)
    report = DemoReport(rollouts=rollouts, turns=turns, seed=seed)
    own_workdir = workdir is None
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="rollout-checkpoint-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = _Cluster(
        store.url,
        workdir,
        seed=seed,
        workers=workers,
        token_delay=token_delay,
        token=secrets.token_urlsafe(24),
        accept_unsafe_store=accept_unsafe_store,
    )
    specs = rollout_specs(rollouts, turns, seed, cluster.envs, prefix=f"run{uuid.uuid4().hex[:8]}")
    config = workdir / "config.json"
    state_path = workdir / "state.json"
    control = workdir / "control.json"
    settings: dict[str, Any] = {
        "store": store.url,
        "urls": cluster.urls,
        "participants": ["model", "agent", *cluster.envs],
        "specs": [{**asdict(s), "digest": s.digest} for s in specs],
        "checkpoint_every": checkpoint_every,
        "state": str(state_path),
        "control": str(control),
        "skip": skip_restore,
        "restore": False,
        "fresh": False,
        "accept_unsafe_store": accept_unsafe_store,
        "run_id": f"demo-{uuid.uuid4().hex[:12]}",  # every coordinator process of this run
    }
    write_json(config, settings)
    announced = {"killed": 0, "restarted": 0}
    write_json(control, announced)
    extra: dict[str, Any] = {"killed": [], "restarts": 0, "restarted": [], "full_restarts": 0}
    extra["workdir"] = str(workdir)
    end = time.monotonic() + timeout
    step = iter(range(1, 1000))
    no_crash = "no crash was asked for (--kill none)"
    no_cut = (
        "no continued rollout resumed a generation from a cut (the checkpoint restored, the latest "
        "when the crash came, held none)"
    )
    try:
        cluster.start_servers()
        cluster.start_coordinator(config)
        extra["pids_start"] = cluster.pids()
        say(
            f"{next(step)}. {len(cluster.names)} servers ({', '.join(cluster.names)}; {workers} workers "
            f"for the agent and each environment) and a coordinator running {rollouts} rollouts, "
            f"checkpoint every {checkpoint_every:g} s"
        )
        for round_, name in enumerate(kills):
            victim = cluster.envs[0] if name == "resources" else name
            if round_ == 0:  # mid-run: see _first_crash_moment
                no_cut = _first_crash_moment(cluster, state_path, rollouts, crash_wait, end) or no_cut
            else:  # a later crash comes while the coordinator restores, before the run goes on
                while time.monotonic() < end and cluster.procs["coordinator"].poll() is None:
                    if read_json(state_path).get("restoring"):
                        break
                    time.sleep(0.01)
            if cluster.procs["coordinator"].poll() is not None:
                # finished (or failed) before the crash: nothing to kill any more
                no_crash = f"every rollout finished before the {victim} process could be killed"
                break
            announced["killed"] += 1  # before the kill: every symptom the coordinator sees is after it
            write_json(control, announced)
            cluster.kill(victim)
            extra["killed"].append(victim)
            published = counted(len(read_json(state_path).get("checkpoints", [])), "checkpoint")
            say(f"{next(step)}. SIGKILLed the {victim} process ({published} published so far)")
            if victim == "coordinator":
                settings["restore"] = True  # the replacement starts from this run's latest checkpoint
                write_json(config, settings)
                cluster.start_coordinator(config)
            else:
                cluster.start_servers([victim])
            announced["restarted"] += 1
            write_json(control, announced)
            extra["restarts"] += 1
            extra["restarted"].append([victim])
            say(
                f"{next(step)}. restarted the {victim} process only; the "
                + ("new" if victim == "coordinator" else "surviving")
                + " coordinator restores the latest checkpoint into survivors and replacement"
            )
        while time.monotonic() < end:
            status = cluster.procs["coordinator"].poll()
            if status is None:
                time.sleep(0.1)
            elif status == FRESH_EXIT and extra["full_restarts"] < 2:
                # a crash interrupted a restore: the survivors may hold the restored attempts
                cluster.kill_all()
                settings.update(restore=True, fresh=True)
                write_json(config, settings)
                cluster.start_servers()
                cluster.start_coordinator(config)
                extra["full_restarts"] += 1
                extra["restarted"].append([*cluster.names, "coordinator"])
                say(f"{next(step)}. the crash interrupted a restore: restarted every process")
            else:
                break
        status = cluster.procs["coordinator"].poll()
        if status is None:
            report.errors.append(f"the run did not finish in {timeout:.0f} s")
        elif status != 0:
            report.errors.append(f"the coordinator exited with {status}; see {workdir}")
        extra["pids_end"] = cluster.pids()
    finally:
        cluster.kill_all()
        shutil.rmtree(cluster.scratch, ignore_errors=True)
    state = read_json(state_path)
    extra["full_restart_reasons"] = state.get("full_restart_reasons", [])
    extra["checkpoint_failures"] = state.get("checkpoint_failures", [])
    report.errors.extend(state.get("errors", []))
    results: dict[str, Any] = state.get("results", {})
    pauses = [float(p) for p in state.get("pauses_ms", [])]
    restores = state.get("restores", [])
    # only this run's: the store may hold an earlier run's checkpoints
    published_ids = {p.checkpoint_id for p in list_published(store)}
    report.checkpoints_published = len(published_ids & set(state.get("checkpoints", [])))
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
    say(f"{next(step)}. {report.completed}/{rollouts} results, {counted(len(pauses), 'checkpoint')}")
    expected = _uninterrupted(specs, seed, token_delay, timeout)
    final = {k: {"summary": v["summary"], "reward": v["reward"]} for k, v in results.items()}
    report.mismatched = sorted(
        s.rollout_id for s in specs if final.get(s.rollout_id) != expected.get(s.rollout_id)
    )
    report.matches_uninterrupted = not report.mismatched and len(expected) == rollouts
    say(
        f"{next(step)}. same seed uninterrupted (in-process): final environment states and rewards "
        + ("match" if report.matches_uninterrupted else "DIFFER for " + ", ".join(report.mismatched))
    )
    report.judge(crashed=bool(extra["killed"]), no_crash=no_crash, no_cut=no_cut)
    if own_workdir and report.ok:
        shutil.rmtree(workdir, ignore_errors=True)  # logs are kept only when something went wrong
        extra["workdir"] = None
    return report, extra
