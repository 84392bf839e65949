"""Incarnations: a participant restarted behind the same handle or URL (a supervisor brought it
back empty) never lets a checkpoint publish over it; ``Coordinator.recover`` answers it; a
repeated call that lands on the new process is refused; a participant can start paused."""

from __future__ import annotations

import json
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

from _procs import processes_mentioning, worker_server
from _protocol_fakes import (
    Deployment,
    FakeTokens,
    ScriptedParticipant,
    ex,
    latest_id,
    memory_store,
    populate,
    published_ids,
)
from conftest import _free_port, _wait_listening
from rollout_checkpoint import CheckpointError, ParticipantRestartedError
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.coordinator._publication import Publisher
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import AdmissionClosedError, CheckpointNotFoundError, InvalidRecordError
from rollout_checkpoint.format.commit_log import read_record
from rollout_checkpoint.format.manifests import GlobalCheckpointRecord, parse_document
from rollout_checkpoint.participants import ResourcesParticipant
from rollout_checkpoint.protocol import Phase
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-incarnation-secret"
HERE = Path(__file__).parent


class Restartable:
    """One handle whose participant a supervisor can replace (a Ray actor restarted in place):
    callers keep the handle, the state behind it is new."""

    def __init__(self, build: Callable[[], ScriptedParticipant]) -> None:
        self._build = build
        self.target = build()

    def restart(self) -> ScriptedParticipant:
        self.target.close()
        self.target = self._build()
        return self.target

    def __getattr__(self, name: str) -> Any:
        if not callable(getattr(self.target, name)):
            return getattr(self.target, name)

        def call(*args: Any, **kwargs: Any) -> Any:  # reaches whichever process lives at call time
            return getattr(self.target, name)(*args, **kwargs)

        return call


@pytest.fixture
def dep() -> Iterator[Deployment]:
    store = memory_store("incarnation")
    deployment = Deployment(store, token_source=FakeTokens(store))
    deployment.resources.close()
    box = Restartable(lambda: ScriptedParticipant("resources", "res-0", lease_grace_seconds=600.0))
    deployment.resources = box  # type: ignore[assignment]
    deployment.participants = [deployment.agent, deployment.model, box]  # type: ignore[list-item]
    deployment.coordinator = Coordinator(
        store,
        deployment.participants,
        deployment.registry,
        deployment.coordinator.token_source,
        run_id="test-run",
    )
    yield deployment
    deployment.close()


def test_every_reply_carries_the_incarnation_drawn_at_build() -> None:
    one, two = ScriptedParticipant("agent", "a"), ScriptedParticipant("agent", "a")
    assert one.incarnation != two.incarnation and len(one.incarnation) == 32
    deadline = time.time() + 30
    assert one.status().incarnation == one.incarnation
    assert one.prepare("ck-1", deadline).incarnation == one.incarnation
    assert one.commit("ck-1", memory_store("inc"), deadline).incarnation == one.incarnation
    assert one.resume("ck-1", deadline).incarnation == one.incarnation
    one.close()
    two.close()


def test_a_silent_restart_between_checkpoints_publishes_nothing_and_recover_continues(
    dep: Deployment,
) -> None:
    populate(dep, dep.coordinator.token_source)
    first = dep.coordinator.checkpoint("ck-1")
    assert load_checkpoint(dep.store, "ck-1").counts()["continue"] == 1
    old = dep.resources.incarnation
    replacement = dep.resources.restart()  # type: ignore[attr-defined]
    replacement.start_paused()  # as a supervisor starts it: nothing admitted before the restore
    new = replacement.incarnation
    with pytest.raises(ParticipantRestartedError) as refused:
        dep.coordinator.checkpoint("ck-2")
    error = refused.value
    assert error.code == "participant_restarted"
    assert error.details["participant"] == "resources/res-0"
    assert (error.details["expected"], error.details["actual"]) == (old, new)
    assert old in error.message and new in error.message
    # nothing published, the latest is still the last good one, every participant reopened
    assert published_ids(dep.store) == ["ck-1"] and latest_id(dep.store) == "ck-1"
    assert dep.agent.is_open() and dep.model.is_open()
    assert not replacement.accepting  # the abort's resume does not open a paused replacement
    # the refusal holds until a restore: a second try is refused as well
    with pytest.raises(ParticipantRestartedError):
        dep.coordinator.checkpoint("ck-2b")
    outcome = dep.coordinator.recover()
    assert outcome.source_checkpoint_id == first.checkpoint_id
    assert outcome.plan.counts()["continue"] == 1
    assert dep.all_open()  # resumed
    assert dep.coordinator.incarnations["resources/res-0"] == new
    assert all(p.refuses(ex("cont", 0)) for p in dep.participants)
    dep.coordinator.checkpoint("ck-3")
    plan = load_checkpoint(dep.store, "ck-3")
    assert plan.rollouts["cont"].disposition == "continue" and plan.rollouts["cont"].execution == ex(
        "cont", 1
    )


