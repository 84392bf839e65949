"""When an asynchronous commit's upload starts: at the resume in process, after the resume's
reply over HTTP (``protocol.launches_deferred``), and at once when the deferring block fails."""

from __future__ import annotations

import threading
import time

import pytest

from rollout_checkpoint.protocol import CommitReply, Phase, launches_deferred
from rollout_checkpoint.protocol._publication import Upload, Uploads


def _uploads() -> tuple[Uploads, threading.Event]:
    uploads = Uploads("test", time.time)
    started = threading.Event()

    def work(upload: Upload) -> CommitReply:
        started.set()
        return CommitReply(
            checkpoint_id=upload.checkpoint_id,
            phase=Phase.FROZEN,
            kind="agent",
            instance="a",
            incarnation="0" * 32,
        )

    uploads.register("ck-1", 1, time.time() + 30, work)
    return uploads, started


def test_launch_starts_the_upload_at_once_outside_a_deferring_block() -> None:
    uploads, started = _uploads()
    uploads.launch("ck-1")
    assert started.wait(10)
    assert uploads.collect("ck-1", time.time() + 10).phase is Phase.FROZEN


def test_a_deferring_block_hands_the_start_to_its_caller() -> None:
    uploads, started = _uploads()
    with launches_deferred() as starts:
        uploads.launch("ck-1")
    assert len(starts) == 1
    assert not started.wait(0.2)  # nothing runs until the caller starts it
    starts[0]()
    assert started.wait(10)
    uploads.launch("ck-1")  # launched once: a second launch finds no work
    assert uploads.collect("ck-1", time.time() + 10).phase is Phase.FROZEN


def test_a_failing_deferring_block_starts_what_it_held() -> None:
    uploads, started = _uploads()
    with pytest.raises(RuntimeError), launches_deferred():
        uploads.launch("ck-1")
        raise RuntimeError("the reply could not be built")
    assert started.wait(10)  # never left unstarted


def test_the_deferral_is_per_thread() -> None:
    uploads, started = _uploads()
    with launches_deferred() as starts:
        other = threading.Thread(target=uploads.launch, args=("ck-1",))
        other.start()
        other.join(10)
    assert starts == [] and started.wait(10)  # another thread's launch was not deferred
