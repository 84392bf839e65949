"""Subprocess side of ``test_crash_subprocess.py``: runs a checkpoint cycle against a local
directory store and SIGKILLs itself at step k (no cleanup, no ``finally``, no atexit).

Usage::

    python tests/_crash_worker.py DIR baseline        # publish the baseline checkpoint
    python tests/_crash_worker.py DIR steps           # print the cycle's step names (JSON)
    python tests/_crash_worker.py DIR crash K CID     # run cycle CID, SIGKILL before step K
    python tests/_crash_worker.py DIR recover         # fresh process: restore latest, resume, checkpoint
    python tests/_crash_worker.py DIR async-steps     # an asynchronous cycle's step patterns (JSON)
    python tests/_crash_worker.py DIR async-crash PATTERN CID  # async cycle CID, SIGKILL at PATTERN
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading

from _protocol_fakes import Deployment, FakeTokens, populate
from rollout_checkpoint.store import LocalStore


def _deployment(root: str) -> Deployment:
    store = LocalStore(root, fsync=False)
    # each mode runs in a fresh process over the same run: the same participants, rebuilt
    return Deployment(store, token_source=FakeTokens(store), stable_incarnations=True)


def _pattern(step: str) -> str:
    """A step name without the writer's random object names."""
    return re.sub(r"[0-9a-f]{32}", "*", step)


def main(argv: list[str]) -> int:
    root, mode = argv[0], argv[1]
    dep = _deployment(root)
    try:
        return _run(dep, mode, argv)
    finally:
        dep.close()  # stop lease timer threads before the interpreter exits
        for thread in threading.enumerate():
            if thread is not threading.main_thread():
                thread.join(timeout=2)


def _run(dep: Deployment, mode: str, argv: list[str]) -> int:
    if mode == "baseline":
        populate(dep, dep.coordinator.token_source, queued=False)
        print(json.dumps({"checkpoint_id": dep.coordinator.checkpoint("ck-baseline").checkpoint_id}))
        return 0
    if mode == "steps":
        populate(dep, dep.coordinator.token_source, queued=False)
        steps: list[str] = []
        dep.coordinator.fault_hook = steps.append
        dep.coordinator.checkpoint("ck-steps")
        print(json.dumps(steps))
        return 0
    if mode == "crash":
        k, cid = int(argv[2]), argv[3]
        populate(dep, dep.coordinator.token_source, queued=False)
        seen = [0]

        def hook(step: str) -> None:
            if seen[0] == k:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            seen[0] += 1

        dep.coordinator.fault_hook = hook
        dep.coordinator.checkpoint(cid)
        return 3  # the step was never reached
    if mode in ("incremental-steps", "incremental-crash"):
        # a first checkpoint in this process, then the one observed: incremental (format 2),
        # it refers into the first one's archives
        populate(dep, dep.coordinator.token_source, queued=False)
        dep.coordinator.checkpoint("ck-first")
        if mode == "incremental-steps":
            observed: list[str] = []
            dep.coordinator.fault_hook = observed.append
            dep.coordinator.checkpoint("ck-steps")
            print(json.dumps(observed))
            return 0
        k, cid = int(argv[2]), argv[3]
        count = [0]

        def kill(step: str) -> None:
            if count[0] == k:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            count[0] += 1

        dep.coordinator.fault_hook = kill
        dep.coordinator.checkpoint(cid)
        return 3  # the step was never reached
    if mode == "async-steps":
        populate(dep, dep.coordinator.token_source, queued=False)
        patterns: list[str] = []
        lock = threading.Lock()

        def record(step: str) -> None:
            with lock:
                patterns.append(_pattern(step))

        dep.coordinator.fault_hook = record
        dep.coordinator.checkpoint("ck-steps", publication="async")
        print(json.dumps(list(dict.fromkeys(patterns))))
        return 0
    if mode == "async-crash":
        pattern, cid = argv[2], argv[3]
        populate(dep, dep.coordinator.token_source, queued=False)

        reported = threading.Event()

        def kill_at(step: str) -> None:
            if _pattern(step) == pattern.replace("ck-steps", cid):
                if not step.startswith(("open_write:", "put:", "put_if_absent:")):
                    reported.wait(30)  # the coordinator's own steps: after the resume was seen
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        dep.coordinator.fault_hook = kill_at
        handle = dep.coordinator.checkpoint_async(cid)
        print(json.dumps({"resumed": dep.all_open()}), flush=True)  # before the upload ended
        reported.set()
        handle.result(timeout=60)
        return 3  # the step was never reached
    if mode == "recover":
        restored = dep.coordinator.restore()
        dep.coordinator.resume(restored.restore_id)
        after = dep.coordinator.checkpoint()
        print(
            json.dumps(
                {
                    "restored_from": restored.source_checkpoint_id,
                    "checkpoint_id": after.checkpoint_id,
                    "clean": after.clean,
                    "open": dep.all_open(),
                    "registry": {e.rollout_id: [e.attempt, e.state] for e in dep.registry.executions()},
                }
            )
        )
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
