"""Servers with several uvicorn worker processes: one merged participant, session routing,
re-homing after a restore, and a worker killed during prepare. Real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _procs import WorkerServer, worker_server
from _protocol_fakes import ScriptedParticipant, ex
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.layout import component_prefix
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import (
    VIA_HEADER,
    ParticipantUnreachableError,
    RemoteParticipant,
    WorkerGroup,
    assign_owners,
    checkpoint_router,
    serve_thread,
)
from rollout_checkpoint.store import LocalStore

TOKEN = "tok-workers-secret"
HERE = Path(__file__).parent
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.contextmanager
def server(store: Path, workers: int = 2) -> Iterator[WorkerServer]:
    with worker_server(store, workers, token=TOKEN) as s:
        yield s


def _boundary(rollout_id: str, revision: int) -> AgentBoundaryRecord:
    return AgentBoundaryRecord(
        rollout_id=rollout_id,
        attempt=0,
        boundary_index=1,
        turn_index=1,
        resource_revisions={"counter-0": {"s": revision}},
    )


def _client(url: str) -> httpx.Client:
    # no keep-alive: every request is a new connection that any worker may accept
    return httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def _until_in_flight(remote: RemoteParticipant, limit: float = 60.0) -> None:
    """Until a prepare finds a mutation in flight (not ready); each probe is resumed again. A
    probe that comes before the mutation only parks it until that resume."""
    end = time.monotonic() + limit
    probe = 0
    while True:
        probe += 1
        report = remote.prepare(f"probe-{probe}", time.time() + 0.5)
        remote.resume(f"probe-{probe}", time.time() + 30)
        if not report.ready:
            return
        assert time.monotonic() < end, "the slow step never started"
        time.sleep(0.05)


def test_assign_owners_keeps_owners_together_and_spreads_them() -> None:
    owners = {
        "old-a": [ex(f"a{i}") for i in range(5)],
        "old-b": [ex(f"b{i}") for i in range(3)],
        "old-c": [ex(f"c{i}") for i in range(2)],
        "old-d": [ex("d0")],
    }
    placed = assign_owners(owners, ["w1", "w2"])
    assert placed == {"old-a": "w1", "old-b": "w2", "old-c": "w2", "old-d": "w1"}
    assert assign_owners(owners, ["w9"]) == dict.fromkeys(owners, "w9")
    # an owner that is still a live worker keeps its executions (its clients' cookies stay right)
    owners["w2"] = [ex("e0")]
    placed = assign_owners(owners, ["w1", "w2"])
    assert placed["w2"] == "w2" and placed["old-a"] == "w1"


def test_a_missing_worker_fails_prepare_and_a_dead_one_leaves_the_roster(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    group = WorkerGroup(store, expected_workers=2, token=TOKEN)
    first = ScriptedParticipant("resources", "res-0")
    second = ScriptedParticipant("resources", "res-0")
    first.track(ex("r1"))
    second.track(ex("r2"))
    from fastapi import FastAPI

    def app(p: ScriptedParticipant) -> FastAPI:
        a = FastAPI()
        a.include_router(checkpoint_router(p, token=TOKEN))
        return a

    with serve_thread(app(first), uds=str(tmp_path / "w1.sock")):
        group.register("w1", str(tmp_path / "w1.sock"), os.getpid(), first.capabilities())
        report = group.prepare("ck-1", time.time() + 10)
        assert not report.ready and report.blockers[0] == "1 of 2 workers missing (gone: none registered yet)"
        group.resume("ck-1", time.time() + 10)
        with serve_thread(app(second), uds=str(tmp_path / "w2.sock")) as second_server:
            group.register("w2", str(tmp_path / "w2.sock"), os.getpid(), second.capabilities())
            report = group.prepare("ck-2", time.time() + 10)
            assert report.ready and report.counts["workers"] == 2 and report.counts["live"] == 2
            reply = group.commit("ck-2", store, time.time() + 10)
            assert [e.rollout_id for e in reply.executions] == ["r1", "r2"]
            reader = ArchiveReader.open(store, component_prefix("ck-2", "resources", "res-0"))
            assert reader.manifest.extra["session_owners"] == {"w1": [["r1", 0]], "w2": [["r2", 0]]}
            assert reader.manifest.extra["capabilities"]["topology"] == "coordinated_workers"  # type: ignore[index]
            # each worker wrote its records once, as a part; the component stores nothing and
            # refers to every member of both parts
            prefix = component_prefix("ck-2", "resources", "res-0")
            assert reader.manifest.shards == [] and reader.manifest.record_counts == {}
            parts = [f"{prefix}/parts/w1", f"{prefix}/parts/w2"]
            assert [b.prefix for b in reader.manifest.bases or []] == parts
            reader.verify()  # (these workers track executions without records)
            group.resume("ck-2", time.time() + 10)
            assert store.list("_workers/") == []  # nothing staged anywhere else
            second_server.should_exit = True
        with pytest.raises(ParticipantUnreachableError, match="resources/res-0 at http://w2"):
            group.prepare("ck-3", time.time() + 10)
        assert [w.worker_id for w in group.workers()] == ["w1"]
        group.resume("ck-3", time.time() + 10)
        assert first.accepting
    group.close()
    first.close()
    second.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sixteen_sessions_across_two_workers_checkpoint_crash_and_all_continue(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    rollouts = [f"r{i:02d}" for i in range(16)]
    registry = LiveExecutionRegistry()
    for rollout_id in rollouts:
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
    clients = {r: _client("http://placeholder") for r in rollouts}
    owners: dict[str, str] = {}
    forwarded = 0
    with server(store_dir) as first:
        for rollout_id, client in clients.items():
            client.base_url = httpx.URL(first.url)
            owners[rollout_id] = client.post(
                f"/ng-rollout/{rollout_id}/sessions", json={"attempt": 0}
            ).json()["worker"]

        def work(rollout_id: str) -> None:
            nonlocal forwarded
            for _ in range(3):
                response = clients[rollout_id].post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0})
                assert response.status_code == 200, response.text
                assert response.json()["worker"] == owners[rollout_id]  # always the owner
                forwarded += VIA_HEADER in response.headers

        threads = [threading.Thread(target=work, args=(r,)) for r in rollouts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(set(owners.values())) == sorted(set(owners.values()))
        assert len(set(owners.values())) == 2  # sessions spread over both workers
        assert sum(1 for w in owners.values() if w == min(owners.values())) == 8
        assert forwarded > 0  # some requests reached a non-owner and were forwarded
        agent = ScriptedParticipant("agent", "agent-0")  # boundaries naming each session's revision
        for rollout_id in rollouts:
            agent.add(_boundary(rollout_id, revision=3))
        remote = RemoteParticipant(first.url, token=TOKEN)
        assert remote.capabilities().topology == "coordinated_workers"
        coordinator = Coordinator(store, [agent, remote], registry, run_id="test-run")
        outcome = coordinator.checkpoint("ck-w", deadline_s=60)
        assert outcome.clean
        remote.close()
        agent.close()
        manifest = ArchiveReader.open(store, component_prefix("ck-w", "resources", "counter-0")).manifest
        assert sorted(manifest.extra["session_owners"]) == sorted(set(owners.values()))  # type: ignore[arg-type]
        assert manifest.record_counts == {}  # stored once, in the workers' parts; referred to here
        assert manifest.references is not None and manifest.references.counts == {"resource_snapshot": 16}
    # the crash: every process of the server is gone; a new server has new workers
    with server(store_dir) as second:
        remote = RemoteParticipant(second.url, token=TOKEN)
        agent = ScriptedParticipant("agent", "agent-0")
        coordinator = Coordinator(store, [agent, remote], LiveExecutionRegistry(), run_id="test-run")
        restored = coordinator.restore("ck-w", restore_id="rs-w")
        assert sorted(e.rollout_id for e in restored.restored["resources/counter-0"]) == rollouts
        coordinator.resume("rs-w")
        new_owners = {}
        for rollout_id, client in clients.items():
            client.base_url = httpx.URL(second.url)
            # the client still carries its pre-crash owner cookie: routed to the new holder
            response = client.post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 1})
            assert response.status_code == 200, response.text
            assert response.json()["n"] == 4  # 3 before the checkpoint, continued
            new_owners[rollout_id] = response.json()["worker"]
            stale = client.post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0})
            assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
        # sessions of one pre-crash owner stay together; the two owners land on two workers
        for old in set(owners.values()):
            assert len({new_owners[r] for r in rollouts if owners[r] == old}) == 1
        assert len(set(new_owners.values())) == 2
        remote.close()
        agent.close()
    for client in clients.values():
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_during_prepare_fails_that_prepare_and_is_survived(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = LocalStore(store_dir)
    registry = LiveExecutionRegistry()
    with server(store_dir) as srv, _client(srv.url) as client:
        for rollout_id in ("a", "b"):
            registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
            client.post(f"/ng-rollout/{rollout_id}/sessions", json={"attempt": 0})
        victim = client.get("/ng-rollout/a/state", params={"attempt": 0}).json()

        # a slow step on the victim's session: an accepted mutation blocks prepare there
        def hold() -> None:
            with contextlib.suppress(httpx.TransportError):  # its worker is killed under it
                client.post("/ng-rollout/a/inc", json={"attempt": 0, "hold_s": 60.0})

        slow = threading.Thread(target=hold, daemon=True)
        slow.start()
        remote = RemoteParticipant(srv.url, token=TOKEN)
        _until_in_flight(remote)  # the step is accepted before the checkpoint starts
        coordinator = Coordinator(store, [remote], registry, run_id="test-run")
        failure: list[BaseException] = []

        def checkpoint() -> None:
            try:
                coordinator.checkpoint("ck-1", deadline_s=60)
            except BaseException as exc:
                failure.append(exc)

        cycle = threading.Thread(target=checkpoint)
        cycle.start()
        end = time.monotonic() + 60
        while srv.status().get("accepting", True):  # prepare reached the workers
            assert time.monotonic() < end and cycle.is_alive(), ("prepare never reached the workers", failure)
            time.sleep(0.05)
        os.kill(victim["pid"], signal.SIGKILL)
        cycle.join(120)
        (error,) = failure
        # the group named the dead worker: its prepare call broke, or (when the coordinator's own
        # request died with it and was repeated) it was already gone from the roster
        assert f"at http://{victim['worker']}" in str(error) or f"gone: {victim['worker']}" in str(error)
        assert list_published(store) == []
        srv.wait_workers(2)  # uvicorn replaced the worker; the dead one left the roster
        lost = client.get("/ng-rollout/a/state", params={"attempt": 0})
        assert lost.status_code in (409, 410)  # its session state died with it
        outcome = coordinator.checkpoint("ck-2", deadline_s=60)
        assert outcome.clean
        reader = ArchiveReader.open(store, component_prefix("ck-2", "resources", "counter-0"))
        assert victim["worker"] not in reader.manifest.extra["session_owners"]  # type: ignore[operator]
        remote.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_park_and_release_without_a_crash_then_retire_stops_everywhere(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    with server(store_dir) as srv:
        clients = {r: _client(srv.url) for r in ("p0", "p1", "p2", "p3")}
        owners = {
            r: c.post(f"/ng-rollout/{r}/sessions", json={"attempt": 0}).json()["worker"]
            for r, c in clients.items()
        }
        assert len(set(owners.values())) == 2
        remote = RemoteParticipant(srv.url, token=TOKEN)
        assert remote.prepare("ck-park", time.time() + 60).ready
        results: dict[str, int] = {}

        def step(rollout_id: str) -> None:
            results[rollout_id] = (
                clients[rollout_id].post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0}).json()["n"]
            )

        parked = [threading.Thread(target=step, args=(r,)) for r in clients]
        for thread in parked:
            thread.start()
        time.sleep(0.5)  # not a timed assertion: only gives the requests a chance to (wrongly) pass
        assert results == {}  # parked on both workers while the checkpoint holds admission
        assert remote.status().phase == "prepared"
        remote.resume("ck-park", time.time() + 60)
        for thread in parked:
            thread.join(30)
        assert results == dict.fromkeys(clients, 1)  # released, applied exactly once
        # retire p0 and p1 (on every worker): their sessions go, later requests are refused
        remote.retire([ex("p0"), ex("p1")], time.time() + 60)
        status = remote.status()
        assert status.live == 2 and status.workers == 2
        for rollout_id in ("p0", "p1"):
            refused = clients[rollout_id].post(f"/ng-rollout/{rollout_id}/inc", json={"attempt": 0})
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "stale_attempt"
        assert remote.status().tombstones == 2
        remote.forget(["p0", "p1"])
        assert remote.status().tombstones == 0
        remote.close()
        for client in clients.values():
            client.close()


def test_worker_group_commits_and_restores_on_every_store(
    any_store: Any, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging, merge and restore through the store URL (workers open it themselves)."""
    from fastapi import FastAPI

    from rollout_checkpoint.format.records import ResourceSnapshotRecord

    if any_store.url.startswith("s3://"):
        monkeypatch.setenv("AWS_ENDPOINT_URL", request.getfixturevalue("s3_endpoint"))

    def app(p: ScriptedParticipant) -> FastAPI:
        a = FastAPI()
        a.include_router(checkpoint_router(p, token=TOKEN))
        return a

    def snapshot(rollout_id: str) -> ResourceSnapshotRecord:
        return ResourceSnapshotRecord(
            rollout_id=rollout_id, attempt=0, session_id="s", revision=2, codec="json", state=b"{}"
        )

    with contextlib.ExitStack() as stack:
        group = WorkerGroup(any_store, expected_workers=2, token=TOKEN)
        workers = [ScriptedParticipant("resources", "res-0") for _ in range(2)]
        for i, worker in enumerate(workers):
            worker.add(*(snapshot(f"w{i}-r{j}") for j in range(3)))
            sock = str(tmp_path / f"a{i}.sock")
            stack.enter_context(serve_thread(app(worker), uds=sock))
            group.register(f"old{i}", sock, os.getpid(), worker.capabilities())
        assert group.prepare("ck-s", time.time() + 30).ready
        reply = group.commit("ck-s", any_store, time.time() + 30)
        assert len(reply.executions) == 6
        group.resume("ck-s", time.time() + 30)
        reader = ArchiveReader.open(any_store, component_prefix("ck-s", "resources", "res-0"))
        reader.verify()
        assert [m.kind for m in reader.members()] == ["resource_snapshot"] * 6
        # restore into a new group of two fresh workers (the old owners are gone)
        fresh = [ScriptedParticipant("resources", "res-0") for _ in range(2)]
        second = WorkerGroup(any_store, expected_workers=2, token=TOKEN)
        for i, worker in enumerate(fresh):
            sock = str(tmp_path / f"b{i}.sock")
            stack.enter_context(serve_thread(app(worker), uds=sock))
            second.register(f"new{i}", sock, os.getpid(), worker.capabilities())
        scope = [ex(f"w{i}-r{j}") for i in range(2) for j in range(3)]
        restored = second.restore("rs-s", "ck-s", any_store, time.time() + 30, scope)
        assert sorted(e.rollout_id for e in restored.restored) == sorted(e.rollout_id for e in scope)
        held = [sorted(w.installed, key=lambda e: e.rollout_id) for w in fresh]
        assert sorted(len(h) for h in held) == [3, 3]  # each old owner's sessions went to one worker
        assert all(len({e.rollout_id.split("-")[0] for e in h}) == 1 for h in held)
        for worker in fresh:  # every worker refuses attempt 0 of all six, restored here or not
            assert all(worker.refuses(e) for e in scope)
        holder = next(f"new{i}" for i, h in enumerate(held) if any(e.rollout_id == "w1-r2" for e in h))
        placed = second.place_rollout("w1-r2")
        assert placed is not None and placed.worker_id == holder  # routed to where its state is
        alias = second.resolve_owner("old1")
        assert alias is not None and alias.worker_id == holder  # old cookies find it too
        group.close()
        second.close()


