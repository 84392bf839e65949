"""Retention: keep the last K, unpublish before delete, age leftovers, survive crashes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from _protocol_fakes import Deployment
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import list_published, read_latest
from rollout_checkpoint.reader import verify_checkpoint
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.store import MemoryStore, ObjectStore


class Boom(RuntimeError):
    pass


@pytest.fixture()
def dep() -> Iterator[Deployment]:
    deployment = Deployment(MemoryStore(f"gc-{uuid.uuid4().hex}"))
    deployment.running("r")
    deployment.completed("done")
    yield deployment
    deployment.close()


def _ids(store: ObjectStore) -> list[str]:
    return [p.checkpoint_id for p in list_published(store)]


def _prefixes(store: ObjectStore) -> set[str]:
    return {i.key.split("/")[1] for i in store.list(layout.CHECKPOINTS_PREFIX)}


def _leave_leftover(dep: Deployment, cid: str) -> None:
    def hook(step: str) -> None:
        if step == "publish":
            raise Boom(step)

    dep.coordinator.fault_hook = hook
    with pytest.raises(Boom):
        dep.coordinator.checkpoint(cid)
    dep.coordinator.fault_hook = None


def _verify_all(store: ObjectStore) -> None:
    for cid in _ids(store):
        verify_checkpoint(store, cid)


def test_keeps_the_newest_k(dep: Deployment) -> None:
    made = [dep.coordinator.checkpoint(f"ck-{i}").checkpoint_id for i in range(5)]
    report = collect_garbage(dep.store, keep=2, min_age_s=3600)
    assert sorted(report.unpublished) == made[:3]
    assert _ids(dep.store) == [made[4], made[3]]
    # format 2: only the archives the kept checkpoints refer into stay of the others
    referenced = {p.split("/")[1] for p in report.referenced_prefixes}
    assert referenced <= set(made[:3])
    assert _prefixes(dep.store) == {made[3], made[4]} | referenced
    _verify_all(dep.store)


def test_the_latest_target_is_never_collected(dep: Deployment) -> None:
    first = dep.coordinator.checkpoint("ck-a").checkpoint_id

    def hook(step: str) -> None:
        if step == "latest":
            raise Boom(step)

    dep.coordinator.fault_hook = hook
    for cid in ("ck-b", "ck-c"):
        assert not dep.coordinator.checkpoint(cid).latest_moved
    pointer = read_latest(dep.store)
    assert pointer is not None and pointer[0].checkpoint_id == first
    collect_garbage(dep.store, keep=1, min_age_s=3600)
    assert sorted(_ids(dep.store)) == ["ck-a", "ck-c"]
    _verify_all(dep.store)


def test_leftovers_are_deleted_only_once_old_enough(dep: Deployment) -> None:
    dep.coordinator.checkpoint("ck-good")
    _leave_leftover(dep, "ck-crashed")
    assert "ck-crashed" in _prefixes(dep.store)
    t = [1_000_000.0]
    first = collect_garbage(dep.store, keep=3, min_age_s=600, now=lambda: t[0])
    assert "ck-crashed" in first.leftovers_waiting and "ck-crashed" in _prefixes(dep.store)
    t[0] += 300
    collect_garbage(dep.store, keep=3, min_age_s=600, now=lambda: t[0])
    assert "ck-crashed" in _prefixes(dep.store)
    t[0] += 301
    done = collect_garbage(dep.store, keep=3, min_age_s=600, now=lambda: t[0])
    assert done.deleted_prefixes == ["ck-crashed"]
    assert _prefixes(dep.store) == {"ck-good"}
    _verify_all(dep.store)


def test_a_cycle_in_flight_is_not_collected(dep: Deployment) -> None:
    reports = []

    def hook(step: str) -> None:
        if step == "publish":  # everything is written; only the commit point is left
            reports.append(collect_garbage(dep.store, keep=1, min_age_s=60))

    dep.coordinator.fault_hook = hook
    outcome = dep.coordinator.checkpoint("ck-inflight")
    assert reports[0].deleted_objects == 0 and "ck-inflight" in reports[0].leftovers_waiting
    verify_checkpoint(dep.store, outcome.checkpoint_id)
    # once published, the ledger forgets it on the next run
    assert collect_garbage(dep.store, keep=1, min_age_s=60).leftovers_waiting == {}


def test_dry_run_changes_nothing(dep: Deployment) -> None:
    for i in range(3):
        dep.coordinator.checkpoint(f"ck-{i}")
    before = sorted(i.key for i in dep.store.list(""))
    report = collect_garbage(dep.store, keep=1, min_age_s=0, dry_run=True)
    assert report.unpublished == ["ck-1", "ck-0"] and report.dry_run
    assert sorted(i.key for i in dep.store.list("")) == before


def _gc_steps(dep: Deployment) -> list[str]:
    steps: list[str] = []
    collect_garbage(dep.store, keep=1, min_age_s=0, fault_hook=steps.append, dry_run=False)
    return steps


def test_crash_at_every_gc_step_leaves_published_checkpoints_verifiable() -> None:
    def build() -> Deployment:
        d = Deployment(MemoryStore(f"gc-{uuid.uuid4().hex}"))
        d.running("r")
        for i in range(3):
            d.coordinator.checkpoint(f"ck-{i}")
        _leave_leftover(d, "ck-left")
        return d

    probe = build()
    steps = _gc_steps(probe)
    probe.close()
    assert any(s.startswith("unpublish:") for s in steps) and "ledger" in steps
    for k in range(len(steps)):
        d = build()
        seen: list[str] = []

        def hook(step: str, k: int = k, seen: list[str] = seen) -> None:
            seen.append(step)
            if len(seen) == k + 1:
                raise Boom(step)

        with pytest.raises(Boom):
            collect_garbage(d.store, keep=1, min_age_s=0, fault_hook=hook)
        _verify_all(d.store)
        assert "ck-2" in _ids(d.store)
        collect_garbage(d.store, keep=1, min_age_s=0)
        # format 2: of the others, only the archives ck-2 refers into stay
        assert _ids(d.store) == ["ck-2"] and _prefixes(d.store) == {"ck-2"} | _referenced_by(d.store, "ck-2")
        _verify_all(d.store)
        d.close()


def _referenced_by(store: ObjectStore, cid: str) -> set[str]:
    """Checkpoint ids whose archives the components of ``cid`` refer into (format 2)."""
    from rollout_checkpoint.format import ArchiveReader
    from rollout_checkpoint.reader import load_checkpoint

    return {
        base.split("/")[1]
        for ref in load_checkpoint(store, cid).record.components
        for base in ArchiveReader.open(store, ref.prefix).base_prefixes()
    }
