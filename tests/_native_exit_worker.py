"""Subprocess side of ``test_native_exit.py``: reads token shards through the SDK from a store
whose streams record which thread calls them, then exits at once (no cleanup).

A stream released by a thread other than the main one sleeps in its finalizer (standing in for a
native thread that a loaded machine has not scheduled yet), so the interpreter finalizes while
that thread still owes the GIL a call. Reads stop at the first such release.

Usage::

    python tests/_native_exit_worker.py DIR READS
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, BinaryIO

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


def main(root: str, reads: int) -> int:
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
    for done in range(1, reads + 1):  # noqa: B007 - the count is reported
        tokens = ObjectStoreTokenStore(RecordingStore(store))
        assert tokens.get(entry.key) == entry  # an index read and a row read, both Parquet
        if released_elsewhere.is_set():
            break
    report = {"reads": done, "released_elsewhere": released_elsewhere.is_set(), "callers": sorted(callers)}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
