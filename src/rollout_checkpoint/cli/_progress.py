"""Progress of long store work on a terminal: a rich progress bar on stderr.

The commands that read or delete a whole store (``verify``, ``classify --verify``, ``inspect``,
``gc``) run their store through :func:`watched`: on a terminal, and never with ``--json``, a
transient bar shows the bytes read, the requests made and the time spent, refreshed from a
:class:`~rollout_checkpoint.store.CountingStore` by a background thread, so the work itself is
not changed. Anywhere else the store is handed back untouched and nothing is printed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..store import CountingStore, ObjectStore

__all__ = ["on_terminal", "watched"]

_REFRESH_S = 0.1


def on_terminal(as_json: bool) -> bool:
    """Whether a progress bar may be drawn: a human at a terminal, not a JSON consumer."""
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def watched(store: ObjectStore, description: str, *, enabled: bool) -> Iterator[ObjectStore]:
    """``store``, with a progress bar of what goes through it while the block runs (``enabled``)."""
    if not enabled:
        yield store
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from ._common import console

    counting = CountingStore(store)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[requests]} requests"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None, requests=0)
        done = threading.Event()

        def refresh() -> None:
            while not done.wait(_REFRESH_S):
                bar.update(task, completed=counting.bytes_read, requests=sum(counting.requests.values()))

        updater = threading.Thread(target=refresh, name="cli-progress", daemon=True)
        updater.start()
        try:
            yield counting
        finally:
            done.set()
            updater.join()
