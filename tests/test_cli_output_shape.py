"""What a user sees: a folder of stores is named as one, ids are printed whole into a pipe, and
``classify --limit 0`` prints no empty table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_checkpoint.cli import app
from rollout_checkpoint.cli._archive import stores_within
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format.commit_log import list_published
from rollout_checkpoint.store import LocalStore

runner = CliRunner()

LONG_RUN = "a-run-whose-id-is-long-enough-to-be-cut-" + "0123456789abcdef" * 2
LONG_PREFIX = "a-rollout-id-a-narrow-table-would-cut-" + "f" * 24


def _store(root: Path, checkpoints: int = 2, run_id: str = LONG_RUN) -> list[str]:
    deployment = DemoDeployment(str(root), run_id=run_id)
    deployment.populate(3, prefix=LONG_PREFIX)
    for _ in range(checkpoints):
        assert deployment.checkpoint().clean
    deployment.close()
    return [p.checkpoint_id for p in list_published(LocalStore(root))]


def test_stores_within_names_the_outermost_stores_and_nothing_inside_a_store() -> None:
    assert stores_within(["checkpoints/c/components/resources/published/manifest.json"]) == []
    assert stores_within(["latest.json", "full-1/latest.json"]) == []  # the root is a store
    keys = [
        "full-1/latest.json",
        "full-1/checkpoints/c/components/agent/a/manifest.json",
        "runs/incremental-1/published/ckpt-1.json",
        "runs/incremental-1/old/latest.json",  # a store inside a store's folder
        "other/sequence/00000000000000000001.json",
        "notes/published/readme.txt",  # not a record
    ]
    assert stores_within(keys) == ["full-1", "other", "runs/incremental-1"]
    assert stores_within(["notes/readme.txt"]) == []


def test_a_folder_that_holds_stores_is_one_line_naming_them(tmp_path: Path) -> None:
    _store(tmp_path / "runs" / "full-7a1c", checkpoints=1)
    _store(tmp_path / "runs" / "incremental-7a1c", checkpoints=1)
    folder = str(tmp_path / "runs")
    for command in ("verify", "list", "classify", "gc"):
        result = runner.invoke(app, [command, folder])
        assert result.exit_code == 1, (command, result.output)
        assert result.stdout == ""
        (line,) = result.stderr.strip().splitlines()
        assert "(not_a_store)" in line and "not a checkpoint store" in line, line
        assert "full-7a1c/" in line and "incremental-7a1c/" in line
        as_json = runner.invoke(app, [command, folder, "--json"])
        error = json.loads(as_json.stdout)["error"]
        assert as_json.exit_code == 1 and error["code"] == "not_a_store"
        assert error["details"]["stores"] == ["full-7a1c", "incremental-7a1c"]
    assert not (tmp_path / "runs" / "gc").exists()  # gc wrote nothing there
    # each store verifies on its own
    assert runner.invoke(app, ["verify", f"{folder}/full-7a1c"]).exit_code == 0


def test_ids_are_printed_whole_into_a_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: no terminal, no width asked for
    ids = _store(tmp_path / "s")
    listed = runner.invoke(app, ["list", str(tmp_path / "s")])
    assert listed.exit_code == 0, listed.output
    assert "…" not in listed.stdout
    assert all(cid in listed.stdout for cid in ids) and LONG_RUN in listed.stdout
    classified = runner.invoke(app, ["classify", str(tmp_path / "s"), "--limit", "-1"])
    assert classified.exit_code == 0 and "…" not in classified.stdout
    assert all(f"{LONG_PREFIX}-{i:07d}" in classified.stdout for i in range(3))
    inspected = runner.invoke(app, ["inspect", str(tmp_path / "s")])
    assert inspected.exit_code == 0 and "…" not in inspected.stdout
    # a width asked for (COLUMNS) is still fitted, as on a terminal
    narrow = runner.invoke(app, ["list", str(tmp_path / "s")], env={"COLUMNS": "80"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_classify_limit_0_prints_the_summary_and_no_empty_table(tmp_path: Path) -> None:
    _store(tmp_path / "s", checkpoints=1)
    result = runner.invoke(app, ["classify", str(tmp_path / "s"), "--limit", "0"])
    assert result.exit_code == 0, result.output
    assert "disposition" in result.stdout and "next attempt" not in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("... 3 rollout(s) not listed")
    shown = runner.invoke(app, ["classify", str(tmp_path / "s"), "--limit", "1"])
    assert "next attempt" in shown.stdout and "... 2 more rollout(s) not listed" in shown.stdout
