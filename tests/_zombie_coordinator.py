"""A coordinator process that checkpoints in a loop (the zombie of the fencing test).

``python _zombie_coordinator.py STORE_DIR`` prints one line per event: ``published <id>``,
``refused <code>``; its fault hook prints ``at-publish`` and waits a moment just before each
commit point, so the test can stop it (SIGSTOP) right there.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _reference_world import RealWorld
from rollout_checkpoint.errors import CheckpointError
from rollout_checkpoint.store import LocalStore


def main() -> None:
    store = LocalStore(sys.argv[1])
    world = RealWorld(store)

    def hook(step: str) -> None:
        if step == "publish":
            print("at-publish", flush=True)
            time.sleep(0.3)

    world.coordinator.fault_hook = hook
    run = world.start("z")
    world.turn(run, "c1", 1)
    for _ in range(200):
        try:
            outcome = world.coordinator.checkpoint(deadline_s=600)
            print(f"published {outcome.checkpoint_id}", flush=True)
        except CheckpointError as exc:
            print(f"refused {exc.code}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