def _new_driver(dep: Deployment) -> Coordinator:
    """A restarted driver: a new coordinator object of the same run over the same handles (it
    has kept nothing: no publish, no restore yet)."""
    coordinator = Coordinator(
        dep.store, dep.participants, dep.registry, dep.coordinator.token_source, run_id="test-run"
    )
    assert coordinator.incarnations == {}
    return coordinator


def test_a_new_coordinator_over_a_silently_restarted_participant_publishes_nothing(
    dep: Deployment,
) -> None:
    """The driver restarts too and checkpoints without ``recover()``: the incarnations the run's
    latest checkpoint recorded are compared, so the empty replacement is still refused."""
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint("ck-1")
    old = dep.resources.incarnation
    recorded, _ = read_record(dep.store, "ck-1")
    assert recorded.incarnations == {
        "agent/agent-0": dep.agent.incarnation,
        "model/policy-0": dep.model.incarnation,
        "resources/res-0": old,
    }
    new = dep.resources.restart().incarnation  # type: ignore[attr-defined]
    driver = _new_driver(dep)
    with pytest.raises(ParticipantRestartedError) as refused:
        driver.checkpoint("ck-2")
    error = refused.value
    assert error.details["participant"] == "resources/res-0"
    assert (error.details["expected"], error.details["actual"]) == (old, new)
    assert "since checkpoint ck-1" in error.message and old in error.message and new in error.message
    assert published_ids(dep.store) == ["ck-1"] and latest_id(dep.store) == "ck-1"
    assert dep.agent.is_open() and dep.model.is_open()
    # recover() re-bases the kept incarnations on the restore, and the run goes on
    outcome = driver.recover()
    assert outcome.source_checkpoint_id == "ck-1" and outcome.plan.counts()["continue"] == 1
    assert driver.incarnations["resources/res-0"] == new
    driver.checkpoint("ck-3")
    assert load_checkpoint(dep.store, "ck-3").rollouts["cont"].execution == ex("cont", 1)
    assert read_record(dep.store, "ck-3")[0].incarnations["resources/res-0"] == new  # type: ignore[index]


def test_a_new_coordinator_over_surviving_participants_publishes(dep: Deployment) -> None:
    populate(dep, dep.coordinator.token_source)
    dep.coordinator.checkpoint("ck-1")
    driver = _new_driver(dep)
    outcome = driver.checkpoint("ck-2")
    assert latest_id(dep.store) == "ck-2" and outcome.record.incarnations == dep.coordinator.incarnations
    assert load_checkpoint(dep.store, "ck-2").rollouts["cont"].disposition == "continue"
    # a checkpoint of another run says nothing about this run's participants
    other = Coordinator(
        dep.store,
        dep.participants,
        dep.registry,
        dep.coordinator.token_source,
        run_id="other-run",
        takeover=True,
    )
    dep.resources.restart()  # type: ignore[attr-defined]
    other.checkpoint("ck-other")
    assert latest_id(dep.store) == "ck-other"


