"""Find (and end) processes by a text in their command line or environment: tests that start servers check
that none is left behind, and their fixtures SIGKILL any that is. Servers start in their own process
group (:func:`start_group`), and teardown kills the whole group, workers included, even when the
server's main process died first (a session fixture in ``conftest.py`` kills any group a failed test
left)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line or environment contains ``text`` (not this
    one): uvicorn's worker processes carry the store URL only in their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            seen = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if text.encode() in seen and state != "Z":
                found.append(int(entry.name))
    return found


def kill_mentioning(text: str) -> list[int]:
    """SIGKILL every process :func:`processes_mentioning` ``text``; returns their PIDs."""
    pids = processes_mentioning(text)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


# -- servers in their own process group ---------------------------------------------------------------

_GROUPS: dict[int, subprocess.Popen[bytes]] = {}  # process groups started and not yet killed


def start_group(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``args`` as the leader of a new process group (a ``serve --workers N`` and all its
    workers), remembered until :func:`kill_group` ends the whole group."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(list(args), start_new_session=True, **popen)
    _GROUPS[proc.pid] = proc
    return proc


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL, timeout: float = 30) -> None:
    """Signal every process of ``proc``'s group (its workers too, even when the leader died
    first and they were orphaned) and reap the leader; SIGKILL if ``sig`` did not end it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
    if sig != signal.SIGKILL:  # the leader left: anything of its group still alive goes now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    _GROUPS.pop(proc.pid, None)


@contextlib.contextmanager
def group(args: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """:func:`start_group` whose whole group is SIGKILLed when the block ends, however it ends."""
    proc = start_group(args, **popen)
    try:
        yield proc
    finally:
        kill_group(proc)


def kill_started_groups() -> list[int]:
    """SIGKILL every group :func:`start_group` started that is still remembered (a test that
    failed before its own teardown); returns their leaders' PIDs."""
    left = list(_GROUPS.values())
    for proc in left:
        kill_group(proc)
    return [proc.pid for proc in left]


class WorkerServer:
    """``_serve_main.py BUILD STORE PORT WORKERS`` (``run_server``, the code behind ``serve``) in
    its own process group, started once every worker registered; :meth:`kill` ends the group."""

    def __init__(
        self,
        store: Path,
        workers: int,
        *,
        token: str,
        build: str = "_worker_build:build",
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        import sys

        from conftest import _free_port

        self.token = token
        self.port = _free_port()
        self.log = (store.parent / f"server-{self.port}.log").open("wb")
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_group(
            [
                sys.executable,
                str(Path(__file__).parent / "_serve_main.py"),
                build,
                str(store),
                str(self.port),
                str(workers),
                *args,
            ],
            env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": token, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=self.log,  # a file, not a pipe: a chatty server never blocks on it
        )
        try:
            self.wait_workers(workers)
        except BaseException:
            self.kill()
            raise

    def status(self) -> dict[str, Any]:
        import httpx

        from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX

        response = httpx.get(
            f"{self.url}{CHECKPOINT_ROUTE_PREFIX}/status",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        return dict(response.json()) if response.status_code == 200 else {}

    def wait_workers(self, count: int) -> None:
        import time

        import httpx

        end = time.monotonic() + 180  # a loaded machine may take minutes to start two workers
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if self.status().get("workers") == count:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server did not get {count} workers")

    def kill(self) -> None:
        kill_group(self.proc)
        self.log.close()


@contextlib.contextmanager
def worker_server(store: Path, workers: int = 2, **options: Any) -> Iterator[WorkerServer]:
    server = WorkerServer(store, workers, **options)
    try:
        yield server
    finally:
        server.kill()
