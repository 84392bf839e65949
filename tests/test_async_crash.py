"""Kill a real process (SIGKILL) at every step of an asynchronous cycle that runs after the
resume (the participants' background uploads and the coordinator's publication), then check the
store: nothing is published unless the kill came after the commit point, the baseline stays the
newest, and a fresh process restores it and runs a clean cycle."""

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
    root = tmp_path_factory.mktemp("async-crash")
    baseline = root / "baseline"
    assert json.loads(run_worker(str(baseline), "baseline"))["checkpoint_id"] == "ck-baseline"
    steps = json.loads(run_worker(str(root / "steps"), "async-steps"))
    # everything after the last resume runs in the background; the coordinator's collect calls
    # and the participants' uploads interleave in any order, so slice at the resume
    last_resume = max(i for i, s in enumerate(steps) if s.startswith("resume:"))
    return baseline, steps[last_resume + 1 :]


@pytest.mark.timeout(600)
def test_kill_at_every_background_step(pristine: tuple[Path, list[str]], tmp_path: Path) -> None:
    baseline, steps = pristine
    kinds = {s.split(":", 1)[0] for s in steps}
    assert {
        "open_write",
        "put_if_absent",
        "collect",
        "validate",
        "token_snapshot",
        "publish",
        "latest",
    } <= kinds
    outcomes = {"published": 0, "not_published": 0}
    for k, step in enumerate(steps):
        if step.startswith("resume:"):
            continue  # the resume is part of the pause (test_crash_subprocess covers the sync kills)
        root = tmp_path / f"k{k}"
        shutil.copytree(baseline, root)
        cid = f"ck-async-{k}"
        out = run_worker(str(root), "async-crash", step, cid, expect_kill=True)
        store = LocalStore(root, fsync=False)
        published = {p.checkpoint_id for p in list_published(store)}
        pointer = read_latest(store)
        assert pointer is not None
        if step == "latest":
            assert published == {"ck-baseline", cid}
            verify_checkpoint(store, cid)
            outcomes["published"] += 1
        else:
            assert published == {"ck-baseline"}, f"published although killed at {step}"
            assert pointer[0].checkpoint_id == "ck-baseline"
            outcomes["not_published"] += 1
        if step.startswith(("collect:", "validate:", "token_snapshot", "publish")):
            assert json.loads(out.splitlines()[0]) == {"resumed": True}  # killed after the resume
        latest = load_checkpoint(store)
        verify_checkpoint(store, latest.checkpoint_id)
        assert latest.rollouts["done"].disposition == "completed"
        summary = json.loads(run_worker(str(root), "recover"))
        assert summary["clean"] and summary["open"]
        assert summary["restored_from"] in published
        verify_checkpoint(store, summary["checkpoint_id"])
    assert outcomes["published"] == 1 and outcomes["not_published"] >= 12
