"""A multi-worker server's scratch folder never leaks (issue 18, D5): a SIGKILLed ``serve
--workers 2`` leaves its ``rc-workers-*`` folder, and the next server that starts removes it;
a live server's folder is never touched; a server stopped normally removes its own."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _procs import WorkerServer, kill_group
from rollout_checkpoint.errors import InvalidArgumentError
from rollout_checkpoint.server._scratch import (
    LEGACY_GRACE_SECONDS,
    SOCKET_PATH_MAX,
    ScratchFolder,
    scratch_parent,
    sweep_scratch,
)

TOKEN = "tok-scratch-recovery-0123"


def _folders(root: Path) -> list[Path]:
    return sorted(root.glob("rc-workers-*"))


@pytest.fixture()
def short_tmp() -> Iterator[Path]:
    """A temporary directory short enough for socket paths below it (pytest's own, under
    pytest-xdist, can be too long, and then the server would use ``/tmp`` instead)."""
    path = Path(tempfile.mkdtemp(prefix="rc-t-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_temporary_directory_too_long_for_socket_paths_falls_back_to_a_short_one(tmp_path: Path) -> None:
    long = tmp_path / ("x" * SOCKET_PATH_MAX)
    assert scratch_parent(Path("/tmp")) == Path("/tmp")  # short enough: kept
    chosen = scratch_parent(long)
    assert chosen != long and len(str(chosen)) < 20
    folder = ScratchFolder(str(long))  # would fail to bind its sockets below ``long``
    try:
        assert folder.path.parent == chosen
    finally:
        folder.close()


def test_no_short_temporary_directory_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rollout_checkpoint.server._scratch._SHORT_PARENTS", ())
    with pytest.raises(InvalidArgumentError, match="set TMPDIR to a shorter directory"):
        ScratchFolder(str(tmp_path / ("x" * SOCKET_PATH_MAX)))


def test_a_live_folder_is_kept_an_abandoned_one_is_swept(short_tmp: Path) -> None:
    tmp_path = short_tmp
    live = ScratchFolder(str(tmp_path))
    assert live.path.name.startswith("rc-workers-") and (live.path / "owner.lock").exists()
    assert sweep_scratch(tmp_path) == [] and live.path.exists()  # locked by this process
    legacy_old = tmp_path / "rc-workers-legacyold"
    legacy_new = tmp_path / "rc-workers-legacynew"
    legacy_old.mkdir()
    legacy_new.mkdir()
    then = time.time() - 2 * LEGACY_GRACE_SECONDS
    os.utime(legacy_old, (then, then))
    assert sweep_scratch(tmp_path) == [legacy_old]  # no lock file, old and silent: gone
    assert legacy_new.exists()  # no lock file but new: maybe a server being born
    live.close()
    assert not live.path.exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_next_server_removes_a_sigkilled_servers_scratch_folder(tmp_path: Path, short_tmp: Path) -> None:
    scratch = short_tmp
    env = {"TMPDIR": str(scratch)}
    store = tmp_path / "store"
    first = WorkerServer(store, 2, token=TOKEN, env=env)
    [left] = _folders(scratch)
    kill_group(first.proc)  # SIGKILL: the main process and both workers, no cleanup runs
    first.log.close()
    assert _folders(scratch) == [left]  # leaked, as any SIGKILLed server's
    second = WorkerServer(store, 2, token=TOKEN, env=env)
    try:
        [own] = _folders(scratch)
        assert own != left and not left.exists()  # the replacement recovered the space
        assert sweep_scratch(scratch) == [] and own.exists()  # a live server's folder stays
        assert second.status()["workers"] == 2
    finally:
        kill_group(second.proc, signal.SIGTERM)  # a normal stop: it removes its own folder
        second.log.close()
    assert _folders(scratch) == []
