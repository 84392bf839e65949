"""Fail closed by default (issue 18, D4): ``load_checkpoint()`` and ``Coordinator.restore()``
digest-check every payload a restore installs and every token row a continuing rollout depends
on unless told otherwise; a damaged newest checkpoint is refused (or, with ``fallback``, skipped
and named), never continued from. ``verify=False`` stays available and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _reference_world import RealWorld
from rollout_checkpoint.errors import CheckpointRejectedError
from rollout_checkpoint.format import layout
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.store import LocalStore

DAMAGE = [
    ("tokens", "flip"),
    ("tokens", "swap"),
    ("model", "delete"),
    ("model", "flip"),
    ("agent", "flip"),
    ("resources", "truncate"),
]
INSTANCES = {"model": "policy-0", "agent": "agent-0", "resources": "res-0"}


def _two_checkpoints(root: Path) -> tuple[LocalStore, str, str]:
    store = LocalStore(root)
    world = RealWorld(store)
    run = world.start("r")
    world.turn(run, "c1", 1)
    older = world.coordinator.checkpoint().checkpoint_id
    world.agent.start_turn(run)
    world.turn(run, "c2", 2)
    newest = world.coordinator.checkpoint().checkpoint_id
    world.close()
    return store, older, newest


def _shards(store: LocalStore, cid: str) -> set[str]:
    snapshot = json.loads(store.get(f"{layout.TOKENS_PREFIX}/snapshots/{cid}.json"))
    return {entry["shard"] for entry in snapshot["entries"].values()}


def _damage(store: LocalStore, older: str, cid: str, where: str, how: str) -> None:
    if where == "tokens":
        [key] = sorted(_shards(store, cid) - _shards(store, older))  # only the newest needs it
        if how == "swap":  # another valid token shard's bytes under this key
            store.put(key, store.get(next(iter(_shards(store, older)))))
            return
    else:
        prefix = layout.component_prefix(cid, where, INSTANCES[where]) + "/shards/"
        key = sorted(i.key for i in store.list(prefix))[0]
    if how == "delete":
        store.delete(key)
        return
    data = bytearray(store.get(key))
    if how == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 3] ^= 0xFF
    store.put(key, bytes(data))


@pytest.mark.parametrize(("where", "how"), DAMAGE)
def test_default_load_and_restore_refuse_a_damaged_newest_checkpoint(
    tmp_path: Path, where: str, how: str
) -> None:
    store, older, newest = _two_checkpoints(tmp_path / "store")
    _damage(store, older, newest, where, how)
    cheap = load_checkpoint(store, verify=False)  # the cheap plan does not notice, and says so
    assert cheap.checkpoint_id == newest and cheap.unverified
    assert any(note.startswith("unverified") for note in cheap.notes)
    with pytest.raises(CheckpointRejectedError):
        load_checkpoint(store)
    world = RealWorld(store)
    with pytest.raises(CheckpointRejectedError):
        world.coordinator.restore()
    assert all(p.status().live == 0 and p.status().tombstones == 0 for p in world.participants)
    outcome = world.coordinator.restore(fallback=True)  # named, never silent
    assert outcome.source_checkpoint_id == older
    assert [s.checkpoint_id for s in outcome.plan.skipped] == [newest]
    assert not outcome.plan.unverified
    world.coordinator.resume(outcome.restore_id)
    world.close()
