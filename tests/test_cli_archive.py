"""``rollout-checkpoint inspect`` and ``verify`` on local disk, memory and S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_checkpoint.archive import ArchiveWriter
from rollout_checkpoint.cli import _archive as _cli_archive
from rollout_checkpoint.cli import app
from rollout_checkpoint.cli._archive import Finding, register_verifier
from rollout_checkpoint.store import LocalStore, MemoryStore, ObjectInfo, ObjectStore, open_store
from test_archive import PREFIX, make_records, write_archive

ENV_PREFIX = "checkpoints/ck-1/components/env/e0"


def populate(store: ObjectStore) -> dict[str, str]:
    """Two archives, an aborted writer's leftovers and two other objects; returns some keys."""
    _, agent = write_archive(store, make_records(120), target_shard_bytes=8 << 10)
    _, env = write_archive(store, make_records(20), prefix=ENV_PREFIX)
    # objects no verifier interprets (published/, latest.json are the protocol layer's)
    store.put("tokens/t0/blob.bin", b"\x00" * 10)
    store.put("scratch/notes.txt", b"hello")
    aborted = ArchiveWriter(
        store,
        ENV_PREFIX,
        checkpoint_id="ck-1",
        participant_kind="env",
        instance="e0",
        target_shard_bytes=1 << 10,
    )
    for rec in make_records(30, seed=9):
        aborted.write(rec)
    aborted.abort()
    return {
        "agent_shard": f"{PREFIX}/{agent.shards[1].key}",
        "agent_index": f"{PREFIX}/{agent.index.key}",
        "env_shard": f"{ENV_PREFIX}/{env.shards[0].key}",
    }


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner()


