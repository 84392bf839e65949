"""Run ``_crash_worker.py`` in a fresh interpreter (the crash tests' one way to start it)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("_crash_worker.py")


def run_worker(*args: str, expect_kill: bool = False) -> str:
    """The worker's stdout; it must exit 0, or die by SIGKILL when ``expect_kill``."""
    proc = subprocess.run(
        [sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if expect_kill:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    else:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout
