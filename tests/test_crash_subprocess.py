"""Kill a real process (SIGKILL) at every step k of a checkpoint cycle, then check the store.

After each kill: either the crashed cycle's checkpoint is published and fully verifies, or it
is not published and the baseline is still latest; the completed result is never lost; and a
fresh process restores the latest checkpoint and runs a clean cycle.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _crash_run import run_worker
from rollout_checkpoint.format.commit_log import list_published, read_latest
from rollout_checkpoint.reader import load_checkpoint, verify_checkpoint
from rollout_checkpoint.store import LocalStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("crash")
    baseline = root / "baseline"
    assert json.loads(run_worker(str(baseline), "baseline"))["checkpoint_id"] == "ck-baseline"
    steps = json.loads(run_worker(str(root / "steps"), "steps"))
    return baseline, steps


def test_kill_at_every_step(pristine: tuple[Path, list[str]], tmp_path: Path) -> None:
    baseline, steps = pristine
    assert len(steps) >= 20 and "publish" in steps
    commit_point = steps.index("publish")
    outcomes: dict[str, int] = {"published": 0, "not_published": 0}
    for k in range(len(steps)):
        root = tmp_path / f"k{k}"
        shutil.copytree(baseline, root)
        cid = f"ck-crash-{k}"
        run_worker(str(root), "crash", str(k), cid, expect_kill=True)

        store = LocalStore(root, fsync=False)
        published = {p.checkpoint_id for p in list_published(store)}
        pointer = read_latest(store)
        assert pointer is not None
        if cid in published:
            assert k > commit_point, f"published although killed before the commit point (step {steps[k]})"
            verify_checkpoint(store, cid)
            outcomes["published"] += 1
        else:
            assert k <= commit_point, (
                f"not published although killed after the commit point (step {steps[k]})"
            )
            assert pointer[0].checkpoint_id == "ck-baseline"
            outcomes["not_published"] += 1
        assert published <= {"ck-baseline", cid}
        latest = load_checkpoint(store)
        verify_checkpoint(store, latest.checkpoint_id)
        assert latest.rollouts["done"].disposition == "completed"

        summary = json.loads(run_worker(str(root), "recover"))
        assert summary["clean"] and summary["open"]
        assert summary["registry"]["done"] == [0, "handed_off"]
        verify_checkpoint(store, summary["checkpoint_id"])
    assert outcomes["published"] >= 3 and outcomes["not_published"] >= 20


def test_kill_at_every_step_of_an_incremental_publication(
    pristine: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """The same, for a checkpoint that refers into the process's previous one (format 2)."""
    baseline, _ = pristine
    steps = json.loads(run_worker(str(tmp_path / "steps"), "incremental-steps"))
    commit_point = steps.index("publish")
    outcomes = {"published": 0, "not_published": 0}
    for k in range(len(steps)):
        root = tmp_path / f"k{k}"
        shutil.copytree(baseline, root)
        cid = f"ck-crash-{k}"
        run_worker(str(root), "incremental-crash", str(k), cid, expect_kill=True)
        store = LocalStore(root, fsync=False)
        published = {p.checkpoint_id for p in list_published(store)}
        assert published <= {"ck-baseline", "ck-first", cid} and "ck-first" in published
        if cid in published:
            assert k > commit_point, f"published although killed before the commit point (step {steps[k]})"
            outcomes["published"] += 1
        else:
            assert k <= commit_point, (
                f"not published although killed after the commit point (step {steps[k]})"
            )
            outcomes["not_published"] += 1
        for checkpoint_id in published:  # the referred-to archives stay intact whatever was killed
            verify_checkpoint(store, checkpoint_id)
        summary = json.loads(run_worker(str(root), "recover"))
        assert summary["clean"] and summary["open"]
        verify_checkpoint(store, summary["checkpoint_id"])
    assert outcomes["published"] >= 3 and outcomes["not_published"] >= 10
