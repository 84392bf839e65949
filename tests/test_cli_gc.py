"""`rollout-checkpoint gc`: keep the newest K published checkpoints, unpublish then delete the rest."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rollout_checkpoint.cli import app
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format.commit_log import list_published, read_latest
from rollout_checkpoint.reader import verify_checkpoint
from rollout_checkpoint.store import LocalStore


def _demo(root: Path, times: int) -> None:
    """``times`` published checkpoints of the populated demo deployment."""
    for _ in range(times):
        deployment = DemoDeployment(LocalStore(root))
        deployment.populate(6)
        assert deployment.checkpoint().clean
        deployment.close()


def test_gc_keeps_newest_and_latest_and_deletes_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _demo(root, 3)
    store = LocalStore(root)
    before = [p.checkpoint_id for p in list_published(store)]
    assert len(before) == 3

    dry = CliRunner().invoke(app, ["gc", str(root), "--keep", "1", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    planned = json.loads(dry.output)
    assert planned["dry_run"] and sorted(planned["unpublished"]) == sorted(before[1:])
    assert [p.checkpoint_id for p in list_published(store)] == before  # nothing changed

    done = CliRunner().invoke(app, ["gc", str(root), "--keep", "1", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["kept"] == before[:1] and sorted(report["unpublished"]) == sorted(before[1:])
    assert [p.checkpoint_id for p in list_published(store)] == before[:1]
    for gone in before[1:]:
        assert not store.list(f"checkpoints/{gone}/")
    pointer = read_latest(store)
    assert pointer is not None and pointer[0].checkpoint_id == before[0]
    verify_checkpoint(store, before[0])


def test_gc_refuses_bad_arguments_and_urls(tmp_path: Path) -> None:
    assert CliRunner().invoke(app, ["gc", str(tmp_path), "--keep", "0"]).exit_code == 2
    missing = CliRunner().invoke(app, ["gc", "s3://", "--json"])
    assert missing.exit_code == 1
    assert json.loads(missing.output)["error"]["code"] == "store_error"
