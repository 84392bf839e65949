"""A multi-worker server's scratch folder (its private Unix sockets), recoverable after a SIGKILL.

The main process of ``serve --workers N`` makes ``rc-workers-*`` in the system temporary
directory (``TMPDIR``) and removes it when it stops. A SIGKILLed server cannot: so the folder
holds ``owner.lock``, which the server's main process keeps locked (a shared ``flock``) for its
lifetime, and every server that starts removes the ``rc-workers-*`` folders of its user that no
live process locks any more (the kernel drops a dead process's locks). A folder without the
lock file (an older version's) goes only when nothing answers on its group socket and it is
older than :data:`LEGACY_GRACE_SECONDS`. A new folder is locked under a temporary name and only
then renamed, so a sweeping server never sees it unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from ..errors import InvalidArgumentError

__all__ = [
    "LOCK_NAME",
    "SCRATCH_PREFIX",
    "SOCKET_PATH_MAX",
    "ScratchFolder",
    "scratch_parent",
    "sweep_scratch",
]

log = logging.getLogger(__name__)

SCRATCH_PREFIX = "rc-workers-"
LOCK_NAME = "owner.lock"
LEGACY_GRACE_SECONDS = 60.0
_GROUP_SOCKET = "group.sock"
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107
"""The longest Unix socket path the kernel binds (``sun_path`` holds 104 or 108 bytes, NUL included)."""
_SHORT_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")


def _longest_socket_name() -> int:
    """The longest file name a scratch folder holds a socket under: ``w<pid>.sock``, any pid."""
    try:
        digits = len(Path("/proc/sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        digits = 7
    return max(len(_GROUP_SOCKET), len("w.sock") + digits)


def scratch_parent(parent: str | Path | None = None) -> Path:
    """Where scratch folders go: ``parent`` (default: the temporary directory) if every socket
    path below it fits :data:`SOCKET_PATH_MAX`, else the first short system temporary directory
    that is writable (a long ``TMPDIR``, as under a test runner, would make ``bind`` fail);
    :class:`~rollout_checkpoint.errors.InvalidArgumentError` when there is none."""
    root = Path(parent or tempfile.gettempdir())

    def fits(folder: Path) -> bool:
        # <folder>/rc-workers-<8 random characters from mkdtemp>/<socket name>
        return (
            len(os.fsencode(folder)) + 1 + len(SCRATCH_PREFIX) + 8 + 1 + _longest_socket_name()
            <= SOCKET_PATH_MAX
        )

    if fits(root):
        return root
    for short in _SHORT_PARENTS:
        candidate = Path(short)
        if candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK) and fits(candidate):
            log.info("temporary directory %s is too long for Unix socket paths; using %s", root, candidate)
            return candidate
    raise InvalidArgumentError(
        f"the temporary directory {root} is too long for the server's Unix socket paths "
        f"(at most {SOCKET_PATH_MAX} bytes each); set TMPDIR to a shorter directory"
    )


class ScratchFolder:
    """A new, locked scratch folder (after sweeping abandoned ones); :meth:`close` removes it."""

    def __init__(self, parent: str | None = None) -> None:
        root = scratch_parent(parent)
        self.swept = sweep_scratch(root)
        fresh = Path(tempfile.mkdtemp(prefix="rc-new-", dir=root))
        self._fd = os.open(fresh / LOCK_NAME, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_SH)  # held until this process ends, however it ends
        self.path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=root))
        os.replace(fresh, self.path)  # replaces the empty placeholder: now locked under its name

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def sweep_scratch(parent: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders under ``parent`` (default: the temporary directory) that this
    user owns and no live server holds; returns them."""
    root = Path(parent or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.glob(f"{SCRATCH_PREFIX}*"):
            with contextlib.suppress(OSError):
                info = entry.lstat()
                if not entry.is_dir() or entry.is_symlink() or info.st_uid != os.getuid():
                    continue
                if _abandoned(entry, info.st_mtime):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
    if removed:
        log.info("removed %d scratch folder(s) of servers that are gone", len(removed))
    return removed


def _abandoned(folder: Path, mtime: float) -> bool:
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return time.time() - mtime > LEGACY_GRACE_SECONDS and not _answers(folder / _GROUP_SOCKET)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live server holds it
    finally:
        os.close(fd)  # closing drops the exclusive lock if it was taken
    return True


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True
