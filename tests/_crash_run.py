"""Run ``_crash_worker.py`` in a process of its own (the crash tests' one way to start it).

Each run is a new process forked from ``_crash_forkserver.py``, which imported the worker's
modules once: a run starts with no SDK state, as ``python _crash_worker.py ARGS`` would, and
ends the same way (its own SIGKILL, or ``sys.exit`` through the interpreter's finalization),
without paying the imports (about 0.7 s a process, two processes per crash case).
"""

from __future__ import annotations

import atexit
import json
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = Path(__file__).with_name("_crash_forkserver.py")
TIMEOUT_S = 120

_lock = threading.Lock()
_server: subprocess.Popen[str] | None = None


def _stop() -> None:
    global _server
    server, _server = _server, None
    if server is not None and server.poll() is None:
        assert server.stdin is not None
        server.stdin.close()  # the server ends when its stdin closes
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _fork_server() -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        if _server is None:
            atexit.register(_stop)
        _server = subprocess.Popen(
            [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    return _server


def _run(args: tuple[str, ...]) -> tuple[int, str, str]:
    with _lock, tempfile.TemporaryDirectory(prefix="crash-run-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        server = _fork_server()
        assert server.stdin is not None and server.stdout is not None
        request = {"args": list(args), "stdout": str(out), "stderr": str(err), "timeout": TIMEOUT_S}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"the crash fork server ended (exit code {server.wait()})")
        reply = json.loads(line)
        stdout, stderr = out.read_text(), err.read_text()
    if reply["timed_out"]:
        raise TimeoutError(f"worker {args} still ran after {TIMEOUT_S} s: {stderr}")
    return int(reply["returncode"]), stdout, stderr


def run_worker(*args: str, expect_kill: bool = False) -> str:
    """The worker's stdout; it must exit 0, or die by SIGKILL when ``expect_kill``."""
    returncode, stdout, stderr = _run(args)
    if expect_kill:
        assert returncode == -signal.SIGKILL, (returncode, stdout, stderr)
    else:
        assert returncode == 0, (returncode, stderr)
    return stdout
