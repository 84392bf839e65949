"""Pausing CPython's cycle collector around a bulk build of acyclic objects.

Loading a checkpoint of a million rollouts builds millions of tuples, lists and dicts that all
stay alive. Each time the young generations fill, the collector runs; each time the survivors
grow by a quarter it walks *every* tracked object (a full collection), and finds nothing: the
objects a bulk build makes hold no reference cycles. At a million rollouts those walks took a
third of ``load_checkpoint`` (measured in ``docs/benchmarks.md``). Inside :func:`gc_paused` no
collection runs.

When the pause ends, what it made is aged at once into the oldest generation
(``gc.freeze()`` then ``gc.unfreeze()``: two list splices, no walk), so the collector does not
come back with a young collection over all of it, which would land in the caller's hot path
right after the pause (a checkpoint's reply, the end of a load). Those objects are then walked
only by the next full collection, which would have walked them anyway. This is skipped when
the process keeps objects frozen itself (``gc.get_freeze_count()`` > 0, e.g. a pre-fork server
that froze its start-up objects): ``gc.unfreeze()`` would release those.

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
                if gc.get_freeze_count() == 0:
                    gc.freeze()  # everything tracked to the permanent generation, counts reset
                    gc.unfreeze()  # and back into the oldest generation: aged without a walk
                gc.enable()
