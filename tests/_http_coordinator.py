"""A coordinator process over remote participants, SIGKILLed at one step of its cycle.

Usage: python _http_coordinator.py STORE CHECKPOINT_ID KILL_STEP URL [URL ...]
(token from ROLLOUT_CHECKPOINT_TOKEN)."""

from __future__ import annotations

import os
import signal
import sys

from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import RemoteParticipant


def main() -> None:
    store, checkpoint_id, kill_step, *urls = sys.argv[1:]
    token = os.environ["ROLLOUT_CHECKPOINT_TOKEN"]
    remotes = [RemoteParticipant(url, token=token) for url in urls]

    def hook(step: str) -> None:
        if step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    Coordinator(store, remotes, LiveExecutionRegistry(), fault_hook=hook, run_id="test-run").checkpoint(
        checkpoint_id, deadline_s=60
    )


if __name__ == "__main__":
    main()
