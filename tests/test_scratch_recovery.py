"""A multi-worker server's scratch folder never leaks (issue 18, D5): a SIGKILLed ``serve
--workers 2`` leaves its ``rc-workers-*`` folder, and the next server that starts removes it;
a live server's folder is never touched; a server stopped normally removes its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from _procs import WorkerServer, kill_group
from rollout_checkpoint.server._scratch import LEGACY_GRACE_SECONDS, ScratchFolder, sweep_scratch

TOKEN = "tok-scratch-recovery-0123"


def _folders(root: Path) -> list[Path]:
    return sorted(root.glob("rc-workers-*"))


def test_a_live_folder_is_kept_an_abandoned_one_is_swept(tmp_path: Path) -> None:
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
def test_the_next_server_removes_a_sigkilled_servers_scratch_folder(tmp_path: Path) -> None:
    scratch = tmp_path / "t"
    scratch.mkdir()
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
