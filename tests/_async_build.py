"""The counter build of ``_worker_build``, whose uploads can be held: while the file named by
``ROLLOUT_TEST_UPLOAD_HOLD`` exists, every commit's upload waits at its first fencing check
(after touching ``held-<pid>`` next to it, so a test knows the upload started and is held)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import _worker_build
from rollout_checkpoint.participants import ResourcesParticipant

HOLD_ENV = "ROLLOUT_TEST_UPLOAD_HOLD"


class HeldResources(ResourcesParticipant):
    def _check_still_active(self, checkpoint_id: str, generation: int, deadline: float, op: str) -> None:
        hold = os.environ.get(HOLD_ENV)
        if op == "commit" and hold and Path(hold).exists():
            (Path(hold).parent / f"held-{os.getpid()}").touch()
            end = time.monotonic() + 60
            while Path(hold).exists() and time.monotonic() < end:
                time.sleep(0.02)
        super()._check_still_active(checkpoint_id, generation, deadline, op)


_worker_build.ResourcesParticipant = HeldResources  # type: ignore[misc]
build = _worker_build.build