def test_inspect_json_lists_archives_and_other_objects(runner: CliRunner, local_store: LocalStore) -> None:
    keys = populate(local_store)
    result = runner.invoke(app, ["inspect", str(local_store.root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    by_prefix = {c["prefix"]: c for c in report["components"]}
    assert set(by_prefix) == {PREFIX, ENV_PREFIX}
    agent = by_prefix[PREFIX]
    assert (
        agent["checkpoint_id"] == "ck-1"
        and agent["participant_kind"] == "agent"
        and agent["instance"] == "a0"
    )
    assert agent["records"] == 120 and sum(agent["record_counts"].values()) == 120
    assert keys["agent_shard"] in [s["key"] for s in agent["shards"]]
    assert agent["shard_bytes"] == sum(s["bytes"] for s in agent["shards"]) > 0
    assert agent["missing"] == [] and agent["unreferenced"] == []
    assert by_prefix[ENV_PREFIX]["unreferenced"]  # the aborted writer's shards
    assert {o["key"] for o in report["other_objects"]} == {"tokens/t0/blob.bin", "scratch/notes.txt"}
    assert report["objects"] == len(local_store.list(""))


def test_inspect_human_output(runner: CliRunner, local_store: LocalStore) -> None:
    populate(local_store)
    result = runner.invoke(app, ["inspect", local_store.url])
    assert result.exit_code == 0, result.output
    for text in (
        "checkpoints/ck-1/components/",
        "agent/a0",
        "env/e0",
        "tokens/t0/blob.bin",
        "scratch/notes.txt",
        "unreferenced",
    ):
        assert text in result.stdout


def test_verify_intact_exits_0(runner: CliRunner, local_store: LocalStore) -> None:
    populate(local_store)
    result = runner.invoke(app, ["verify", str(local_store.root)])
    assert result.exit_code == 0, result.output
    assert f"{PREFIX}/manifest.json" in result.stdout and "intact" in result.stdout


@pytest.mark.parametrize(
    ("target", "damage", "problem"),
    [
        ("agent_shard", "flip", "altered"),
        ("agent_shard", "truncate", "truncated"),
        ("agent_shard", "delete", "missing"),
        ("agent_index", "delete", "missing"),
        ("agent_index", "flip", "altered"),
        ("env_shard", "truncate", "truncated"),
    ],
)
def test_verify_names_the_damaged_object(
    runner: CliRunner, local_store: LocalStore, target: str, damage: str, problem: str
) -> None:
    keys = populate(local_store)
    key = keys[target]
    data = local_store.get(key)
    if damage == "flip":
        local_store.put(key, data[:100] + bytes([data[100] ^ 0x20]) + data[101:])
    elif damage == "truncate":
        local_store.put(key, data[:-7])
    else:
        local_store.delete(key)
    result = runner.invoke(app, ["verify", str(local_store.root)])
    assert result.exit_code == 1
    assert key in result.stderr and problem in result.stderr
    as_json = runner.invoke(app, ["verify", str(local_store.root), "--json"])
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    bad = [f for f in report["findings"] if not f["ok"]]
    assert report["ok"] is False and [f["subject"] for f in bad] == [key]
    assert bad[0]["code"] == "integrity_error" and bad[0]["details"]["problem"] == problem


def test_verify_corrupt_manifest(runner: CliRunner, local_store: LocalStore) -> None:
    populate(local_store)
    local_store.put(f"{PREFIX}/manifest.json", b'{"schema_version": 1, "truncated')
    result = runner.invoke(app, ["verify", str(local_store.root)])
    assert result.exit_code == 1 and f"{PREFIX}/manifest.json" in result.stderr


def test_verify_nothing_there_fails(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(tmp_path)])
    assert result.exit_code == 1 and "nothing to verify" in result.stderr
    missing = tmp_path / "no" / "such"
    result = runner.invoke(app, ["verify", str(missing), "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["error"]["code"] == "store_error"
    assert not missing.exists()  # a read-only command created nothing


def test_usage_error_exits_2(runner: CliRunner) -> None:
    assert runner.invoke(app, ["verify"]).exit_code == 2
    assert runner.invoke(app, ["inspect", "x", "--bogus"]).exit_code == 2


def test_memory_url(runner: CliRunner, memory_store: MemoryStore) -> None:
    populate(memory_store)
    result = runner.invoke(app, ["verify", memory_store.url])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["inspect", memory_store.url, "--json"])
    assert len(json.loads(result.stdout)["components"]) == 2


@pytest.fixture()
def extra_verifier() -> Iterator[list[str]]:
    seen: list[str] = []

    def check_latest(store: ObjectStore, listing: list[ObjectInfo]) -> Iterator[Finding]:
        for info in listing:
            if info.key == "scratch/notes.txt":
                seen.append(info.key)
                yield Finding(info.key, False, "notes are not allowed here", "test_code")

    register_verifier(check_latest)
    try:
        yield seen
    finally:
        _cli_archive.VERIFIERS.remove(check_latest)


def test_registered_verifiers_run(
    runner: CliRunner, local_store: LocalStore, extra_verifier: list[str]
) -> None:
    populate(local_store)
    result = runner.invoke(app, ["verify", str(local_store.root)])
    assert extra_verifier == ["scratch/notes.txt"]
    assert result.exit_code == 1 and "notes are not allowed here" in result.stderr


@pytest.mark.s3
def test_s3_inspect_and_verify_subprocess(s3_url: str, s3_endpoint: str) -> None:
    store = open_store(s3_url, endpoint_url=s3_endpoint)
    keys = populate(store)
    exe = [str(Path(sys.executable).with_name("rollout-checkpoint"))]
    cmd = [*exe, "verify", s3_url, "--endpoint-url", s3_endpoint]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = subprocess.run(
        [*exe, "inspect", s3_url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AWS_ENDPOINT_URL": s3_endpoint},
    )
    assert report.returncode == 0, report.stderr
    assert {c["prefix"] for c in json.loads(report.stdout)["components"]} == {PREFIX, ENV_PREFIX}
    store.delete(keys["agent_shard"])
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and keys["agent_shard"] in bad.stderr and "missing" in bad.stderr


@pytest.mark.s3
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_s3_verify_names_altered_or_truncated_shard(
    runner: CliRunner, s3_url: str, s3_endpoint: str, damage: str
) -> None:
    store = open_store(s3_url, endpoint_url=s3_endpoint)
    _, manifest = write_archive(store, make_records(60), target_shard_bytes=4 << 10)
    key = f"{PREFIX}/{manifest.shards[1].key}"
    data = store.get(key)
    store.put(key, data[:50] + bytes([data[50] ^ 0x01]) + data[51:] if damage == "flip" else data[:-9])
    problem = "altered" if damage == "flip" else "truncated"
    result = runner.invoke(app, ["verify", s3_url, "--endpoint-url", s3_endpoint])
    assert result.exit_code == 1
    assert key in result.stderr and problem in result.stderr
    as_json = runner.invoke(app, ["verify", s3_url, "--endpoint-url", s3_endpoint, "--json"])
    bad = [f for f in json.loads(as_json.stdout)["findings"] if not f["ok"]]
    assert as_json.exit_code == 1 and [(f["subject"], f["details"]["problem"]) for f in bad] == [
        (key, problem)
    ]


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "file://", "local://"])
def test_garbage_urls_fail_cleanly_and_create_nothing(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for command in ("inspect", "verify"):
        result = runner.invoke(app, [command, url, "--json"])
        assert result.exit_code == 1, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        error = json.loads(result.stdout)["error"]
        assert error["code"] == "store_error" and error["message"]
    assert list(tmp_path.iterdir()) == []  # no directory named "s3:" or "file:" appeared


def test_inspect_memory_root_reports_empty(runner: CliRunner) -> None:
    result = runner.invoke(app, ["inspect", "memory://", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["url"] == "memory://"


def test_verify_a_file_instead_of_a_directory(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    path.write_text("{}")
    result = runner.invoke(app, ["verify", str(path)])
    assert (
        result.exit_code == 1 and "is a file, not a store" in result.stderr and "store_error" in result.stderr
    )
    assert path.read_text() == "{}"
