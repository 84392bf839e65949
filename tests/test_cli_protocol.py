"""``rollout-checkpoint list``, ``classify`` and the published-checkpoint verifier (the ``demo``
command itself is tested in ``test_demo.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from _protocol_fakes import Deployment
from rollout_checkpoint.cli import app
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format import layout
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.store._counting import CountingStore

runner = CliRunner()


def _json(output: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(output.strip().splitlines()[-1])
    return loaded


def test_populated_deployment_then_list_classify_verify(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    deployment = DemoDeployment(LocalStore(target))
    deployment.populate(30)
    outcome = deployment.checkpoint()
    deployment.close()
    demo = {"checkpoint_id": outcome.checkpoint_id, "counts": load_checkpoint(LocalStore(target)).counts()}
    assert demo["counts"] == {"completed": 6, "continue": 18, "fresh_dispatch": 6}

    listed = runner.invoke(app, ["list", str(target), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = _json(listed.stdout)["checkpoints"]
    assert isinstance(rows, list) and len(rows) == 1
    assert rows[0]["checkpoint_id"] == demo["checkpoint_id"] and rows[0]["latest"]

    classified = runner.invoke(app, ["classify", str(target), "--json"])
    assert classified.exit_code == 0, classified.output
    plan = _json(classified.stdout)
    assert plan["counts"] == demo["counts"]
    rollouts = plan["rollouts"]
    assert isinstance(rollouts, list) and len(rollouts) == 30
    assert {r["disposition"] for r in rollouts} == {"completed", "continue", "fresh_dispatch"}

    table = runner.invoke(app, ["classify", str(target), "--checkpoint", str(demo["checkpoint_id"])])
    assert table.exit_code == 0 and "fresh_dispatch" in table.stdout and "no shard payload" in table.stdout

    # the plan of the reference participants' checkpoint was read from indexes, not payloads
    counting = CountingStore(LocalStore(target))
    assert load_checkpoint(counting, verify=False).counts() == demo["counts"]
    assert counting.keys_read and not [k for k in counting.keys_read if "/shards/" in k]

    verified = runner.invoke(app, ["verify", str(target), "--json"])
    assert verified.exit_code == 0, verified.output
    findings = _json(verified.stdout)["findings"]
    assert isinstance(findings, list)
    assert any(f["subject"] == f"published/{demo['checkpoint_id']}.json" and f["ok"] for f in findings)


def test_list_of_an_empty_store(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["list", str(tmp_path / "empty")])
    assert result.exit_code == 0 and "no published checkpoint" in result.stdout


def test_classify_exits_1_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    store = LocalStore(tmp_path / "s")
    missing = runner.invoke(app, ["classify", str(tmp_path / "s"), "--json"])
    assert missing.exit_code == 1 and _json(missing.stdout)["error"]["code"] == "checkpoint_not_found"  # type: ignore[index]

    dep = Deployment(store)
    execution = dep.running("r")
    dep.agent.track(execution)
    dep.agent.declare_unsafe_effect(execution, "charged a credit card")
    cid = dep.coordinator.checkpoint().checkpoint_id
    dep.close()
    rejected = runner.invoke(app, ["classify", str(tmp_path / "s"), "--json"])
    assert rejected.exit_code == 1
    error = _json(rejected.stdout)["error"]
    assert isinstance(error, dict) and error["code"] == "checkpoint_rejected"
    assert "charged a credit card" in error["message"]
    text = runner.invoke(app, ["classify", str(tmp_path / "s")])
    assert text.exit_code == 1 and "unsafe external effect" in text.output

    # a mistyped id is an invalid id, not a rejected checkpoint
    typo = runner.invoke(app, ["classify", str(tmp_path / "s"), "--checkpoint", "../x", "--json"])
    assert typo.exit_code == 1 and _json(typo.stdout)["error"]["code"] == "invalid_id"  # type: ignore[index]

    # verify reports the same published checkpoint as a failure
    verified = runner.invoke(app, ["verify", str(tmp_path / "s"), "--json"])
    assert verified.exit_code == 1
    assert store.exists(layout.published_key(cid))
