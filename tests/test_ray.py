"""The Ray integration on a simulated cluster (``ray.cluster_utils.Cluster`` on 127.0.0.1): a
silent restart of an actor never publishes over it and ``recover()`` continues; Ray's retry of a
parked prepare onto the replacement is refused; typed errors arrive typed; a removed node's
host restarts on a spare node; the mixin forwards control to an actor's servers; a worker-group
host leaves no process and a free port when killed; a killed driver's hosts die with it and a
new driver restores into fresh ones. Plus :class:`RayParticipant` over a fake
handle (no cluster) and the package importing without Ray.

One cluster for the module (one xdist group: ``--dist loadgroup``), shut down at the end."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _procs import processes_mentioning
from _ray import local_cluster, require_ray

require_ray()

import ray  # noqa: E402
from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError  # noqa: E402

from rollout_checkpoint import CheckpointError, ParticipantRestartedError  # noqa: E402
from rollout_checkpoint.coordinator import Coordinator  # noqa: E402
from rollout_checkpoint.errors import (  # noqa: E402
    DeadlineTooFarError,
    InvalidArgumentError,
    InvalidIdentifierError,
)
from rollout_checkpoint.ids import ExecutionId  # noqa: E402
from rollout_checkpoint.integrations.ray import (  # noqa: E402
    CheckpointControlMixin,
    HostSpec,
    RayDeployment,
    RayParticipant,
)
from rollout_checkpoint.protocol import CommitReply, Phase, PrepareReport  # noqa: E402
from rollout_checkpoint.registry import LiveExecutionRegistry  # noqa: E402
from rollout_checkpoint.server import ParticipantUnreachableError  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

BUILD = "_ray_build:build"
ENV_RESOURCE = "rc_env_node"
"""A custom resource only the fixture's last node advertises (2 units), as nodes labelled for
environments would."""


def _wait(condition: Any, what: str, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


# -- no cluster -------------------------------------------------------------------------------------


class _Method:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.calls: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> tuple[str, _Method]:
        self.calls.append(args)
        return ("ref", self)


def _get(ref: tuple[str, _Method], timeout: float) -> Any:
    outcome = ref[1].outcome
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _report(incarnation: str) -> PrepareReport:
    return PrepareReport(checkpoint_id="c1", phase=Phase.PREPARED, ready=True, incarnation=incarnation)


def test_ray_participant_over_a_fake_handle_unwraps_typed_errors_and_checks_incarnations() -> None:
    handle = type("Handle", (), {})()
    cancelled: list[Any] = []
    participant = RayParticipant(handle, name="agent-0", get=_get, cancel=cancelled.append)
    first, second = "a" * 32, "b" * 32
    handle.control_prepare = _Method(_report(first))
    assert participant.prepare("c1", time.time() + 5).incarnation == first
    assert handle.control_prepare.calls[-1][2] is None  # nothing known yet: no expectation sent
    handle.control_prepare = _Method(_report(second))
    with pytest.raises(ParticipantRestartedError) as restarted:
        participant.prepare("c1", time.time() + 5)
    assert handle.control_prepare.calls[-1][2] == first  # the actor is told which one is meant
    assert restarted.value.details == {"participant": "agent-0", "expected": first, "actual": second}

    refused = InvalidIdentifierError("checkpoint_id '../x' is not a valid id", field="checkpoint_id")
    handle.control_prepare = _Method(RayTaskError("control_prepare", "traceback", refused))
    with pytest.raises(InvalidIdentifierError) as typed:
        participant.prepare("c2", time.time() + 5)
    assert typed.value.code == "invalid_id" and typed.value.details == {"field": "checkpoint_id"}

    handle.control_prepare = _Method(ActorDiedError())
    with pytest.raises(ParticipantUnreachableError, match="agent-0: prepare got no answer"):
        participant.prepare("c3", time.time() + 5)

    handle.control_prepare = _Method(GetTimeoutError("no answer"))
    with pytest.raises(ParticipantUnreachableError) as late:
        participant.prepare("c4", time.time() + 5)
    assert late.value.code == "participant_unreachable"
    assert cancelled and cancelled[-1][1] is handle.control_prepare  # the task was cancelled


def test_ray_participant_sends_scopes_packed_and_asks_brief_commits_as_http_does() -> None:
    handle = type("Handle", (), {})()
    participant = RayParticipant(
        handle, name="agent-0", get=_get, cancel=lambda ref: None, brief_commits=True
    )
    reply = CommitReply(
        checkpoint_id="c1",
        phase=Phase.COMMITTED,
        kind="agent",
        instance="agent-0",
        manifest_key="k",
        manifest_sha256="0" * 64,
        manifest_bytes=1,
        incarnation="a" * 32,
    )
    handle.control_commit = _Method(reply)
    handle.control_retire = _Method(None)
    scope = [ExecutionId(rollout_id="r-1", attempt=0), ExecutionId(rollout_id="r-2", attempt=3)]
    participant.commit("c1", "file:///s", time.time() + 5, scope)
    # the compact strings of the HTTP routes' scope_ids, never pickled models; brief asked
    assert handle.control_commit.calls[-1][3:] == (["r-1#0", "r-2#3"], None, True)
    participant.retire(scope, time.time() + 5)
    assert handle.control_retire.calls[-1][0] == ["r-1#0", "r-2#3"]
    assert not RayParticipant(handle, get=_get).brief_commits  # as RemoteParticipant: asked for


def test_the_sdk_and_the_ray_package_import_without_ray_and_say_how_to_install_it() -> None:
    script = (
        "import sys\nsys.modules['ray'] = None\nimport rollout_checkpoint\n"
        "import rollout_checkpoint.integrations.ray as r\n"
        "assert not any(m.split('.')[0] == 'ray' for m in sys.modules if sys.modules[m] is not None)\n"
        "try:\n    r.RayDeployment\nexcept r.RayNotInstalledError as exc:\n    print('refused:', exc)\n"
        "else:\n    raise SystemExit('usable without Ray')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: Ray is not installed" in out.stdout and "rollout-checkpoint[ray]" in out.stdout


# -- on a cluster -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """The one cluster of the Ray tests (they all live in this module, on one xdist worker):
    module-scoped, so it is shut down and the environment it set (``HOME``, ``RAY_TMPDIR``, the
    token) restored before that worker runs other tests."""
    with local_cluster(worker_nodes=3, last_node_resources={ENV_RESOURCE: 2}) as running:
        yield running


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "store")


def _coordinator(store: str, deployment: RayDeployment) -> Coordinator:
    return Coordinator(store, deployment.participants(), LiveExecutionRegistry(), accept_unsafe_store=True)


def test_a_silent_restart_is_refused_nothing_published_then_recover_continues(
    cluster: Any, store: str
) -> None:
    spec = HostSpec("agent-0", BUILD, max_restarts=-1)
    with RayDeployment([spec], store=store, accept_unsafe_store=True) as deployment:
        coordinator = _coordinator(store, deployment)
        first = coordinator.checkpoint(deadline_s=30).checkpoint_id
        before = deployment.health()["agent-0"]
        ray.kill(deployment.handles["agent-0"], no_restart=False)  # Ray restarts it, empty
        assert _wait(deployment.check, "the restart") == ["agent-0"]
        assert deployment.restarts["agent-0"] == 1
        after = deployment.health()["agent-0"]
        assert after["reconstructed"] and after["incarnation"] != before["incarnation"]
        status = deployment.participants()[0].status()
        assert not status.accepting  # a reconstructed host starts paused

        with pytest.raises(ParticipantRestartedError) as refused:
            coordinator.checkpoint(deadline_s=30)
        assert refused.value.code == "participant_restarted"
        assert coordinator.latest_of_run() == first  # nothing published over the empty actor

        outcome = coordinator.recover(deadline_s=30)
        assert outcome.source_checkpoint_id == first
        assert deployment.participants()[0].status().accepting  # the resume opened it
        assert coordinator.checkpoint(deadline_s=30).checkpoint_id != first  # publishes again


def test_rays_retry_of_a_parked_prepare_onto_the_replacement_is_refused(cluster: Any, store: str) -> None:
    spec = HostSpec("agent-1", BUILD, settings={"RC_TEST_BLOCKED": "1"}, max_task_retries=-1)
    with RayDeployment([spec], store=store, accept_unsafe_store=True) as deployment:
        participant = deployment.participants()[0]
        participant.status()  # the incarnation the driver knows
        box: dict[str, BaseException | PrepareReport] = {}

        def prepare() -> None:
            try:
                box["answer"] = participant.prepare("ckpt-retry", time.time() + 60)
            except BaseException as exc:
                box["answer"] = exc

        waiting = threading.Thread(target=prepare)
        waiting.start()
        _wait(lambda: participant.status().phase is Phase.PREPARING, "the prepare to park")
        # the concurrency groups: status and renew answer while the prepare holds its thread
        participant.renew("ckpt-retry", time.time() + 60)
        ray.kill(deployment.handles["agent-1"], no_restart=False)
        waiting.join(120)
        answer = box["answer"]
        assert isinstance(answer, ParticipantRestartedError), answer  # not an empty "ready"
        replacement = participant.status()
        assert replacement.phase is Phase.IDLE and replacement.checkpoint_id is None  # never prepared


def test_typed_errors_cross_ray_and_a_dead_actor_is_unreachable(cluster: Any, store: str) -> None:
    spec = HostSpec("agent-2", BUILD, max_restarts=0)
    with RayDeployment([spec], store=store, accept_unsafe_store=True) as deployment:
        participant = deployment.participants()[0]
        with pytest.raises(InvalidIdentifierError) as bad_id:
            participant.prepare("../escape", time.time() + 10)
        assert bad_id.value.code == "invalid_id"
        with pytest.raises(DeadlineTooFarError) as too_far:
            participant.prepare("ckpt-far", time.time() + 10**7)
        assert too_far.value.code == "deadline_too_far"
        handle = deployment.handles["agent-2"]  # a packed scope is checked in the actor, typed
        bad = handle.control_commit.remote("ckpt-x", store, time.time() + 10, ["../up#0"], None, True)
        with pytest.raises(RayTaskError) as bad_scope:
            ray.get(bad, timeout=60)
        assert isinstance(bad_scope.value.cause, InvalidIdentifierError)
        assert asyncio.run(participant.astatus()).incarnation == participant.status().incarnation
        ray.kill(deployment.handles["agent-2"])

        def unreachable() -> ParticipantUnreachableError | None:
            try:  # the kill lands asynchronously: a call sent just after it may still be answered
                participant.status()
            except ParticipantUnreachableError as exc:
                return exc
            return None

        gone = _wait(unreachable, "the killed actor to be unreachable", 60)
        assert gone.code == "participant_unreachable" and isinstance(gone, CheckpointError)


def _available(resource: str) -> float:
    return float(ray.available_resources().get(resource, 0.0))


def test_custom_resources_place_a_host_on_the_labelled_node_with_or_without_a_group(
    cluster: Any, store: str
) -> None:
    labelled = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(ENV_RESOURCE)]
    assert len(labelled) == 1
    alone = HostSpec("env-0", BUILD, resources={ENV_RESOURCE: 1})
    with RayDeployment([alone], store=store, accept_unsafe_store=True) as deployment:
        assert deployment.health()["env-0"]["node_id"] == labelled[0]
        _wait(lambda: _available(ENV_RESOURCE) == 1, "the host to hold one unit")
        # in a placement group, the host's bundle asks for its custom resources too
        grouped = HostSpec("env-1", BUILD, resources={ENV_RESOURCE: 1}, settings={"RC_TEST_INSTANCE": "e1"})
        with RayDeployment([grouped], store=store, placement="PACK", accept_unsafe_store=True) as packed:
            assert packed.health()["env-1"]["node_id"] == labelled[0]
            _wait(lambda: _available(ENV_RESOURCE) == 0, "the group to reserve the other unit")


def test_a_removed_nodes_host_restarts_on_a_spare_node_and_recover_continues(
    cluster: Any, store: str
) -> None:
    specs = [HostSpec(f"spread-{i}", BUILD, settings={"RC_TEST_INSTANCE": f"agent-{i}"}) for i in (0, 1)]
    with RayDeployment(specs, store=store, placement="STRICT_SPREAD", accept_unsafe_store=True) as deployment:
        health = deployment.health()
        assert health["spread-0"]["node_id"] != health["spread-1"]["node_id"]  # one node each
        coordinator = _coordinator(store, deployment)
        first = coordinator.checkpoint(deadline_s=30).checkpoint_id
        victim = health["spread-0"]["node_id"]
        node = next(n for n in cluster.worker_nodes if n.node_id == victim)
        resources = next(n["Resources"] for n in ray.nodes() if n["NodeID"] == victim)
        custom = {ENV_RESOURCE: resources[ENV_RESOURCE]} if ENV_RESOURCE in resources else {}
        cluster.remove_node(node)
        try:
            assert _wait(lambda: deployment.check(timeout_s=180), "the move", 240) == ["spread-0"]
            moved = deployment.health()["spread-0"]
            assert moved["node_id"] not in (victim, health["spread-1"]["node_id"])
            assert deployment.endpoints()["spread-0"] == moved["endpoint"]  # asked again
            with pytest.raises(ParticipantRestartedError):
                coordinator.checkpoint(deadline_s=30)
            assert coordinator.latest_of_run() == first
            coordinator.recover(deadline_s=30)
            assert coordinator.checkpoint(deadline_s=30).checkpoint_id != first
        finally:
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources=custom)  # the spare again


@ray.remote(max_concurrency=4)
class _GymLike(CheckpointControlMixin):
    """An existing actor (NeMo-RL's NemoGym shape) whose servers run elsewhere on its node."""

    def __init__(self, servers: dict[str, str]) -> None:
        self.servers = servers

    def checkpoint_servers(self) -> dict[str, str]:
        return self.servers


def test_a_mixin_without_its_servers_refuses_typed() -> None:
    class _NoServers(CheckpointControlMixin):
        pass

    with pytest.raises(InvalidArgumentError, match=r"_NoServers .* checkpoint_servers\(\)") as caught:
        _NoServers().checkpoint_prepare("ckpt-none", deadline_ts=time.time() + 60)
    assert caught.value.code == "invalid_argument"


def test_the_mixin_forwards_checkpoint_control_to_the_actors_servers(cluster: Any, store: str) -> None:
    node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
    spec = HostSpec("agent-3", BUILD, settings={"RC_TEST_INSTANCE": "agent-3"}, node_id=node)
    with RayDeployment([spec], store=store, accept_unsafe_store=True) as deployment:
        assert deployment.health()["agent-3"]["node_id"] == node  # node affinity placed it
        gym = _GymLike.remote({"agent": deployment.endpoints()["agent-3"]})  # type: ignore[attr-defined]
        try:
            deadline = time.time() + 60
            prepared = ray.get(gym.checkpoint_prepare.remote("ckpt-mixin", deadline_ts=deadline), timeout=120)
            assert prepared["ready"] is True
            assert prepared["servers"]["agent"]["phase"] == "prepared"
            incarnation = deployment.health()["agent-3"]["incarnation"]
            assert prepared["incarnations"] == {"agent": incarnation}
            committed = ray.get(
                gym.checkpoint_commit.remote("ckpt-mixin", f"file://{store}", [], deadline_ts=deadline),
                timeout=120,
            )
            assert committed["servers"]["agent"]["phase"] == "committed"
            resumed = ray.get(gym.checkpoint_resume.remote("ckpt-mixin", deadline_ts=deadline), timeout=120)
            assert resumed["servers"]["agent"]["phase"] == "idle"
            ray.get(gym.checkpoint_prepare.remote("ckpt-held", deadline_ts=deadline), timeout=120)
            with pytest.raises(RayTaskError) as refused:  # a typed refusal is the task error's cause
                ray.get(gym.checkpoint_prepare.remote("ckpt-other", deadline_ts=deadline), timeout=120)
            assert isinstance(refused.value.cause, CheckpointError)
            assert refused.value.cause.code == "checkpoint_conflict"
            ray.get(gym.checkpoint_resume.remote("ckpt-held", deadline_ts=deadline), timeout=120)
        finally:
            ray.kill(gym)


def test_a_worker_group_host_serves_and_leaves_nothing_when_killed(cluster: Any, store: str) -> None:
    spec = HostSpec("group-0", BUILD, workers=2, max_restarts=0, settings={"RC_TEST_INSTANCE": "g"})
    with RayDeployment([spec], store=store, accept_unsafe_store=True) as deployment:
        participant = deployment.participants()[0]
        assert participant.status().workers == 2
        url = deployment.endpoints()["group-0"]
        port = int(url.rsplit(":", 1)[1])
        assert processes_mentioning(store)  # the child group serves the store
        ray.kill(deployment.handles["group-0"], no_restart=True)
        _wait(lambda: not processes_mentioning(store), "the group's processes to exit", 60)
        with socket.socket() as probe:  # the port is free for a replacement
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))


