"""An episode that finishes during prepare, with every participant a real server process on
127.0.0.1: the checkpoint holds it completed with its result (not lost), and a restore into
fresh processes after a SIGKILL of all of them neither redispatches nor restores it (not redone).

The agent is the test-driven one (``_driven_agent.py``), so the episode sits in the middle of its
last turn when the checkpoint starts: the agent stage waits for it (prepare never cancels a
turn). The policy model and the environment are the reference servers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _procs import start_group
from conftest import _free_port
from rollout_checkpoint.coordinator import CheckpointOutcome, Coordinator
from rollout_checkpoint.errors import CheckpointError
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOKEN = "tok-finish-during-prepare"
HERE = Path(__file__).parent
BUILDS = {
    "agent": "_driven_agent:build",
    "model": "rollout_checkpoint.demo._servers:build_model",
    "resources": "rollout_checkpoint.demo._servers:build_resources",
}
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


class Servers:
    """Starts the three servers; :meth:`crash` SIGKILLs every one (the fixture does at teardown)."""

    def __init__(self, start: Callable[[], dict[str, str]], procs: list[subprocess.Popen[bytes]]) -> None:
        self.start = start
        self.procs = procs

    def crash(self) -> None:
        for proc in self.procs:
            kill_group(proc)


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[Servers]:
    procs: list[subprocess.Popen[bytes]] = []
    env = {
        **os.environ,
        "ROLLOUT_CHECKPOINT_TOKEN": TOKEN,
        "ROLLOUT_CHECKPOINT_DEMO_SEED": "5",
        "ROLLOUT_CHECKPOINT_DEMO_TOKEN_DELAY": "0.001",
        "ROLLOUT_CHECKPOINT_DEMO_ENV": "blackjack",
    }
    env.pop("ROLLOUT_CHECKPOINT_DEMO_TOKENS_URL", None)  # the model uses the store's token store

    def start() -> dict[str, str]:
        urls = {}
        for kind, build in BUILDS.items():
            port = _free_port()
            procs.append(
                start_group(
                    [
                        sys.executable,
                        str(HERE / "_serve_main.py"),
                        build,
                        str(tmp_path / "store"),
                        str(port),
                        "1",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls[kind] = f"http://127.0.0.1:{port}"
        for kind, url in urls.items():
            end = time.monotonic() + 60
            while True:
                try:
                    if (
                        httpx.get(f"{url}{CHECKPOINT_ROUTE_PREFIX}/status", headers=HEADERS).status_code
                        == 200
                    ):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > end:
                    raise RuntimeError(f"the {kind} server did not start")
                time.sleep(0.05)
        return urls

    running = Servers(start, procs)
    try:
        yield running
    finally:
        running.crash()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group: worker processes too
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def call(url: str, rollout_id: str, path: str, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/ng-rollout/{rollout_id}/{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def coordinator(
    store: LocalStore, urls: dict[str, str], registry: LiveExecutionRegistry, **kw: Any
) -> Coordinator:
    remotes = [RemoteParticipant(urls[kind], token=TOKEN) for kind in ("agent", "model", "resources")]
    return Coordinator(store, remotes, registry, ObjectStoreTokenStore(store), **kw, run_id="test-run")


def test_an_episode_finishing_during_prepare_is_neither_lost_nor_redone(
    tmp_path: Path, servers: Servers
) -> None:
    store = LocalStore(tmp_path / "store")
    urls = servers.start()
    registry = LiveExecutionRegistry()
    agent, model, env = urls["agent"], urls["model"], urls["resources"]

    def turn(rollout_id: str, index: int, view: dict[str, Any]) -> dict[str, Any]:
        """One whole turn: a model call, a tool call, the boundary."""
        call(agent, rollout_id, "start_turn", attempt=0)
        tokens = call(model, rollout_id, "generate", attempt=0, call_id=f"c{index}", prompt_token_ids=[index])
        view = call(
            env, rollout_id, "step", attempt=0, action=sum(tokens["token_ids"]) % int(view["actions"])
        )
        call(
            agent, rollout_id, "boundary", attempt=0, turn=index, call_id=f"c{index}",
            instance=view["instance"], revision=view["revision"],
        )  # fmt: skip
        return view

    views = {}
    for rollout_id in ("late", "other"):
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
        call(agent, rollout_id, "begin", attempt=0)
        view = call(env, rollout_id, "seed_session", attempt=0, seed=11)
        call(agent, rollout_id, "boundary", attempt=0, turn=0, call_id=None, instance=view["instance"],
             revision=view["revision"])  # fmt: skip
        views[rollout_id] = turn(rollout_id, 1, view)
    # "late" runs its last turn: the model answered, its tool call and the end are still to come
    late = ExecutionId(rollout_id="late", attempt=0)
    call(agent, "late", "start_turn", attempt=0)
    last = call(model, "late", "generate", attempt=0, call_id="c2", prompt_token_ids=[2])

    handed_off = threading.Event()

    def hook(step: str) -> None:
        # the framework receives the result while the checkpoint runs; the registry component
        # (written after the participants' commits) must see it
        if step.startswith("validate:"):
            assert handed_off.wait(60)

    outcome: list[CheckpointOutcome | BaseException] = []

    def checkpoint() -> None:
        try:
            outcome.append(
                coordinator(store, urls, registry, fault_hook=hook).checkpoint("ck-fin", deadline_s=90)
            )
        except BaseException as exc:  # reported below
            outcome.append(exc)

    checkpointer = threading.Thread(target=checkpoint)
    checkpointer.start()
    status = f"{agent}{CHECKPOINT_ROUTE_PREFIX}/status"
    end = time.monotonic() + 60
    while httpx.get(status, headers=HEADERS).json()["phase"] != "preparing":  # the agent stage waits
        assert time.monotonic() < end and checkpointer.is_alive()
        time.sleep(0.01)
    # the episode ends during prepare: its last tool call, closing everything, the result
    final = call(
        env, "late", "step", attempt=0, action=sum(last["token_ids"]) % int(views["late"]["actions"])
    )
    call(env, "late", "close_session", attempt=0)
    call(model, "late", "finish", attempt=0)
    assert checkpointer.is_alive() and not outcome  # still preparing when the episode ended
    call(agent, "late", "finish", attempt=0)
    registry.finish(late)
    registry.hand_off(late, {"reward": final["reward"]}, reward=float(final["reward"]))
    handed_off.set()
    checkpointer.join(120)
    [published] = outcome
    assert isinstance(published, CheckpointOutcome), published
    plan = load_checkpoint(store, "ck-fin")
    assert plan.rollouts["late"].disposition == "completed"
    assert plan.rollouts["other"].disposition == "continue", plan.rollouts["other"].reason

    # crash: every server dies; fresh processes take the restore
    servers.crash()
    fresh_urls = servers.start()
    fresh = LiveExecutionRegistry()
    restored = coordinator(store, fresh_urls, fresh).restore("ck-fin")
    coordinator(store, fresh_urls, fresh).resume(restored.restore_id)
    assert restored.plan.rollouts["late"].disposition == "completed"
    assert all("late" not in {e.rollout_id for e in done} for done in restored.restored.values())
    assert {e.rollout_id for done in restored.restored.values() for e in done} == {"other"}
    info = fresh.get("late")  # not lost: its result is there, acknowledged before the checkpoint
    assert info.state == "handed_off" and info.attempt == 0
    assert info.result is not None and info.result.result == {"reward": final["reward"]}
    with pytest.raises(CheckpointError):
        fresh.dispatch("late")  # not redone: its result is pending, it is never dispatched again
    # the continued rollout resumes at its boundary as attempt 1 in the new agent process
    assert call(fresh_urls["agent"], "other", "begin", attempt=1) == {"restored_turn": 1}
