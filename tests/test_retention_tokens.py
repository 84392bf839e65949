"""Retention covers everything the SDK writes: token snapshots go with their checkpoint, token
shards once no retained snapshot lists them (and never one written for the next checkpoint),
sequence claims of deleted checkpoints, and the folders left empty on local disk. A dry run
reports exactly what the real run then does. On local disk and on the moto S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import claimed_sequences, list_published
from rollout_checkpoint.reader import verify_checkpoint
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.store import ObjectStore, open_store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return open_store(str(tmp_path / "ckpts"))
    return request.getfixturevalue("s3_store")  # type: ignore[no-any-return]


def _shards(store: ObjectStore) -> set[str]:
    return {i.key for i in store.list("tokens/shards/")}


def _snapshots(store: ObjectStore) -> set[str]:
    return {i.key.rsplit("/", 1)[-1][: -len(".json")] for i in store.list("tokens/snapshots/")}


def _finish(dep: DemoDeployment, prefix: str) -> None:
    """The framework is done with every rollout under ``prefix``: retire, then forget them."""
    done = [e for e in dep.registry.executions() if e.rollout_id.startswith(prefix)]
    dep.coordinator.retire([e.execution for e in done])
    dep.coordinator.forget([e.rollout_id for e in done])


def test_token_data_is_retained_while_referenced_and_collected_after(store: ObjectStore) -> None:
    dep = DemoDeployment(store)
    dep.populate(10, prefix="a")
    dep.checkpoint("ck-0")
    shards_a = _shards(store)  # group commits: one or more shards per batch of turns
    assert shards_a
    _finish(dep, "a")
    dep.populate(10, prefix="b")
    at_1 = dep.checkpoint("ck-1").record.created_at.timestamp()
    shards_b = _shards(store) - shards_a
    assert shards_b

    # keep 1: ck-0 goes with its token snapshot; shard A is unlisted now, but no snapshot taken
    # after gc first saw it unlisted exists yet, so it waits (min_age 0 alone is not enough)
    dry = collect_garbage(store, keep=1, min_age_s=0, now=lambda: at_1, dry_run=True)
    real = collect_garbage(store, keep=1, min_age_s=0, now=lambda: at_1)
    assert (dry.deleted_objects, dry.unpublished, dry.deleted_token_snapshots) == (
        real.deleted_objects,
        real.unpublished,
        real.deleted_token_snapshots,
    )
    assert real.unpublished == ["ck-0"] and real.deleted_token_snapshots == ["ck-0"]
    assert real.deleted_token_shards == [] and shards_a <= set(real.token_shards_waiting)
    assert _snapshots(store) == {"ck-1"} and _shards(store) == shards_a | shards_b
    assert not store.list(layout.checkpoint_prefix("ck-0") + "/")

    # the next checkpoint's snapshot (taken after gc saw shard A unlisted) does not list it
    at_2 = dep.checkpoint("ck-2").record.created_at.timestamp()
    assert at_2 > at_1
    dep.populate(10, prefix="c")  # shard C: written for the next checkpoint, listed by none yet
    shards_c = _shards(store) - shards_a - shards_b
    assert shards_c
    dry = collect_garbage(store, keep=1, min_age_s=0, now=lambda: at_2, dry_run=True)
    real = collect_garbage(store, keep=1, min_age_s=0, now=lambda: at_2)
    assert dry.deleted_objects == real.deleted_objects and set(dry.deleted_token_shards) == shards_a
    assert set(real.deleted_token_shards) == shards_a and shards_c <= set(real.token_shards_waiting)
    assert _shards(store) == shards_b | shards_c  # B: listed by the kept ck-2; C: in flight
    assert [p.checkpoint_id for p in list_published(store)] == ["ck-2"]
    verify_checkpoint(store, "ck-2")  # every token row the kept checkpoint lists is intact

    # much later, still no new checkpoint: C stays (no snapshot after its first sighting)
    later = at_2 + 100_000
    assert collect_garbage(store, keep=1, min_age_s=0, now=lambda: later).deleted_token_shards == []
    assert shards_c <= _shards(store)
    dep.checkpoint("ck-3")
    verify_checkpoint(store, "ck-3")
    dep.close()

    # sequence claims of deleted checkpoints go too, never the highest
    assert claimed_sequences(store)[-1] == 4
    collect_garbage(store, keep=1, min_age_s=0, now=lambda: later + 1)
    assert claimed_sequences(store) == [4]


def test_gc_leaves_no_empty_folders_on_local_disk(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    dep = DemoDeployment(str(root))
    dep.populate(6)
    for i in range(3):
        dep.checkpoint(f"ck-{i}")
    dep.close()
    report = collect_garbage(str(root), keep=1, min_age_s=0)
    assert sorted(report.unpublished) == ["ck-0", "ck-1"]
    # format 2: archives of ck-0/ck-1 that ck-2 refers into stay (and only those)
    referenced = {p.split("/")[1] for p in report.referenced_prefixes}
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == sorted({"ck-2"} | referenced)
    for cid in referenced:
        kept = {str(p.relative_to(root)) for p in (root / "checkpoints" / cid).rglob("manifest.json")}
        assert kept == {f"{p}/manifest.json" for p in report.referenced_prefixes if p.split("/")[1] == cid}
    verify_checkpoint(str(root), "ck-2")
    empty = [d for d in root.rglob("*") if d.is_dir() and not any(d.iterdir())]
    assert empty == []


def test_dry_run_counts_the_leftovers_the_real_run_deletes(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpts"))
    dep = DemoDeployment(store)
    dep.populate(6)
    dep.checkpoint("ck-0")

    def crash(step: str) -> None:
        if step == "publish":
            raise RuntimeError("crash before the commit point")

    dep.coordinator.fault_hook = crash
    with pytest.raises(RuntimeError):
        dep.checkpoint("ck-left")
    dep.close()
    dry = collect_garbage(store, keep=1, min_age_s=0, dry_run=True)
    real = collect_garbage(store, keep=1, min_age_s=0)
    assert dry.deleted_prefixes == real.deleted_prefixes == ["ck-left"]
    assert dry.deleted_objects == real.deleted_objects > 0
    assert dry.deleted_token_snapshots == real.deleted_token_snapshots == ["ck-left"]
