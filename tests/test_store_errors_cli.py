"""Storage failures are typed errors naming the path, never "nothing stored here" and never a
traceback; user text (paths, bucket names, pydantic details) is printed literally."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_checkpoint.cli import app
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import (
    CheckpointError,
    StoreError,
    StorePermissionError,
    StoreUnreachableError,
)
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.store import LocalStore, open_store

runner = CliRunner()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _error(result: object) -> dict[str, object]:
    stdout: str = result.stdout  # type: ignore[attr-defined]
    loaded: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])["error"]
    return loaded


def test_an_unreachable_http_store_is_an_error_not_empty() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/x"
    result = runner.invoke(app, ["list", url, "--json"])
    assert result.exit_code == 1
    assert _error(result)["code"] == "store_unreachable" and url in str(_error(result)["message"])
    text = runner.invoke(app, ["list", url])
    assert text.exit_code == 1 and "no published checkpoint" not in text.output
    with pytest.raises(StoreUnreachableError):
        load_checkpoint(url)


@pytest.mark.s3
def test_an_unreachable_s3_endpoint_is_an_error_not_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_STORE_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("ROLLOUT_CHECKPOINT_STORE_RETRY_MAX_WAIT", "0.05")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    for command in (["list"], ["classify"], ["verify"], ["gc"]):
        result = runner.invoke(app, [*command, "s3://bucket/x", "--endpoint-url", endpoint, "--json"])
        assert result.exit_code == 1, (command, result.output)
        assert _error(result)["code"] == "store_unreachable", result.output
    with pytest.raises(StoreUnreachableError):
        load_checkpoint("s3://bucket/x", endpoint_url=endpoint)


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[None]:
    """Really read-only, also for root (who ignores mode bits): the immutable attribute."""
    if os.geteuid() != 0:
        for p in [path, *path.rglob("*")]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p in [path, *path.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "-R", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root without a working chattr: no way to make a directory read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-R", "-i", str(path)], check=True)


def test_a_read_only_directory_gives_permission_denied_with_the_path(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    with _read_only(target):
        result = runner.invoke(app, ["demo", str(target), "--in-process", "--rollouts", "4", "--json"])
        assert result.exit_code == 1, result.output
        error = _error(result)
        assert error["code"] == "permission_denied" and str(target) in str(error["message"])
        text = runner.invoke(app, ["demo", str(target), "--in-process", "--rollouts", "4"])
        assert text.exit_code == 1 and "Traceback" not in text.output
        with pytest.raises(StorePermissionError):
            LocalStore(target).put("k", b"v")

    # reading works on a read-only copy of real checkpoints; gc (which writes) says why it cannot
    dep = DemoDeployment(str(target))
    dep.populate(4)
    dep.checkpoint("ck-0")
    dep.checkpoint("ck-1")
    dep.close()
    with _read_only(target):
        assert runner.invoke(app, ["classify", str(target)]).exit_code == 0
        assert runner.invoke(app, ["verify", str(target)]).exit_code == 0
        gc = runner.invoke(app, ["gc", str(target), "--keep", "1", "--json"])
        assert gc.exit_code == 1 and _error(gc)["code"] == "permission_denied"


def test_a_read_only_fsspec_backend_is_a_store_error(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("x/readme.txt", "hello")
    url = f"zip://x::{archive}"
    result = runner.invoke(
        app, ["demo", url, "--in-process", "--rollouts", "10", "--json", "--accept-unsafe-store"]
    )
    assert result.exit_code == 1
    assert _error(result)["code"] == "store_error" and url in str(_error(result)["message"])


@pytest.mark.parametrize(
    "url", ["s3://Bad_Bucket!!/x", "/tmp/x[/b]", "/tmp/[red]not-there[/red]", "/tmp/:smile:[bold]"]
)
def test_markup_characters_in_urls_are_printed_literally(url: str) -> None:
    result = runner.invoke(app, ["list", url, "--endpoint-url", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert url in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) <= 3  # one message (botocore's may wrap)


def test_markup_characters_in_a_real_path_and_pydantic_details(tmp_path: Path) -> None:
    target = tmp_path / "runs[/b][red]x"
    dep = DemoDeployment(str(target))
    dep.populate(4)
    dep.checkpoint("ck-0")
    dep.close()
    for command in ("list", "inspect", "verify", "classify"):
        result = runner.invoke(app, [command, str(target)])
        assert result.exit_code == 0, (command, result.output)
        if command == "inspect":
            assert str(target) in result.stdout.replace("%5B", "[").replace("%5D", "]")
    # an invalid record in the store: pydantic's [type=...] detail reaches the user intact
    store = open_store(str(target))
    store.put("latest.json", b'{"schema_version": 1, "type": "latest_pointer", "sequence": "x"}')
    result = runner.invoke(app, ["verify", str(target)])
    assert result.exit_code == 1 and "[type=" in result.stderr


def test_version_limit_and_help() -> None:
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("rollout-checkpoint ")
    for command in ([], ["list"], ["classify"], ["verify"], ["inspect"], ["gc"], ["demo"]):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.stdout and "{url}" not in result.stdout.lower(), result.stdout
    for command in ("demo", "gc"):
        assert "--accept-unsafe-store" in runner.invoke(app, [command, "--help"]).stdout


def test_classify_limit_minus_one_shows_every_rollout(tmp_path: Path) -> None:
    dep = DemoDeployment(str(tmp_path / "s"))
    dep.populate(12)
    dep.checkpoint("ck-0")
    dep.close()
    every = runner.invoke(app, ["classify", str(tmp_path / "s"), "--limit", "-1"])
    assert every.exit_code == 0 and "more (use --json" not in every.stdout
    assert all(f"rollout-{i:07d}" in every.stdout for i in range(12))
    some = runner.invoke(app, ["classify", str(tmp_path / "s"), "--limit", "5"])
    assert "... 7 more" in some.stdout


def test_inspect_and_list_fit_the_terminal(tmp_path: Path) -> None:
    dep = DemoDeployment(str(tmp_path / "s"))
    dep.populate(6)
    dep.checkpoint()
    dep.checkpoint()
    dep.close()
    for width in (80, 120):
        for command in ("inspect", "list", "classify"):
            result = runner.invoke(app, [command, str(tmp_path / "s")], env={"COLUMNS": str(width)})
            assert result.exit_code == 0, result.output
            tables = [line for line in result.stdout.splitlines() if "─" in line or "│" in line]
            assert tables and max(len(line) for line in tables) <= width, (command, width)


def test_invalid_values_are_typed_errors() -> None:
    from rollout_checkpoint import ExecutionId, ResourcesParticipant
    from rollout_checkpoint.participants import PolicyModelParticipant
    from rollout_checkpoint.store import MemoryStore
    from rollout_checkpoint.tokens import ObjectStoreTokenStore

    with pytest.raises(CheckpointError) as info:
        ResourcesParticipant(mode="bogus")  # type: ignore[arg-type]
    assert info.value.code == "invalid_value" and "bogus" in info.value.message
    model = PolicyModelParticipant(ObjectStoreTokenStore(MemoryStore("invalid-values")), "p0")
    execution = ExecutionId(rollout_id="r1", attempt=0)
    with pytest.raises(CheckpointError) as info, model.call(execution, "c1", policy_version=7) as call:  # type: ignore[arg-type]
        call.stage(prompt_token_ids=[1], generation_token_ids=[2], generation_log_probs=[-0.1])
    # the model refuses the value when the call is admitted, before any token is staged
    assert info.value.code == "invalid_argument" and "policy_version" in info.value.message
    model.close()


# -- issue 18, items 6 and 7: no traceback for any URL ----------------------------------------------

ODD_URLS = ["zip://nothing", "github://x/y", "ftp://127.0.0.1:9/x", "http://127.0.0.1:9/x", "nosuch://x"]


@pytest.mark.parametrize("url", ODD_URLS)
@pytest.mark.parametrize("command", ["list", "classify", "verify"])
def test_no_traceback_for_any_url(command: str, url: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "rollout-checkpoint"), command, url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr + result.stdout
    assert len((result.stdout + result.stderr).strip().splitlines()) == 1, result


@pytest.mark.parametrize("url", ["s3:/bucket/x", "file:/x", "s3:bucket", "memory:/m"])
def test_a_single_slash_scheme_is_refused_not_a_local_folder(url: str, tmp_path: Path) -> None:
    os.chdir(tmp_path)
    result = runner.invoke(app, ["list", url])
    assert result.exit_code == 1 and "needs '://'" in result.output, result.output
    with pytest.raises(StoreError, match="needs '://'"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []  # no folder named 's3:' appeared


def test_a_file_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "afile"
    path.write_text("x")
    result = runner.invoke(app, ["list", str(path)])
    assert result.exit_code == 1 and "is a file, not a store" in result.output


def test_verify_notes_a_missing_latest_pointer(tmp_path: Path) -> None:
    dep = DemoDeployment(LocalStore(tmp_path / "s"))
    dep.populate(2)
    dep.checkpoint()
    dep.close()
    (tmp_path / "s" / "latest.json").unlink()
    result = runner.invoke(app, ["verify", str(tmp_path / "s"), "--json"])
    assert result.exit_code == 0, result.output
    assert "latest.json is missing" in result.output
