"""One coordinator owns a store (issue 18, item 4): owner epochs taken create-only, a second run
refused unless it takes over, a fenced coordinator publishes nothing, readers pass over a late
record of a fenced coordinator, ``list`` / ``classify`` show the run and epoch; and a real
zombie process (SIGSTOP before its commit point, replacement takes over, SIGCONT) publishes
nothing while the replacement's checkpoints verify."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _reference_world import RealWorld
from rollout_checkpoint.cli import app
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.errors import CheckpointRejectedError, StaleCoordinatorError, StoreOwnedError
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.format.ownership import read_epochs
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import LocalStore

TESTS = Path(__file__).parent


def _world(store: LocalStore, *, run_id: str = "test-run", takeover: bool = False) -> RealWorld:
    world = RealWorld(store)
    world.coordinator = Coordinator(
        store, world.participants, world.registry, world.tokens, run_id=run_id, takeover=takeover
    )
    return world


def _published(store: LocalStore) -> list[str]:
    return sorted(p.checkpoint_id for p in list_published(store))


def test_a_second_run_is_refused_naming_the_owner_unless_it_takes_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    first = _world(store, run_id="run-a")
    run = first.start("r")
    first.turn(run, "c1", 1)
    cid = first.coordinator.checkpoint().checkpoint_id
    first.close()
    intruder = _world(store, run_id="run-b")
    for attempt in (intruder.coordinator.checkpoint, intruder.coordinator.restore):
        with pytest.raises(StoreOwnedError) as info:
            attempt()
        assert info.value.code == "store_owned" and "run-a" in info.value.message
    assert _published(store) == [cid] and [e.run_id for e in read_epochs(store)] == ["run-a"]
    intruder.close()
    taker = _world(store, run_id="run-b", takeover=True)
    outcome = taker.coordinator.restore()
    taker.coordinator.resume(outcome.restore_id)
    record = taker.coordinator.checkpoint().record
    assert (record.run_id, record.epoch) == ("run-b", 2)
    assert read_epochs(store)[-1].took_over_from == "run-a"
    taker.close()


def test_a_replaced_coordinator_publishes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = _world(store)
    run = old.start("r")
    old.turn(run, "c1", 1)
    first = old.coordinator.checkpoint()
    assert (first.record.run_id, first.record.epoch) == ("test-run", 1)
    new = _world(store)  # the same run's replacement: the next epoch
    new.coordinator.restore()
    before = _published(store)
    with pytest.raises(StaleCoordinatorError) as info:
        old.coordinator.checkpoint()
    assert info.value.code == "stale_coordinator"
    assert _published(store) == before
    assert all(p.status().accepting for p in old.participants)  # aborted: resumed
    with pytest.raises(StaleCoordinatorError):  # nor does it restore
        old.coordinator.restore()
    old.close()
    new.close()


def test_readers_pass_over_a_record_a_fenced_coordinator_landed_late(tmp_path: Path) -> None:
    """The check-then-put window: a fenced coordinator's record that landed anyway (here: its
    last check disabled) is never used; asked for by id it is rejected, naming the takeover."""
    store = LocalStore(tmp_path / "store")
    old = _world(store)
    run = old.start("r")
    old.turn(run, "c1", 1)
    old.coordinator.checkpoint()
    new = _world(store)
    outcome = new.coordinator.restore()
    new.coordinator.resume(outcome.restore_id)
    good = new.coordinator.checkpoint().checkpoint_id
    old.coordinator._check_owner = lambda mine: None  # type: ignore[method-assign]
    late = old.coordinator.checkpoint().checkpoint_id  # lands after the takeover
    plan = load_checkpoint(store)
    assert plan.checkpoint_id == good
    assert any(late in note and "took the store over" in note for note in plan.notes)
    with pytest.raises(CheckpointRejectedError) as info:
        load_checkpoint(store, late)
    assert info.value.details["code"] == "stale_coordinator"
    old.close()
    new.close()


def test_list_and_classify_show_run_and_epoch(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    world = _world(store, run_id="run-x")
    world.coordinator.checkpoint()
    world.close()
    runner = CliRunner()
    listed = json.loads(runner.invoke(app, ["list", str(tmp_path / "store"), "--json"]).stdout)
    assert [(c["run_id"], c["epoch"]) for c in listed["checkpoints"]] == [("run-x", 1)]
    plan = json.loads(runner.invoke(app, ["classify", str(tmp_path / "store"), "--json"]).stdout)
    assert (plan["run_id"], plan["epoch"]) == ("run-x", 1)
    table = runner.invoke(app, ["list", str(tmp_path / "store")])
    assert "run-x/1" in table.stdout


def test_a_zombie_coordinator_process_publishes_nothing(tmp_path: Path) -> None:
    """SIGSTOP a coordinator process just before its commit point, let its replacement take the
    store over and publish, SIGCONT it: it publishes nothing more; the replacement's verify."""
    root = tmp_path / "store"
    store = LocalStore(root)
    zombie = subprocess.Popen(
        [sys.executable, str(TESTS / "_zombie_coordinator.py"), str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    lines: list[str] = []

    def read() -> None:
        assert zombie.stdout is not None
        for line in zombie.stdout:
            lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(predicate: object, what: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():  # type: ignore[operator]
                return
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}: {lines[-5:]}")

    try:
        wait_for(lambda: any(line.startswith("published") for line in lines), "a first publication")
        count = len(lines)
        wait_for(lambda: "at-publish" in lines[count:], "the zombie at its commit point")
        os.kill(zombie.pid, signal.SIGSTOP)
        stopped_at = len(lines)
        replacement = _world(store)
        outcome = replacement.coordinator.restore()
        replacement.coordinator.resume(outcome.restore_id)
        mine = [replacement.coordinator.checkpoint().checkpoint_id for _ in range(2)]
        os.kill(zombie.pid, signal.SIGCONT)
        wait_for(
            lambda: sum(line == "refused stale_coordinator" for line in lines[stopped_at:]) >= 3,
            "the zombie's refusals",
        )
    finally:
        zombie.kill()
        zombie.wait(30)
    assert not [line for line in lines[stopped_at:] if line.startswith("published")], lines[stopped_at:]
    epochs = read_epochs(store)
    assert [e.epoch for e in epochs] == [1, 2]
    for item in list_published(store):
        assert item.record is not None
        if item.record.epoch == 1:  # the zombie's: all from before the takeover
            assert item.record.sequence <= epochs[1].published_through
    plan = load_checkpoint(store)
    assert plan.checkpoint_id == mine[-1] and (plan.record.run_id, plan.record.epoch) == ("test-run", 2)
    for cid in mine:
        verify_checkpoint(store, cid)
    replacement.close()
