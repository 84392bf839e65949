"""Pausing CPython's cycle collector around a bulk build of acyclic objects.

Loading a checkpoint of a million rollouts builds millions of tuples, lists and dicts that all
stay alive. Each time the young generations fill, the collector runs; each time the survivors
grow by a quarter it walks *every* tracked object (a full collection), and finds nothing: the
objects a bulk build makes hold no reference cycles. At a million rollouts those walks took a
third of ``load_checkpoint`` (measured in ``docs/benchmarks.md``). Inside :func:`gc_paused` no
collection runs; the objects made meanwhile are collected as usual afterwards (the first young
collection after the pause walks them once, as it would have).

The pause is process-wide (CPython has one collector): nested and concurrent pauses count, and
the collector is enabled again only when the last one ends, and only if it was enabled when
the first began. Garbage cycles made by other threads meanwhile wait for the end of the pause;
nothing is lost.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the collector was enabled when the outermost pause began


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic cycle collection inside the block (``gc.collect()`` still works)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
