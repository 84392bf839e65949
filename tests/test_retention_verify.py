"""gc then verify agree: after any collection (finished or killed at any step) of a store nobody
damaged, ``verify`` passes.

Retention keeps one hop of bases (what a retained archive refers into); such a kept base may
itself refer to archives that are gone. ``verify`` checks an unpublished archive for what it
stores (a published checkpoint reads nothing else of it), so the two agree
(``docs/format.md``, "What retention keeps and what verify checks").
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _reference_world import RealWorld
from rollout_checkpoint.archive import RawArchiveReader, find_component_prefixes
from rollout_checkpoint.cli import app
from rollout_checkpoint.cli._archive import verify_component_archives, verify_store
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import ObjectNotFoundError
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.retention import collect_garbage
from rollout_checkpoint.store import DelegatingStore, LocalStore, MemoryStore, ObjectStore

runner = CliRunner()


class Boom(RuntimeError):
    pass


def _runs(store: ObjectStore, runs: int = 2, checkpoints: int = 5, *, leftover: bool = False) -> list[str]:
    """``runs`` runs one after another (each a new run id taking the store over), each with the
    agent, the policy model, a resources server and the framework registry, three rollouts
    taking turns one at a time: every checkpoint refers into several earlier ones, and those
    into earlier ones still; with ``leftover``, the last run's last cycle crashes at its commit
    point. Returns the published checkpoint ids, oldest first."""
    made: list[str] = []
    for run in range(runs):
        world = RealWorld(store)
        world.coordinator = Coordinator(
            store, world.participants, world.registry, world.tokens, run_id=f"run-{run}", takeover=True
        )
        executions = [world.start(f"run{run}-r{i}") for i in range(3)]
        for i, execution in enumerate(executions):  # every rollout at a boundary
            world.turn(execution, f"call-{i}-0", 0)
        turns = [0, 0, 0]
        for c in range(checkpoints):
            i = c % 3
            turns[i] += 1
            world.turn(executions[i], f"call-{i}-{turns[i]}", turns[i])
            made.append(world.coordinator.checkpoint(f"ck-{run}-{c}").checkpoint_id)
        if leftover and run == runs - 1:  # a cycle that crashed at its commit point
            world.turn(executions[0], "call-left", turns[0] + 1)
            world.coordinator.fault_hook = _boom_at("publish")
            with pytest.raises(Boom):
                world.coordinator.checkpoint("ck-left")
        world.close()
    return made


def _boom_at(name: str) -> Callable[[str], None]:
    def hook(step: str) -> None:
        if step == name:
            raise Boom(step)

    return hook


def _dangling_bases(store: ObjectStore) -> list[str]:
    """Bases named by archives of unpublished checkpoints whose manifests are gone: what the
    rule lets go (and what a verify that followed every base would have reported)."""
    published = {p.checkpoint_id for p in list_published(store)}
    out = []
    for prefix in find_component_prefixes(store, layout.CHECKPOINTS_PREFIX):
        if prefix.split("/")[1] in published:
            continue
        for base in RawArchiveReader.open(store, prefix).manifest.bases or []:
            try:
                store.stat(base.manifest.key)
            except ObjectNotFoundError:
                out.append(base.manifest.key)
    return out


def _all_ok(store: ObjectStore) -> None:
    """``verify``'s every finding is ok (every published checkpoint verified end to end too)."""
    findings = verify_store(store)
    assert findings and all(f.ok for f in findings), [f for f in findings if not f.ok]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_gc_keep_2_then_keep_1_and_verify_passes_after_each(
    where: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if where == "s3":
        store: ObjectStore = request.getfixturevalue("s3_store")
        url = request.getfixturevalue("s3_url")
        extra = ["--endpoint-url", request.getfixturevalue("s3_endpoint")]
    else:
        store, url, extra = LocalStore(tmp_path / "s"), str(tmp_path / "s"), []
    built = MemoryStore(f"gcv-{uuid.uuid4().hex}")
    made = _runs(built, runs=2, checkpoints=4)
    _copy(built, store)  # the runs' objects as they wrote them (written in memory: faster)
    for keep in (2, 1):
        done = runner.invoke(app, ["gc", url, "--keep", str(keep), "--min-age", "0", "--json", *extra])
        assert done.exit_code == 0, done.output
        report = json.loads(done.output)
        assert [p.checkpoint_id for p in list_published(store)] == made[::-1][:keep]
        assert report["referenced_prefixes"]  # older archives stay for the kept checkpoints
        if keep == 1:
            assert _dangling_bases(store)  # the case: a kept base whose own base is gone
        checked = runner.invoke(app, ["verify", url, "--json", *extra])
        assert checked.exit_code == 0, checked.output
        findings = json.loads(checked.output)["findings"]
        assert all(f["ok"] for f in findings)
        assert any("not published" in f["message"] for f in findings)  # kept bases were checked
    # a second collection finds nothing more to delete, and verify still passes
    again = runner.invoke(app, ["gc", url, "--keep", "1", "--min-age", "0", "--json", *extra])
    assert json.loads(again.output)["deleted_objects"] == 0
    assert runner.invoke(app, ["verify", url, *extra]).exit_code == 0
    # a kept base that goes missing (damage): the finding names it, and who refers into it
    (kept,) = list_published(store)
    referrer = next(
        r.prefix
        for r in load_checkpoint(store, kept.checkpoint_id).record.components
        if any(kept.checkpoint_id not in b for b in RawArchiveReader.open(store, r.prefix).base_prefixes())
    )
    base = next(
        b for b in RawArchiveReader.open(store, referrer).base_prefixes() if kept.checkpoint_id not in b
    )
    store.delete(f"{base}/manifest.json")
    damaged = runner.invoke(app, ["verify", url, "--json", *extra])
    assert damaged.exit_code == 1
    failed = {f["subject"]: f for f in json.loads(damaged.output)["findings"] if not f["ok"]}
    assert set(failed) == {f"{base}/manifest.json", f"published/{kept.checkpoint_id}.json"}
    assert failed[f"{base}/manifest.json"]["details"]["referenced_by"] == f"{referrer}/manifest.json"
    assert (
        f"{base}/manifest.json: base archive manifest is missing"
        in failed[f"published/{kept.checkpoint_id}.json"]["message"]
    )  # the checkpoint is rejected, naming the missing object


def _copy(store: ObjectStore, out: ObjectStore | None = None) -> ObjectStore:
    out = out if out is not None else MemoryStore(f"gcv-{uuid.uuid4().hex}")
    for info in store.list(""):
        out.put(info.key, store.get(info.key))
    return out


def _checkpoint_ids(store: ObjectStore) -> set[str]:
    return {info.key.split("/")[1] for info in store.list(layout.CHECKPOINTS_PREFIX)}


def _keys(store: ObjectStore) -> list[str]:
    return sorted(info.key for info in store.list("") if not info.key.startswith("gc/"))


def test_a_kill_at_every_gc_step_then_verify_passes_and_the_next_gc_finishes() -> None:
    """Every delete and ledger write of the collection fails in turn (the collector is gone at
    that point): verify passes right away, because every archive loses its manifest before
    the objects it names, and the next collection leaves exactly what an uninterrupted one
    leaves (with ``min_age_s`` 0; with the default, what the killed run had unpublished ages
    first, as any leftover does). One run, every participant kind, a crashed cycle's leftover."""
    template = MemoryStore(f"gcv-{uuid.uuid4().hex}")
    _runs(template, runs=1, checkpoints=4, leftover=True)
    reference = _copy(template)
    steps: list[str] = []
    collect_garbage(reference, keep=1, min_age_s=0, fault_hook=steps.append)
    _all_ok(reference)
    assert _dangling_bases(reference)
    assert any(s.startswith("unpublish:") for s in steps) and "ledger" in steps
    for k in range(len(steps)):
        store = _copy(template)
        seen: list[str] = []

        def hook(step: str, k: int = k, seen: list[str] = seen) -> None:
            seen.append(step)
            if len(seen) == k + 1:
                raise Boom(step)

        with pytest.raises(Boom):
            collect_garbage(store, keep=1, min_age_s=0, fault_hook=hook)
        _all_ok(store)
        collect_garbage(store, keep=1, min_age_s=0)
        assert _keys(store) == _keys(reference), steps[k]


def test_verify_beside_a_running_gc_counts_an_unpublished_archive_deleted_meanwhile_as_collected() -> None:
    """A collection running beside ``verify`` deletes an unpublished archive (manifest first)
    after verify listed the store: not damage. An archive of a published checkpoint that goes
    missing still fails."""
    store = MemoryStore(f"gcv-{uuid.uuid4().hex}")
    _runs(store, runs=1, checkpoints=3, leftover=True)
    listing = store.list("")
    left = next(p for p in find_component_prefixes(store, "checkpoints/ck-left/"))
    store.delete(f"{left}/manifest.json")  # as gc does, manifest first
    findings = {f.subject: f for f in verify_component_archives(store, listing)}
    assert findings[f"{left}/manifest.json"].ok
    assert "deleted while verify ran" in findings[f"{left}/manifest.json"].message
    # an archive collected after verify read its manifest: its shard is missing, its manifest too
    other = next(p for p in find_component_prefixes(store, "checkpoints/ck-left/") if p != left)

    class GcBeside(DelegatingStore):
        """Collects ``other`` (manifest first) as soon as verify reads past its manifest."""

        def _collect(self, key: str) -> None:
            if key.startswith(other + "/") and not key.endswith("/manifest.json"):
                keys = [i.key for i in self.inner.list(other + "/")]
                for k in sorted(keys, key=lambda k: not k.endswith("/manifest.json")):
                    self.inner.delete(k)

        def get(self, key: str) -> bytes:
            self._collect(key)
            return self.inner.get(key)

        def open_read(self, key: str) -> Any:
            self._collect(key)
            return self.inner.open_read(key)

    beside = [f for f in verify_component_archives(GcBeside(store), listing) if f.subject.startswith(other)]
    assert [(f.ok, "deleted while verify ran" in f.message) for f in beside] == [(True, True)]
    # published: a missing manifest is a failure, named
    published = next(p for p in find_component_prefixes(store, "checkpoints/ck-0-2/"))
    store.delete(f"{published}/manifest.json")
    failed = [f for f in verify_component_archives(store, store.list("") + listing) if not f.ok]
    assert [f.subject for f in failed] == [f"{published}/manifest.json"]
