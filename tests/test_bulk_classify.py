"""The bulk paths of ``load_checkpoint``: the cycle collector paused around a load (the pause
itself: ``test_gc_pause.py``), member indexes prepared ahead on worker threads, and
classification's column-at-a-time steps (newest boundary across components, an unsorted
registry, many distinct dispatch texts)."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from _protocol_fakes import Deployment, FakeTokens
from rollout_checkpoint.errors import CheckpointRejectedError
from rollout_checkpoint.format.commit_log import read_record
from rollout_checkpoint.format.manifests import ComponentRef, ObjectRef
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.reader._classify import ComponentSummary, classify
from rollout_checkpoint.reader._prefetch import IndexPrefetch
from rollout_checkpoint.store import LocalStore

# -- load_checkpoint: the pause and the prefetch, end to end ---------------------------------------


@pytest.fixture()
def dep(local_store: LocalStore) -> Iterator[Deployment]:
    deployment = Deployment(local_store, token_source=FakeTokens(local_store))
    yield deployment
    deployment.close()


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rc-index")]


def test_a_load_restores_the_collector_either_way(dep: Deployment, collector_enabled: None) -> None:
    dep.resumable("r1", tokens=FakeTokens(dep.store))
    cid = dep.coordinator.checkpoint().checkpoint_id
    assert load_checkpoint(dep.store, cid).rollouts["r1"].disposition == "continue"
    assert gc.isenabled()
    gc.disable()
    load_checkpoint(dep.store, cid)
    assert not gc.isenabled()  # a caller's own choice is kept


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_index_rejects_as_before_and_no_prefetch_thread_remains(
    dep: Deployment, damage: str, collector_enabled: None
) -> None:
    tokens = FakeTokens(dep.store)
    for i in range(5):
        dep.resumable(f"r{i}", tokens=tokens)
    cid = dep.coordinator.checkpoint().checkpoint_id
    record, _ = read_record(dep.store, cid)
    last = [c for c in record.components if c.role == "participant"][-1]  # prepared on a worker
    index_key = next(i.key for i in dep.store.list(last.prefix + "/index-"))
    if damage == "truncated":
        dep.store.put(index_key, dep.store.get(index_key)[:-100])
    else:
        dep.store.delete(index_key)
    with pytest.raises(CheckpointRejectedError) as info:
        load_checkpoint(dep.store, cid, verify=False)
    reason = info.value.details["reason"]
    assert "member index" in reason and last.instance in reason
    assert not _prefetch_threads()
    assert gc.isenabled()


# -- IndexPrefetch ---------------------------------------------------------------------------------


class _Reader:
    """What classification asks of an archive reader: ``prepare_member_columns`` (on any thread)
    and ``member_columns``."""

    def __init__(self, columns: Mapping[str, Mapping[str, Sequence[Any]]], fail: bool = False) -> None:
        self.columns = columns
        self.fail = fail
        self.prepared_on: list[str] = []

    def prepare_member_columns(self) -> None:
        self.prepared_on.append(threading.current_thread().name)
        if self.fail:
            raise OSError("unreachable")

    def member_columns(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, dict[str, list[Any]]]:
        return {
            kind: {name: list(cols[name]) for name in wanted.get(kind, ("refs",))}
            for kind, cols in self.columns.items()
        }


def test_prefetch_prepares_ahead_on_worker_threads_within_its_window() -> None:
    readers = [_Reader({}) for _ in range(7)]
    with IndexPrefetch(readers, window=2) as ahead:  # type: ignore[arg-type]
        ahead.ready(0)
        # reader 0 and 1 were submitted at the start; reader 2 once 0 was taken
        assert [bool(r.prepared_on) for r in readers[3:]] == [False] * 4
        for i in range(1, 7):
            ahead.ready(i)
    assert all(r.prepared_on and r.prepared_on[0].startswith("rc-index") for r in readers)
    assert all(len(r.prepared_on) == 1 for r in readers)
    assert not _prefetch_threads()


def test_a_failed_preparation_is_left_to_the_callers_own_read() -> None:
    readers = [_Reader({}), _Reader({}, fail=True), _Reader({})]
    with IndexPrefetch(readers) as ahead:  # type: ignore[arg-type]
        for i in range(3):
            ahead.ready(i)  # does not raise: the caller's member_columns repeats the step
    assert readers[1].prepared_on


def test_one_reader_needs_no_thread() -> None:
    reader = _Reader({})
    with IndexPrefetch([reader]) as ahead:  # type: ignore[list-item]
        ahead.ready(0)
    assert reader.prepared_on == []


# -- classify over columns -------------------------------------------------------------------------

_SHA = "0" * 64


def _summary(kind: str, instance: str, role: str = "participant") -> ComponentSummary:
    prefix = f"checkpoints/c/components/{kind}/{instance}"
    ref = ComponentRef(
        kind=kind,
        instance=instance,
        role=role,  # type: ignore[arg-type]
        prefix=prefix,
        manifest=ObjectRef(key=f"{prefix}/manifest.json", sha256=_SHA, bytes=1),
    )
    return ComponentSummary(ref, {}, {})


def _dispatch(rows: Sequence[tuple[str, int, str]]) -> dict[str, dict[str, list[Any]]]:
    return {
        "dispatch": {
            "rollout_id": [r for r, _, _ in rows],
            "attempt": [a for _, a, _ in rows],
            "refs": [json.dumps({"state": s, "restart_only": False}) for _, _, s in rows],
        }
    }


def _boundaries(
    rows: Sequence[tuple[str, int, int | None, dict[str, Any]]],
) -> dict[str, dict[str, list[Any]]]:
    return {
        "agent_boundary": {
            "rollout_id": [r for r, _, _, _ in rows],
            "attempt": [a for _, a, _, _ in rows],
            "revision": [v for _, _, v, _ in rows],
            "refs": [json.dumps(refs) for _, _, _, refs in rows],
        }
    }


def _classify(registry: _Reader, agents: Sequence[_Reader]) -> dict[str, tuple[str, str]]:
    readers: dict[tuple[str, str], Any] = {("framework", "registry"): registry}
    summaries = [_summary("framework", "registry", "framework")]
    for i, agent in enumerate(agents):
        readers[("agent", f"agent-{i}")] = agent
        summaries.append(_summary("agent", f"agent-{i}"))
    plans = classify("c", readers, summaries, None)
    return {rid: (p.disposition, p.reason) for rid, p in plans.items()}


_GOOD: dict[str, Any] = {"model_call": None, "resources": {}}
_BAD: dict[str, Any] = {"model_call": "c-9", "resources": {}}  # names a call no lineage holds


@pytest.mark.parametrize("newest_first", [False, True])
def test_the_newest_boundary_wins_across_components(newest_first: bool) -> None:
    old = _Reader(_boundaries([("r1", 0, 1, _GOOD), ("r2", 0, None, _GOOD)]))
    new = _Reader(_boundaries([("r1", 0, 2, _BAD), ("r2", 0, 0, _BAD)]))
    registry = _Reader(_dispatch([("r1", 0, "running"), ("r2", 0, "running")]))
    got = _classify(registry, [new, old] if newest_first else [old, new])
    # revision 2 beats 1; a missing revision counts as -1, so revision 0 beats it
    assert got["r1"][0] == got["r2"][0] == "fresh_dispatch"
    assert "model call 'c-9' missing" in got["r1"][1]


def test_a_repeated_boundary_within_one_component_keeps_the_newest() -> None:
    agent = _Reader(_boundaries([("r1", 0, 3, _GOOD), ("r1", 0, 1, _BAD)]))
    registry = _Reader(_dispatch([("r1", 0, "running")]))
    assert _classify(registry, [agent])["r1"][0] == "continue"


def test_an_unsorted_registry_is_classified_in_rollout_id_order() -> None:
    registry = _Reader(_dispatch([("r-c", 0, "running"), ("r-a", 1, "queued"), ("r-b", 0, "running")]))
    agent = _Reader(_boundaries([("r-b", 0, 1, _GOOD), ("r-c", 0, 1, _BAD)]))
    readers: dict[tuple[str, str], Any] = {("framework", "registry"): registry, ("agent", "agent-0"): agent}
    plans = classify(
        "c", readers, [_summary("framework", "registry", "framework"), _summary("agent", "agent-0")], None
    )
    assert list(plans) == ["r-a", "r-b", "r-c"]
    assert [(p.attempt, p.disposition, p.state) for p in plans.values()] == [
        (1, "fresh_dispatch", "queued"),
        (0, "continue", "running"),
        (0, "fresh_dispatch", "running"),
    ]


def test_many_distinct_dispatch_texts_are_each_parsed() -> None:
    rows = [(f"r{i:05d}", 0, "queued" if i % 3 == 0 else "running") for i in range(5000)]
    registry = _Reader(_dispatch(rows))
    distinct = registry.columns["dispatch"]
    # every text distinct (more than the parse-once table holds): the per-row path
    distinct["refs"] = [t[:-1] + f', "n": {i}}}' for i, t in enumerate(distinct["refs"])]  # type: ignore[index]
    agent = _Reader(_boundaries([(r, 0, 1, _GOOD) for r, _, _ in rows]))
    got = _classify(registry, [agent])
    assert len(got) == 5000
    assert all(got[r][0] == ("fresh_dispatch" if s == "queued" else "continue") for r, _, s in rows)
