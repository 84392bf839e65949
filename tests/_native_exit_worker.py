"""Subprocess side of ``test_native_exit.py``: processes that exit while the SDK's work may
still be winding down on other threads, with no cleanup.

``reads`` reads token shards through the SDK from a store whose streams record which thread
calls them. A stream released by a thread other than the main one sleeps in its finalizer
(standing in for a native thread that a loaded machine has not scheduled yet), so the
interpreter finalizes while that thread still owes the GIL a call. Reads stop at the first such
release. ``upload`` starts an asynchronous commit's background upload and exits at once (a
served participant stopped while it uploads).

Usage::

    python tests/_native_exit_worker.py DIR reads COUNT
    python tests/_native_exit_worker.py DIR upload RECORDS
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from _protocol_fakes import ScriptedParticipant
from rollout_checkpoint.format import layout
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.store import DelegatingStore, LocalStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore, TokenEntry

released_elsewhere = threading.Event()
callers: set[str] = set()


class Stream:
    """A store stream that notes the thread of every call pyarrow makes on it."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        callers.add(threading.current_thread().name)
        return getattr(self._inner, name)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()

    def __del__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            released_elsewhere.set()
            time.sleep(0.5)


class RecordingStore(DelegatingStore):
    def open_read(self, key: str) -> BinaryIO:
        return Stream(self.inner.open_read(key))  # type: ignore[return-value]


def reads(root: str, count: int) -> int:
    store = LocalStore(root, fsync=False)
    entry = TokenEntry(
        rollout_id="r1",
        attempt=0,
        call_id="c1",
        prompt_token_ids=[1, 2, 3],
        generation_token_ids=[4, 5],
        generation_log_probs=[-0.1, -0.2],
        mask=[1, 1],
    )
    ObjectStoreTokenStore(store).put(entry)
    done = 0
    for done in range(1, count + 1):  # noqa: B007 - the count is reported
        tokens = ObjectStoreTokenStore(RecordingStore(store))
        assert tokens.get(entry.key) == entry  # an index read and a row read, both Parquet
        if released_elsewhere.is_set():
            break
    report = {"reads": done, "released_elsewhere": released_elsewhere.is_set(), "callers": sorted(callers)}
    print(json.dumps(report), flush=True)
    return 0


def upload(root: str, records: int) -> int:
    """Leave while the upload of ``ck-exit`` writes its first shard (its thread and the encoder's)."""
    participant = ScriptedParticipant("agent", "agent-0")
    for i in range(records):
        participant.add(
            AgentBoundaryRecord(
                rollout_id=f"r{i}",
                attempt=0,
                boundary_index=1,
                turn_index=1,
                last_model_call_id="c1",
                resource_revisions={"res-0": {"s1": 3}},
                agent_state=bytes(range(256)) * 8,
            )
        )
    deadline = time.time() + 60
    participant.prepare("ck-exit", deadline)
    participant.commit("ck-exit", LocalStore(root, fsync=False), deadline, publication="async")
    participant.resume("ck-exit", deadline)  # launches the upload
    shards = Path(root, layout.component_prefix("ck-exit", "agent", "agent-0"), "shards")
    while not any(shards.glob("*")) and time.time() < deadline:  # until it writes its archive
        time.sleep(0.001)
    print(json.dumps({"uploading": _uploads()}), flush=True)
    # atexit handlers run after the interpreter joined its non-daemon threads, before it finalizes
    atexit.register(lambda: print(json.dumps({"uploading_at_finalization": _uploads()}), flush=True))
    return 0


def _uploads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("upload-"))


if __name__ == "__main__":
    root, mode, number = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.exit(reads(root, number) if mode == "reads" else upload(root, number))
