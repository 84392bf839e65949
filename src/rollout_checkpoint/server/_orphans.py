"""No orphan keeps a port: a process that must not outlive another one dies with it.

A ``serve --workers N`` server's workers share its port; SIGKILL their main process and,
left alone, they go on serving it, so a replacement fails with ``Address already in use``.
:func:`exit_with` makes the calling process SIGKILL itself once the watched process is gone:

* on Linux, when the watched process is the parent, the kernel's parent-death signal
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, through :mod:`ctypes`) ends it at once;
* everywhere, a daemon thread checks every :data:`WATCH_INTERVAL_S` (the parent changed, or the
  watched process no longer exists), which also covers other systems and a watched process
  that is not the parent (a grandparent, say ``demo`` watched by a server's workers).

A process started with :data:`EXIT_WITH_ENV` set to a PID watches it (:func:`exit_with_env`):
``demo`` sets it for the servers and coordinator it starts, so a SIGKILLed ``demo`` leaves
nothing running. Dying by SIGKILL is safe here: whatever such a process held in memory was
already lost with its main process (the worker group, the demo's coordinator), and the next
server removes the scratch folder it leaves.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time

__all__ = ["EXIT_WITH_ENV", "WATCH_INTERVAL_S", "exit_with", "exit_with_env"]

log = logging.getLogger(__name__)

EXIT_WITH_ENV = "ROLLOUT_CHECKPOINT_EXIT_WITH_PID"
"""A PID: the process started with it dies (SIGKILL) within about a second of that process."""

WATCH_INTERVAL_S = 0.25
"""How often the watch thread looks (a death is noticed within this, well under 2 s)."""

_PR_SET_PDEATHSIG = 1
_watched: set[int] = set()
_lock = threading.Lock()


def exit_with(pid: int) -> None:
    """SIGKILL this process as soon as process ``pid`` is gone (see the module docstring).
    Idempotent per PID; a ``pid`` that is already gone ends this process now."""
    with _lock:
        if pid in _watched:
            return
        _watched.add(pid)
    parent = pid == os.getppid()
    if parent and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if _gone(pid, parent):  # it died before the signal was asked for
        _die(pid)
    threading.Thread(target=_watch, args=(pid, parent), name=f"exit-with-{pid}", daemon=True).start()


def exit_with_env() -> None:
    """:func:`exit_with` the PID in :data:`EXIT_WITH_ENV`, when it is set (and a number)."""
    value = os.environ.get(EXIT_WITH_ENV, "").strip()
    if value.isdigit() and int(value) > 1:
        exit_with(int(value))


def _gone(pid: int, parent: bool) -> bool:
    if parent:
        return os.getppid() != pid  # reparented: the parent died
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    # Linux: a zombie is dead, only not reaped yet
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    return False


def _watch(pid: int, parent: bool) -> None:
    while not _gone(pid, parent):
        time.sleep(WATCH_INTERVAL_S)
    _die(pid)


def _die(pid: int) -> None:
    log.warning("process %d is gone: exiting with it", pid)
    os.kill(os.getpid(), signal.SIGKILL)