_DRIVER = """
import sys, time
import ray
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.integrations.ray import HostSpec, RayDeployment
from rollout_checkpoint.registry import LiveExecutionRegistry
address, store = sys.argv[1], sys.argv[2]
ray.init(address=address, namespace="driver-kill", log_to_driver=False)
deployment = RayDeployment([HostSpec("owned-0", "_ray_build:build")], store=store, accept_unsafe_store=True)
deployment.start()
coordinator = Coordinator(store, deployment.participants(), LiveExecutionRegistry(),
                          accept_unsafe_store=True, run_id="driver-kill-run")
print(coordinator.checkpoint(deadline_s=60).checkpoint_id, flush=True)
time.sleep(600)
"""


def test_a_killed_drivers_hosts_die_with_it_and_a_new_driver_restores_into_fresh_ones(
    cluster: Any, store: str
) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, cluster.address, store], stdout=subprocess.PIPE, text=True
    )
    try:
        assert driver.stdout is not None
        published = driver.stdout.readline().strip()
        assert published.startswith("ckpt-"), published
        ray.get_actor("rc-host-owned-0", namespace="driver-kill")  # the driver's host is up
    finally:
        driver.kill()  # SIGKILL: the job ends, its owned actors with it
        driver.wait(30)

    def gone() -> bool:
        try:
            ray.get_actor("rc-host-owned-0", namespace="driver-kill")
        except ValueError:
            return True
        return False

    _wait(gone, "the killed driver's host to die with it")
    spec = HostSpec("owned-0", BUILD)
    with RayDeployment([spec], store=store, namespace="driver-kill", accept_unsafe_store=True) as fresh:
        coordinator = Coordinator(
            store,
            fresh.participants(),
            LiveExecutionRegistry(),
            accept_unsafe_store=True,
            run_id="driver-kill-run",
        )
        assert coordinator.recover(deadline_s=60).source_checkpoint_id == published
        assert coordinator.checkpoint(deadline_s=60).checkpoint_id != published
