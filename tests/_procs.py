"""Find (and end) processes by a text in their command line or environment: tests that start servers check
that none is left behind, and their fixtures SIGKILL any that is."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


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
