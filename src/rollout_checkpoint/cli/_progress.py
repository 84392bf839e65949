"""Progress of long store work on a terminal: a rich progress bar on stderr.

The commands that read or delete a whole store (``verify``, ``classify --verify``, ``inspect``,
``gc``) run their store through :func:`watched`; the demo reports its steps through
:func:`steps`: on a terminal, and never with ``--json``, a
transient bar shows the bytes read, the requests made and the time spent, refreshed from a
:class:`~rollout_checkpoint.store.CountingStore` by a background thread, so the work itself is
not changed. Anywhere else the store is handed back untouched and nothing is printed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..store import CountingStore, ObjectStore

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["on_terminal", "steps", "watched"]

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


@contextmanager
def steps(description: str, out: Console, *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A ``progress(line)`` callback for work that reports its steps as lines (the demo): the
    lines are printed on ``out`` as always; with ``enabled``, below them a transient bar on the
    same console shows the latest step and the time spent."""
    if not enabled:

        def plain(line: str) -> None:
            out.print(line)

        yield plain
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def shown(line: str) -> None:
            out.print(line)  # above the bar, which stays at the bottom
            step = line.split(":", 1)[0].strip()
            bar.update(task, description=f"{description}: {step[:60]}")

        yield shown