def test_a_new_coordinator_over_a_checkpoint_without_recorded_incarnations_behaves_as_before(
    dep: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record written before incarnations were recorded has no ``incarnations`` key (its
    bytes are those an older publisher wrote): nothing to compare with, as before."""
    populate(dep, dep.coordinator.token_source)
    publish = Publisher._publish
    with monkeypatch.context() as patched:
        patched.setattr(Publisher, "_publish", lambda self, *args: publish(self, *args[:-1], {}))
        dep.coordinator.checkpoint("ck-old")
    assert b"incarnations" not in dep.store.get("published/ck-old.json")
    assert read_record(dep.store, "ck-old")[0].incarnations is None
    dep.resources.restart()  # type: ignore[attr-defined]
    _new_driver(dep).checkpoint("ck-2")  # taken as it answers (recover() is what catches this)
    assert latest_id(dep.store) == "ck-2"


def test_a_new_coordinator_publishing_asynchronously_compares_too(tmp_path: Path) -> None:
    """The reference participants, asynchronous publication: a new driver over survivors
    publishes; one over a replaced resources participant is refused before the resume."""
    dep = DemoDeployment(LocalStore(tmp_path / "s"), run_id="async-run")
    replacement = ResourcesParticipant("resources-0", mode="exported")
    try:
        dep.populate(4)
        dep.checkpoint("ck-1")

        def driver(resources: ResourcesParticipant) -> Coordinator:
            participants = [dep.agent, dep.model, resources]
            return Coordinator(dep.store, participants, dep.registry, dep.tokens, run_id="async-run")

        outcome = driver(dep.resources).checkpoint_async("ck-2").result()
        assert outcome.record.incarnations == dep.coordinator.incarnations
        with pytest.raises(ParticipantRestartedError) as refused:
            driver(replacement).checkpoint_async("ck-3")
        assert refused.value.details == {
            "checkpoint_id": "ck-3",
            "participant": "resources/resources-0",
            "expected": dep.resources.incarnation,
            "actual": replacement.incarnation,
        }
        assert published_ids(dep.store) == ["ck-1", "ck-2"] and latest_id(dep.store) == "ck-2"
    finally:
        dep.close()
        replacement.close()


def test_recorded_incarnations_are_validated() -> None:
    def record(incarnations: object) -> bytes:
        body = {
            "type": "global_checkpoint",
            "checkpoint_id": "ck-1",
            "sequence": 1,
            "created_at": "2026-12-04T00:00:00Z",
            "commit_token": "t",
            "coordinator_id": "c",
            "aggregate": {"key": "checkpoints/ck-1/aggregate.json", "sha256": "0" * 64, "bytes": 1},
            "components": [],
            "incarnations": incarnations,
        }
        return json.dumps(body).encode()

    parsed = parse_document(GlobalCheckpointRecord, record({"agent/a-0": "a" * 32}), "k")
    assert parsed.incarnations == {"agent/a-0": "a" * 32}
    for bad in ({"agent": "a" * 32}, {"agent/../x": "a" * 32}, {"agent/a-0": "A" * 32}, {"agent/a-0": "a"}):
        with pytest.raises(InvalidRecordError):
            parse_document(GlobalCheckpointRecord, record(bad), "k")


def test_a_restart_within_a_cycle_answered_by_a_retried_prepare_is_refused(dep: Deployment) -> None:
    """Ray's ``max_task_retries`` shape: the prepare is resubmitted to the empty replacement,
    which answers ready; its commit then answers from the new incarnation."""
    populate(dep, dep.coordinator.token_source)

    def restart_mid_cycle(step: str) -> None:
        if step == "commit:resources/res-0":
            dep.resources.restart().prepare("ck-1", time.time() + 30)  # type: ignore[attr-defined]

    dep.coordinator.fault_hook = restart_mid_cycle
    with pytest.raises(ParticipantRestartedError, match="during checkpoint ck-1"):
        dep.coordinator.checkpoint("ck-1")
    assert published_ids(dep.store) == []
    assert dep.agent.is_open() and dep.model.is_open()


def test_recover_aborts_an_open_checkpoint_and_needs_a_checkpoint_of_this_run() -> None:
    store = memory_store("recover")
    dep = Deployment(store, token_source=FakeTokens(store))
    try:
        populate(dep, dep.coordinator.token_source)
        dep.model.prepare("ck-left-open", time.time() + 60)  # a crash left this open
        dep.resources.start_paused()  # a replacement, started paused
        assert not dep.model.accepting and not dep.resources.accepting
        with pytest.raises(CheckpointNotFoundError, match="published no checkpoint"):
            dep.coordinator.recover()
        assert dep.all_open()  # aborted, resumed (the paused one too): dispatch afresh
        assert all(p.refuses(ex("cont", 0)) for p in dep.participants)  # live attempts retired
    finally:
        dep.close()
    other = Deployment(store, token_source=FakeTokens(store))
    try:
        populate(other, other.coordinator.token_source)
        other.coordinator.checkpoint("ck-other")
        mine = Coordinator(
            store, other.participants, LiveExecutionRegistry(), run_id="another-run", takeover=True
        )
        assert mine.latest_of_run() is None and other.coordinator.latest_of_run() == "ck-other"
    finally:
        other.close()


def test_start_paused_parks_admission_until_a_restore_or_an_explicit_resume() -> None:
    paused = ScriptedParticipant("agent", "agent-0", start_paused=True)
    try:
        assert not paused.accepting and paused.status().accepting is False
        with pytest.raises(AdmissionClosedError):
            paused.track(ex("r1"))
        deadline = time.time() + 30
        paused.prepare("ck-1", deadline)  # a checkpoint's resume does not open it
        paused.resume("ck-1", deadline)
        assert not paused.accepting and paused.phase is Phase.IDLE
        paused.resume("open-now", deadline)  # an explicit resume does
        assert paused.accepting
        paused.track(ex("r1"))
    finally:
        paused.close()


# -- over HTTP: real server processes, killed and restarted at the same port ------------------------


def _serve(kind: str, instance: str, port: int, store: Path, *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_control_server.py"), kind, instance, str(port), str(store), *extra],
        env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_listening(port, proc)
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_server_restarted_at_the_same_port_is_refused_then_recovered(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    port = _free_port()
    agent = ScriptedParticipant("agent", "agent-0")
    proc = _serve("resources", "res-0", port, store_dir)
    remote = RemoteParticipant(f"http://127.0.0.1:{port}", token=TOKEN, attempts=3)
    try:
        coordinator = Coordinator(store, [agent, remote], LiveExecutionRegistry(), run_id="test-run")
        coordinator.checkpoint("ck-1")
        old = remote.incarnation
        _kill(proc)
        proc = _serve("resources", "res-0", port, store_dir)  # same URL, empty state
        with pytest.raises(ParticipantRestartedError) as refused:
            coordinator.checkpoint("ck-2")
        assert refused.value.details["expected"] == old
        assert refused.value.details["actual"] == remote.incarnation != old
        assert published_ids(store) == ["ck-1"] and latest_id(store) == "ck-1"
        assert agent.accepting
        # the replacement tracks an attempt of its own (the server's script): recover retires it
        outcome = coordinator.recover([ex("r-remote")])
        assert outcome.source_checkpoint_id == "ck-1"
        assert coordinator.checkpoint("ck-3").checkpoint_id == "ck-3"
        assert latest_id(store) == "ck-3"
    finally:
        remote.close()
        _kill(proc)
        agent.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_prepare_repeated_onto_a_restarted_server_is_refused(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve("resources", "res-0", port, store_dir, "session s1 mid-mutation")  # prepare waits
    remote = RemoteParticipant(url, token=TOKEN, attempts=1000)
    try:
        first = remote.status().incarnation
        failure: list[BaseException] = []

        def prepare() -> None:
            try:
                remote.prepare("ck-1", time.time() + 60)
            except BaseException as exc:
                failure.append(exc)

        waiting = threading.Thread(target=prepare)
        waiting.start()
        status = f"{url}{CHECKPOINT_ROUTE_PREFIX}/status"
        end = time.monotonic() + 30
        while httpx.get(status, headers={"Authorization": f"Bearer {TOKEN}"}).json()["accepting"]:
            assert time.monotonic() < end, "the prepare never reached the server"
            time.sleep(0.02)
        _kill(proc)
        proc = _serve("resources", "res-0", port, store_dir)  # the empty replacement answers ready
        waiting.join(60)
        assert not waiting.is_alive()
        (error,) = failure
        assert isinstance(error, ParticipantRestartedError) and isinstance(error, CheckpointError)
        assert error.details["expected"] == first and error.details["actual"] != first
    finally:
        remote.close()
        _kill(proc)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_restarted_inside_a_worker_group_changes_the_group_incarnation(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    with worker_server(store_dir, 2, token=TOKEN, env={"TMPDIR": str(tmp_path)}) as srv:
        remote = RemoteParticipant(srv.url, token=TOKEN)
        try:
            coordinator = Coordinator(store, [remote], LiveExecutionRegistry(), run_id="test-run")
            coordinator.checkpoint("ck-1")
            before = remote.status().incarnation
            victim = httpx.get(f"{srv.url}/whoami", headers={"Connection": "close"}).json()["pid"]
            os.kill(victim, signal.SIGKILL)  # uvicorn starts a replacement, which registers

            def replaced() -> bool:
                return victim not in processes_mentioning(str(store_dir)) and srv.status().get("workers") == 2

            end = time.monotonic() + 120
            while not replaced():
                assert time.monotonic() < end, "the killed worker was never replaced"
                time.sleep(0.1)
            assert remote.status().incarnation != before
            with pytest.raises(ParticipantRestartedError):
                coordinator.checkpoint("ck-2")
            assert published_ids(store) == ["ck-1"]
            coordinator.recover()
            assert coordinator.checkpoint("ck-3").clean
        finally:
            remote.close()
