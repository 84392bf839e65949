"""The global record verifies itself, ``verify`` checks ``latest.json``, and damaged state is
caught by ``--verify`` and skipped (with the reason) by ``--fallback``; on disk and on S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from _protocol_fakes import Deployment
from rollout_checkpoint.cli import app
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import CheckpointRejectedError
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.commit_log import read_record
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.store import ObjectStore, open_store

runner = CliRunner()


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[str]]:
    if request.param == "local":
        return str(tmp_path / "ckpts"), []
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket: str = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/ckpts", ["--endpoint-url", endpoint]


def _store(url: str, options: list[str]) -> ObjectStore:
    return open_store(url, endpoint_url=options[1]) if options else open_store(url)


def _publish(store: ObjectStore, n: int) -> list[str]:
    dep = DemoDeployment(store)
    ids = []
    for i in range(n):
        # new rollouts every time: each checkpoint stores members of its own (format 2 refers
        # to the unchanged ones instead of writing them again)
        dep.populate(10, prefix=f"p{i}")
        ids.append(dep.checkpoint(f"ck-{i}").checkpoint_id)
    dep.close()
    return ids


def _edit(store: ObjectStore, key: str, old: bytes, new: bytes) -> None:
    data = store.get(key)
    assert old in data
    store.put(key, data.replace(old, new, 1))


def _last_json(text: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(text.strip().splitlines()[-1])
    return loaded


def test_an_edited_global_record_fails_verify_and_load(target: tuple[str, list[str]]) -> None:
    url, options = target
    store = _store(url, options)
    (cid,) = _publish(store, 1)
    assert runner.invoke(app, ["verify", url, *options]).exit_code == 0
    record, _ = read_record(store, cid)
    running = record.counts["running"]
    _edit(
        store, layout.published_key(cid), f'"running":{running}'.encode(), f'"running":{running + 1}'.encode()
    )
    result = runner.invoke(app, ["verify", url, *options])
    assert result.exit_code == 1
    assert f"published/{cid}.json" in result.stderr and "record_digest" in result.stderr
    with pytest.raises(CheckpointRejectedError, match="edited"):
        load_checkpoint(store)
    classified = runner.invoke(app, ["classify", url, "--json", *options])
    assert (
        classified.exit_code == 1 and _last_json(classified.stdout)["error"]["code"] == "checkpoint_rejected"
    )  # type: ignore[index]


def test_an_edit_that_also_fixes_the_digest_is_caught_by_the_sequence_claim(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "s"))
    (cid,) = _publish(store, 1)
    record, _ = read_record(store, cid)
    forged = record.model_copy(update={"counts": {**record.counts, "running": 99}}).sealed()
    store.put(layout.published_key(cid), forged.to_bytes())
    with pytest.raises(CheckpointRejectedError, match="sequence claim"):
        load_checkpoint(store, cid)
    # ... and a downgrade to an undigested version 1 record as well
    body = json.loads(forged.to_bytes())
    body["schema_version"] = 1
    del body["record_digest"]
    store.put(layout.published_key(cid), json.dumps(body).encode())
    with pytest.raises(CheckpointRejectedError, match="sequence claim"):
        load_checkpoint(store, cid)


def test_verify_checks_latest_json(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = open_store(url)
    first, second = _publish(store, 2)
    ok = runner.invoke(app, ["verify", url, "--json"])
    assert ok.exit_code == 0, ok.output
    subjects = {f["subject"]: f for f in _last_json(ok.stdout)["findings"]}  # type: ignore[union-attr]
    assert subjects["latest.json"]["ok"]
    # a pointer whose record digest was edited
    _edit(store, layout.LATEST_KEY, b'"sha256":"', b'"sha256":"0')
    pointer = store.get(layout.LATEST_KEY)
    store.put(layout.LATEST_KEY, pointer.replace(b'"sha256":"0', b'"sha256":"', 1)[:-1] + b"}")
    _edit(
        store,
        layout.LATEST_KEY,
        f'"checkpoint_id":"{second}"'.encode(),
        f'"checkpoint_id":"{first}"'.encode(),
    )
    bad = runner.invoke(app, ["verify", url])
    assert bad.exit_code == 1 and "latest.json" in bad.stderr and "does not match" in bad.stderr
    # a stale but intact pointer is reported, not failed: readers order by the sequence claims
    store.put(layout.LATEST_KEY, pointer.replace(b'"sha256":"0', b'"sha256":"', 1))
    assert runner.invoke(app, ["verify", url]).exit_code == 0


def _delete_a_shard(store: ObjectStore, cid: str) -> str:
    shard = next(
        i.key
        for i in store.list(layout.checkpoint_prefix(cid) + "/")
        if "/components/resources/" in i.key and "/shards/" in i.key
    )
    store.delete(shard)
    return shard


def test_a_deleted_shard_is_caught_by_verify_and_skipped_by_fallback(target: tuple[str, list[str]]) -> None:
    url, options = target
    store = _store(url, options)
    older, newest = _publish(store, 2)
    shard = _delete_a_shard(store, newest)

    # classification reads only indexes: it still says "continue" for the damaged checkpoint...
    assert runner.invoke(app, ["classify", url, *options]).exit_code == 0
    # ... --verify checks every object the plan depends on and exits 1 naming the shard
    checked = runner.invoke(app, ["classify", url, "--verify", *options])
    assert checked.exit_code == 1 and shard.rsplit("/", 1)[-1] in checked.stderr
    with pytest.raises(CheckpointRejectedError):
        load_checkpoint(store, verify=True)  # never a silent step back without fallback

    fell_back = runner.invoke(app, ["classify", url, "--verify", "--fallback", "--json", *options])
    assert fell_back.exit_code == 0, fell_back.output
    plan = _last_json(fell_back.stdout)
    assert plan["checkpoint_id"] == older and plan["verified"] is True
    (skipped,) = plan["skipped"]  # type: ignore[misc]
    assert skipped["checkpoint_id"] == newest and skipped["code"] == "checkpoint_rejected"
    assert "resources" in skipped["reason"]
    text = runner.invoke(app, ["classify", url, "--verify", "--fallback", *options])
    assert text.exit_code == 0 and f"skipped {newest}" in text.stdout

    # restore falls back the same way
    fresh = DemoDeployment(store)
    restored = fresh.coordinator.restore(verify=True, fallback=True)
    assert restored.source_checkpoint_id == older
    assert [s.checkpoint_id for s in restored.plan.skipped] == [newest]
    fresh.coordinator.resume(restored.restore_id)
    fresh.close()


def test_fallback_with_nothing_intact_is_an_error(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = open_store(url)
    for cid in _publish(store, 2):
        _delete_a_shard(store, cid)
    result = runner.invoke(app, ["classify", url, "--verify", "--fallback"])
    assert result.exit_code == 1 and "no published checkpoint verifies" in result.stderr
    assert "Traceback" not in result.output


def test_unsafe_effects_are_not_skipped_by_fallback(tmp_path: Path) -> None:
    """Fallback passes over damage, never over a declared unsafe external effect: older state
    predates that effect, so resuming from it would repeat it."""
    store = open_store(str(tmp_path / "s"))
    dep = Deployment(store)
    execution = dep.running("r")
    dep.coordinator.checkpoint("ck-0")
    dep.agent.track(execution)
    dep.agent.declare_unsafe_effect(execution, "charged a credit card")
    dep.coordinator.checkpoint("ck-1")
    dep.close()
    with pytest.raises(CheckpointRejectedError, match="credit card"):
        load_checkpoint(store, fallback=True)
    assert load_checkpoint(store, "ck-0").checkpoint_id == "ck-0"
