"""Fork server of the crash tests: imports ``_crash_worker`` (the SDK, pyarrow, pydantic) once,
then forks one process per request. The child runs ``_crash_worker.main`` with the request's
arguments and ends the way ``python _crash_worker.py ARGS`` does: killed by its own SIGKILL, or
through ``sys.exit`` and the interpreter's normal finalization (atexit, thread joins, native
destructors), so an abort at exit still shows. It shares the imported modules only: no SDK
object, thread or file exists in the server when it forks.

Protocol, one JSON object a line. Request on stdin: ``{"args": [...], "stdout": path,
"stderr": path, "timeout": seconds}``; the child's output goes to the two files. Reply on
stdout: ``{"returncode": n}``, negative when a signal ended the child (as ``subprocess``
reports it); a child still running at its timeout is SIGKILLed and reported ``"timed_out"``.
The server ends when stdin closes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import _crash_worker


def _serve() -> dict[str, Any] | None:
    """Answer requests until stdin closes (None); in a forked child, its request."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return dict(request)
        deadline = time.monotonic() + float(request["timeout"])
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if not timed_out and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                timed_out = True
            time.sleep(0.002)
        reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return None


def _redirect(path: str, fd: int, flags: int) -> None:
    opened = os.open(path, flags, 0o600)
    os.dup2(opened, fd)
    os.close(opened)


request = _serve()
if request is not None:  # the child: its own stdin/stdout/stderr, then the worker
    _redirect(os.devnull, 0, os.O_RDONLY)
    _redirect(request["stdout"], 1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    _redirect(request["stderr"], 2, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.argv = [_crash_worker.__file__, *request["args"]]
    sys.exit(_crash_worker.main(request["args"]))
