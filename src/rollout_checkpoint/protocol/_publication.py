"""Background uploads of asynchronous commits (``publication="async"``).

An asynchronous commit freezes its export under the participant's lock and registers the upload
with :class:`Uploads`; the resume launches it on a thread of its own (encoding and upload run
after the resume, so they never compete with the pause for the interpreter). It ends when the
manifest is written, when it fails, or when it is cancelled (a lease expiry before the resume:
the coordinator vanished, and the upload never starts). ``collect`` waits for it.

Over HTTP the upload starts only once the resume's reply is on its way
(:func:`launches_deferred`): started inside the resume, six uploads on a two-core host took the
CPU the last resumes needed, and the pause of 100,000 live rollouts grew by a third.

Fencing: an upload is bound to its checkpoint id and to the generation it froze in; it writes
only under that checkpoint's own prefix, its manifest create-only, and only before its deadline.
A cancelled or failed upload writes no manifest, so nothing of it can ever be published.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import CheckpointError, DeadlineExceededError, StaleCheckpointError
from ..telemetry import log_fields
from ._types import CommitReply, PublicationFailedError, PublicationUnknownError

__all__ = ["UPLOADS_KEPT", "Upload", "Uploads", "launches_deferred"]

log = logging.getLogger(__name__)

UPLOADS_KEPT = 8
"""Finished uploads whose answer is kept for a repeated ``collect`` (a lost answer)."""

_deferred: ContextVar[list[Callable[[], None]] | None] = ContextVar("rc_deferred_launches", default=None)


@contextmanager
def launches_deferred() -> Iterator[list[Callable[[], None]]]:
    """Inside the block, :meth:`Uploads.launch` (on this thread or context) hands the start of
    its upload to the list it yields instead of starting it: the caller starts them once its
    reply is sent (a server's resume route). When the block raises, they start at once, so an
    upload is never left unstarted."""
    starts: list[Callable[[], None]] = []
    token = _deferred.set(starts)
    try:
        yield starts
    except BaseException:
        for start in starts:
            start()
        starts.clear()
        raise
    finally:
        _deferred.reset(token)


class Upload:
    """One background upload: its fence (checkpoint id, generation, deadline) and its outcome."""

    def __init__(self, checkpoint_id: str, generation: int, deadline: float) -> None:
        self.checkpoint_id = checkpoint_id
        self.generation = generation
        self.deadline = deadline
        self.cancelled = False
        # The manifest write is decided under this lock, not the participant's: the participant
        # keeps taking work while the upload finalizes its archive.
        self.lock = threading.Condition()
        self.done = threading.Event()
        self.reply: CommitReply | None = None
        self.error: BaseException | None = None
        self.work: Callable[[Upload], CommitReply] | None = None  # until launched

    def check(self) -> None:
        """Raise if the upload may no longer write its manifest (called by the writer)."""
        if self.cancelled:
            raise StaleCheckpointError(
                f"upload of {self.checkpoint_id} was cancelled (the lease expired before the resume); "
                "nothing was published",
                checkpoint_id=self.checkpoint_id,
            )


class Uploads:
    """The uploads of one participant (or one worker group), newest last; thread-safe."""

    def __init__(self, name: str, clock: Callable[[], float], kept: int = UPLOADS_KEPT) -> None:
        self._name = name
        self._clock = clock
        self._kept = kept
        self._lock = threading.Condition()
        self._uploads: OrderedDict[str, Upload] = OrderedDict()

    def get(self, checkpoint_id: str) -> Upload | None:
        with self._lock:
            return self._uploads.get(checkpoint_id)

    def running(self) -> tuple[str, ...]:
        with self._lock:
            self._reap()
            return tuple(cid for cid, u in self._uploads.items() if not u.done.is_set())

    def _reap(self) -> None:
        """End every upload never launched by its deadline (no resume came: the coordinator is
        gone, and a holder without a lease, such as a worker group, would wait for it forever)."""
        now = self._clock()
        for upload in self._uploads.values():
            if upload.work is not None and now >= upload.deadline:
                upload.work = None
                upload.error = DeadlineExceededError(
                    f"{self._name}: the upload of {upload.checkpoint_id} was never started (no resume "
                    "before its deadline)",
                    checkpoint_id=upload.checkpoint_id,
                )
                upload.done.set()
                self._lock.notify_all()

    def register(
        self, checkpoint_id: str, generation: int, deadline: float, work: Callable[[Upload], CommitReply]
    ) -> Upload:
        """Keep ``work(upload)`` for :meth:`launch`; its reply or error is kept for :meth:`collect`."""
        upload = Upload(checkpoint_id, generation, deadline)
        upload.work = work
        with self._lock:
            self._uploads.pop(checkpoint_id, None)
            self._uploads[checkpoint_id] = upload
            while len(self._uploads) > self._kept:
                oldest = next(iter(self._uploads.values()))
                if not oldest.done.is_set():
                    break
                self._uploads.popitem(last=False)
        return upload

    def launch(self, checkpoint_id: str) -> None:
        """Start the registered upload of ``checkpoint_id`` on its own thread (once)."""
        with self._lock:
            upload = self._uploads.get(checkpoint_id)
            if upload is None or upload.work is None:
                return
            work, upload.work = upload.work, None

        def run() -> None:
            try:
                upload.reply = work(upload)
            except BaseException as exc:
                upload.error = exc
                log.warning(
                    "%s: upload of %s failed: %s",
                    self._name,
                    checkpoint_id,
                    exc,
                    extra=log_fields(checkpoint_id, self._name, getattr(exc, "code", None)),
                )
            finally:
                with self._lock:
                    upload.done.set()
                    self._lock.notify_all()

        # Not a daemon: the interpreter joins it before it finalizes. A daemon thread still in
        # pyarrow then is ended inside native code, which can abort the process at exit; this
        # one ends when its archive does, or at its next row group once the encoder pool refuses
        # work at interpreter shutdown (the upload fails: no manifest, nothing published).
        thread = threading.Thread(target=run, name=f"upload-{self._name}-{checkpoint_id}", daemon=False)
        deferred = _deferred.get()
        if deferred is None:
            thread.start()
        else:
            deferred.append(thread.start)

    def cancel(self, checkpoint_id: str) -> None:
        """Void the upload (its manifest is never written); it stops at its next record."""
        with self._lock:
            upload = self._uploads.get(checkpoint_id)
            if upload is None or upload.done.is_set():
                return
            upload.cancelled = True
            if upload.work is not None:  # never launched: it ends here
                upload.work = None
                try:
                    upload.check()
                except StaleCheckpointError as exc:
                    upload.error = exc
                upload.done.set()
                self._lock.notify_all()

    def wait_others(self, checkpoint_id: str, deadline: float) -> None:
        """Wait until no upload of another checkpoint runs (one upload in flight at a time, the
        way Orbax waits for the previous save); ``deadline_exceeded`` if one still runs then."""
        with self._lock:
            while True:
                self._reap()
                busy = [u for cid, u in self._uploads.items() if cid != checkpoint_id and not u.done.is_set()]
                if not busy:
                    return
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise DeadlineExceededError(
                        f"{self._name}: the upload of {busy[0].checkpoint_id} still runs at the deadline "
                        f"of {checkpoint_id}",
                        checkpoint_id=checkpoint_id,
                        uploading=busy[0].checkpoint_id,
                    )
                self._lock.wait(min(remaining, 1.0))

    def collect(self, checkpoint_id: str, deadline: float) -> CommitReply:
        """The committed reply of ``checkpoint_id``'s upload, once it ended (until ``deadline``).

        A failed upload is ``publication_failed`` (``cause`` = the original code), every time
        it is asked: a repeat after a lost answer gets the same answer."""
        with self._lock:
            self._reap()
            upload = self._uploads.get(checkpoint_id)
        if upload is None:
            raise PublicationUnknownError(
                f"{self._name}: no upload of {checkpoint_id} here (never frozen here, or this process "
                "restarted since); nothing of it can be published",
                checkpoint_id=checkpoint_id,
            )
        remaining = deadline - self._clock()
        if not upload.done.wait(max(0.0, remaining)):
            raise DeadlineExceededError(
                f"{self._name}: the upload of {checkpoint_id} still runs at the deadline",
                checkpoint_id=checkpoint_id,
            )
        if upload.error is not None:
            cause = upload.error.code if isinstance(upload.error, CheckpointError) else "internal_error"
            raise PublicationFailedError(
                f"{self._name}: the upload of {checkpoint_id} failed: {upload.error}",
                checkpoint_id=checkpoint_id,
                cause=cause,
            ) from upload.error
        assert upload.reply is not None
        return upload.reply
