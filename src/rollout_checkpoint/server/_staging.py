"""The workers' staging areas of a :class:`~._workers.WorkerGroup`, and when their copies go.

Every worker commits into ``<store>/_workers/<worker_id>/`` (a store of its own, at the usual
component keys) and the group merges from there. A staged copy is garbage once the group wrote
the merged archive, and equally once its attempt failed (a failed merge or collection, a worker's
failed commit, an abort): readers never look there and the resume fences the id for good, so no
published checkpoint can need it. Copies are deleted per checkpoint id only (an earlier
checkpoint's upload may still be merging from the same area), after the resume (the deletes never
lengthen the pause), on a background thread, best effort: a failed delete is logged, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..errors import CheckpointError
from ..format import layout
from ..store import ObjectStore, open_store
from ._client import RemoteParticipant

__all__ = ["STAGING_PREFIX", "StagedCopies", "StagingAreas", "drop_staging", "settle_uploads"]

log = logging.getLogger(__name__)

STAGING_PREFIX = "_workers"
"""Worker commits are staged in ``<store>/_workers/<worker_id>/`` (a store of its own, at the
usual component keys) and deleted once the group merged them or the attempt failed (readers
never look there)."""


@dataclass(frozen=True)
class StagedCopies:
    """One checkpoint id's staged copies: the workers' staging store URLs and, for an attempt
    whose workers may still be uploading, ``settle`` (returns once none writes there any more)."""

    checkpoint_id: str
    urls: tuple[str, ...]
    settle: Callable[[], object] | None = None


class StagingAreas:
    """The opened staging stores and the copies waiting for a resume to delete them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[str, ObjectStore] = {}
        self._pending: dict[str, StagedCopies] = {}

    def store(self, url: str) -> ObjectStore:
        """A worker's staging store, opened once (an S3 store builds a client when opened)."""
        with self._lock:
            opened = self._stores.get(url)
            if opened is None:
                opened = self._stores[url] = open_store(url)
            return opened

    def defer(self, copies: StagedCopies) -> None:
        """Keep ``copies`` until the next resume takes them (:meth:`take`)."""
        with self._lock:
            self._pending[copies.checkpoint_id] = copies

    def keep(self, checkpoint_id: str) -> None:
        """Withdraw a deferred drop: a repeated commit of ``checkpoint_id`` succeeded, and its
        upload reads the staging after the resume (it drops the copies itself)."""
        with self._lock:
            self._pending.pop(checkpoint_id, None)

    def take(self) -> list[StagedCopies]:
        """Every deferred copy: the resumed checkpoint's, and any left by one never resumed."""
        with self._lock:
            taken = list(self._pending.values())
            self._pending.clear()
            return taken

    def drop_later(self, copies: Iterable[StagedCopies]) -> None:
        """Delete ``copies`` on a background thread (never raises: cleanup must not mask the
        error or the answer of the operation that calls it)."""
        batch = list(copies)
        if not batch:
            return
        try:
            threading.Thread(target=self.drop, args=(batch,), name="drop-staging", daemon=True).start()
        except RuntimeError as exc:  # no thread to spare: the copies stay, only wasted space
            log.warning("staged copies of %s kept: %s", [c.checkpoint_id for c in batch], exc)

    def drop(self, copies: Iterable[StagedCopies]) -> None:
        """Delete ``copies`` now (each after its ``settle``), best effort."""
        for staged in copies:
            if staged.settle is not None:
                try:
                    staged.settle()
                except Exception as exc:  # the workers' uploads ended one way or another
                    log.debug("settling the staging of %s: %s", staged.checkpoint_id, exc)
            for url in staged.urls:
                try:
                    store = self.store(url)
                except (CheckpointError, OSError, ValueError) as exc:
                    log.warning("could not open staging %s to drop %s: %s", url, staged.checkpoint_id, exc)
                    continue
                drop_staging(store, staged.checkpoint_id)


def drop_staging(staging: ObjectStore, checkpoint_id: str) -> None:
    """Delete everything one worker staged for ``checkpoint_id`` (and nothing of another id);
    best effort: a failure is logged and the rest is left as wasted space."""
    try:
        for info in staging.list(layout.checkpoint_prefix(checkpoint_id) + "/"):
            staging.delete(info.key)
    except (CheckpointError, OSError) as exc:
        log.warning("could not drop the staging of %s in %s: %s", checkpoint_id, staging.url, exc)


def settle_uploads(workers: Sequence[RemoteParticipant], checkpoint_id: str, deadline: float) -> None:
    """Wait (until ``deadline``) for every worker's upload of ``checkpoint_id`` to end, however it
    ends (a worker that never froze it answers ``publication_unknown`` at once)."""
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.collect(checkpoint_id, deadline)
