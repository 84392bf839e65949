"""``_runtime.gc_paused`` and where the SDK uses it: around a load, and in a checkpoint cycle
from the commit to the end of the pause (never during prepare, which may wait long)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from _protocol_fakes import Deployment, FakeTokens
from rollout_checkpoint._runtime import gc_paused
from rollout_checkpoint.store import LocalStore

# -- the pause itself ------------------------------------------------------------------------------------


def test_gc_paused_nests_and_restores_the_collector(collector_enabled: None) -> None:
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled(collector_enabled: None) -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_gc_paused_restores_after_an_error(collector_enabled: None) -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_concurrent_pauses_end_with_the_last(collector_enabled: None) -> None:
    entered, release = threading.Barrier(2), threading.Event()

    def hold() -> None:
        with gc_paused():
            entered.wait()
            release.wait(10)

    worker = threading.Thread(target=hold)
    worker.start()
    with gc_paused():
        entered.wait()
    assert not gc.isenabled()  # the other thread's pause is still open
    release.set()
    worker.join(10)
    assert gc.isenabled()


def test_gc_collect_still_works_inside_a_pause(collector_enabled: None) -> None:
    class Node:
        other: Any = None

    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle
        del a, b
        assert gc.collect() >= 2


# -- in a checkpoint cycle -------------------------------------------------------------------------


@pytest.fixture()
def dep(local_store: LocalStore) -> Iterator[Deployment]:
    deployment = Deployment(local_store, token_source=FakeTokens(local_store))
    yield deployment
    deployment.close()


def _spy(dep: Deployment, seen: dict[str, list[bool]]) -> None:
    """Record, per control call of the agent, whether the collector was on while it ran."""
    agent = dep.agent
    for name in ("prepare", "commit", "resume"):
        method = getattr(agent, name)

        def spied(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            seen.setdefault(_name, []).append(gc.isenabled())
            return _method(*args, **kwargs)

        setattr(agent, name, spied)


@pytest.mark.parametrize("publication", ["sync", "async"])
def test_a_cycle_pauses_the_collector_from_commit_only(
    dep: Deployment, publication: str, collector_enabled: None
) -> None:
    dep.resumable("r1", tokens=FakeTokens(dep.store))
    seen: dict[str, list[bool]] = {}
    _spy(dep, seen)
    if publication == "sync":
        assert dep.coordinator.checkpoint().clean
    else:
        handle = dep.coordinator.checkpoint_async()
        assert handle.result(60).clean
    assert seen["prepare"] == [True] and seen["commit"] == [False]
    assert gc.isenabled()


def test_a_failed_commit_turns_the_collector_back_on(dep: Deployment, collector_enabled: None) -> None:
    dep.resumable("r1", tokens=FakeTokens(dep.store))

    def broken(*args: Any, **kwargs: Any) -> Any:
        assert not gc.isenabled()
        raise OSError("disk on fire")

    dep.agent.commit = broken  # type: ignore[method-assign]
    with pytest.raises(Exception, match="disk on fire"):
        dep.coordinator.checkpoint()
    assert gc.isenabled()


def test_a_participant_commit_pauses_the_collector_itself(dep: Deployment, collector_enabled: None) -> None:
    """A served participant's commit runs in the server's process, not the coordinator's."""
    dep.resumable("r1", tokens=FakeTokens(dep.store))
    agent = dep.agent
    inside: list[bool] = []
    export_for = agent._export_for

    def spied(scope: Any) -> Any:
        inside.append(gc.isenabled())
        return export_for(scope)

    agent._export_for = spied  # type: ignore[method-assign]
    assert agent.prepare("ck-gc", time.time() + 60).phase.value == "prepared"
    agent.commit("ck-gc", dep.store, time.time() + 60)
    assert inside == [False] and gc.isenabled()


def test_what_a_pause_made_is_aged_without_a_collection(collector_enabled: None) -> None:
    with gc_paused():
        kept = [[i] for i in range(50_000)]
        assert gc.get_count()[0] >= 50_000
    assert gc.get_count() == (0, 0, 0)  # no young collection is due: nothing walks them now
    assert gc.is_tracked(kept[0]) and kept[0] in gc.get_objects(generation=2)


def test_a_process_that_froze_objects_keeps_them_frozen(collector_enabled: None) -> None:
    held = [["frozen by the process"]]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            made = [[i] for i in range(1000)]
        # never unfrozen by the pause (the count only drops by frozen objects other threads free)
        assert gc.get_freeze_count() > frozen // 2
        assert not any(o is held for o in gc.get_objects(generation=2))  # still in the permanent one
        assert gc.is_tracked(made[0])
    finally:
        gc.unfreeze()
