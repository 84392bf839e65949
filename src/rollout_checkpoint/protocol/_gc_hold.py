"""Hold Python's cyclic garbage collector off while a checkpoint's freeze runs.

A freeze allocates (the export's snapshot lists, the reply); each allocation counts towards
the collector's thresholds, and a collection that starts then (a full one walks every tracked
object of a process holding 100,000 live rollouts: seconds) lands inside the pause. While any
thread of the process is inside :func:`gc_held`, automatic collection is off; the last one out
turns it back on if it was on, and the next allocation collects as usual, after the pause.
Reference counting still frees everything that is not in a cycle meanwhile.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_held"]

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def gc_held() -> Iterator[None]:
    """Automatic garbage collection off for the duration (nested and concurrent uses count)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