class _Versioned(ScriptedParticipant):
    """A worker whose manifest ``extra`` names its policy version: workers that disagree make
    the group's merge fail (``IntegrityError``), a real merge failure."""

    def __init__(self) -> None:
        super().__init__("resources", "res-0")
        self.version = "v1"

    def _manifest_extra(self) -> dict[str, Any]:
        return {"policy_version": self.version}


def _part_keys(store: LocalStore, checkpoint_id: str) -> list[str]:
    prefix = component_prefix(checkpoint_id, "resources", "res-0")
    return [info.key for info in store.list(f"{prefix}/parts/")]


@pytest.mark.parametrize("fault", ["merge", "worker_commit"])
def test_a_failed_group_commit_publishes_nothing_and_the_next_checkpoint_publishes(
    tmp_path: Path, fault: str
) -> None:
    """A failed attempt writes no component manifest (its parts are an unpublished checkpoint's
    leftovers, which retention collects); the next checkpoint refers to its workers' parts and
    verifies and restores."""
    from fastapi import FastAPI

    from rollout_checkpoint.errors import IntegrityError, InvalidPhaseError
    from rollout_checkpoint.format.records import ResourceSnapshotRecord
    from rollout_checkpoint.retention import collect_garbage

    store = LocalStore(tmp_path / "store")
    with contextlib.ExitStack() as stack:
        group = WorkerGroup(store, expected_workers=2, token=TOKEN)
        workers = [_Versioned() for _ in range(2)]
        for i, worker in enumerate(workers):
            for j in range(3):
                record = ResourceSnapshotRecord(
                    rollout_id=f"w{i}-r{j}", attempt=0, session_id="s", revision=1, codec="json", state=b"{}"
                )
                worker.add(record)
            app = FastAPI()
            app.include_router(checkpoint_router(worker, token=TOKEN))
            stack.enter_context(serve_thread(app, uds=str(tmp_path / f"f{i}.sock")))
            group.register(f"old{i}", str(tmp_path / f"f{i}.sock"), os.getpid(), worker.capabilities())
        assert group.prepare("ck-bad", time.time() + 30).ready
        if fault == "merge":
            workers[1].version = "v2"  # both write their part; the group refuses to mix them
            expected: type[Exception] = IntegrityError
        else:
            workers[1].set_blockers(["mid-turn"])  # its commit fails; the other one wrote its part
            expected = InvalidPhaseError
        with pytest.raises(expected):
            group.commit("ck-bad", store, time.time() + 30)
        assert _part_keys(store, "ck-bad")  # the parts written stay (a repeat finds them)
        assert not store.exists(component_prefix("ck-bad", "resources", "res-0") + "/manifest.json")
        group.resume("ck-bad", time.time() + 30)  # the coordinator's abort
        workers[1].version = "v1"
        workers[1].set_blockers([])
        assert group.prepare("ck-good", time.time() + 30).ready
        reply = group.commit("ck-good", store, time.time() + 30)
        assert len(reply.executions) == 6
        group.resume("ck-good", time.time() + 30)
        reader = ArchiveReader.open(store, component_prefix("ck-good", "resources", "res-0"))
        reader.verify()
        assert [m.kind for m in reader.members()] == ["resource_snapshot"] * 6
        assert reader.manifest.extra["policy_version"] == "v1"
        assert len(_part_keys(store, "ck-good")) == 2 * 3  # two parts: manifest, index, shard each
        # the failed attempt's parts are leftovers of a checkpoint never published: gc takes them
        report = collect_garbage(store, keep=1, min_age_s=0)
        assert "ck-bad" in report.deleted_prefixes and _part_keys(store, "ck-bad") == []
        group.close()


def test_a_forwarded_request_never_carries_another_clients_cookies(tmp_path: Path) -> None:
    """The worker that forwards a request to its rollout's worker must not replay a cookie that
    an earlier forwarded response set for another client (an app's session cookie would then
    join two rollouts' sessions)."""
    forwarded = 0
    i = 0
    deadline = time.monotonic() + 60
    with server(tmp_path / "store") as s:
        # at least 16 fresh clients, then more until one was forwarded (which worker accepts a
        # fresh connection is the kernel's choice: an idle host may give one worker many in a row)
        while i < 16 or (forwarded == 0 and i < 400 and time.monotonic() < deadline):
            with httpx.Client(base_url=s.url, timeout=30) as client:
                response = client.post(f"/ng-rollout/r{i}/cookie")
            assert response.status_code == 200
            assert response.cookies.get("app_session") == f"r{i}"
            assert "app_session" not in response.json()["cookies"], response.json()
            forwarded += VIA_HEADER in response.headers
            i += 1
    assert forwarded > 0, f"no request of {i} fresh clients was forwarded to its rollout's worker"
