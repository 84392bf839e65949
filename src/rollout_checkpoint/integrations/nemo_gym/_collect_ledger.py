"""The collection's side of the registry: which attempt each Gym row runs as, and when its
result is handed off.

* A row's rollout id is its ``_ng_rollout_id``, else ``<_ng_task_index>-<_ng_rollout_index>``
  (the id Gym derives itself); its attempt is the registry's (0, or N+1 after a restore).
* :class:`OutputTail` reads the rows Gym appended to the output JSONL (complete lines only) and
  makes them durable (``fsync``) before the ledger hands them off: a row is handed off only once
  it is in the output, so the output and the checkpoints never disagree about a completed row.
* :meth:`CollectionLedger.reconcile` runs once after a restore, before any row is dispatched: it
  completes in the registry every row already in the output, retires everywhere the attempts a
  crashed collector may have left running (rows sent after the last checkpoint), and leaves each
  other row at the attempt it will be sent as.
* Every handed-off attempt is retired at the servers before the next checkpoint
  (:meth:`CollectionLedger.take_handed_off`): a finished simple-agent rollout's tool session
  stays live otherwise, and a restore refuses a participant that holds live attempts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from ...errors import AdmissionClosedError, InvalidArgumentError, StaleAttemptError
from ...ids import ExecutionId, validate_id
from ...registry import LiveExecutionRegistry

__all__ = ["ATTEMPT_KEY", "ROLLOUT_ID_KEY", "CollectionLedger", "OutputTail", "row_rollout_id"]

log = logging.getLogger("rollout_checkpoint.integrations.nemo_gym.collect")

ROLLOUT_ID_KEY = "_ng_rollout_id"
ATTEMPT_KEY = "_ng_attempt_index"
TASK_KEY = "_ng_task_index"
INDEX_KEY = "_ng_rollout_index"
_LIVE = ("queued", "running", "finished")
_DONE = ("handed_off", "consumed")


def row_rollout_id(row: Mapping[str, Any]) -> str:
    """The rollout id of a Gym row (validated: it becomes part of object keys)."""
    explicit = row.get(ROLLOUT_ID_KEY)
    if explicit is not None:
        return validate_id(str(explicit), ROLLOUT_ID_KEY)
    if TASK_KEY not in row or INDEX_KEY not in row:
        raise InvalidArgumentError(
            f"a Gym row without {ROLLOUT_ID_KEY} or {TASK_KEY}/{INDEX_KEY}: {sorted(row)}"
        )
    return validate_id(f"{row[TASK_KEY]}-{row[INDEX_KEY]}", "rollout id")


def _reward(row: Mapping[str, Any]) -> float | None:
    value = row.get("reward")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class OutputTail:
    """Complete lines appended to a JSONL file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
                end = data.rfind(b"\n") + 1
                if end:
                    os.fsync(f.fileno())  # the rows are durable before anyone hands them off
        except FileNotFoundError:
            return []
        rows = []
        for line in data[:end].splitlines():
            if line.strip():
                rows.append(orjson.loads(line))
        self.offset += end
        return rows


class CollectionLedger:
    """Registry transitions of the rows one collection sends (thread-safe: the registry is)."""

    def __init__(self, registry: LiveExecutionRegistry, output: Path) -> None:
        self.registry = registry
        self.tail = OutputTail(output)
        self._lock = threading.Lock()
        self.handed_off = 0
        self._to_retire: list[ExecutionId] = []

    # -- stamping and sending -------------------------------------------------------------------
    def attempt_for(self, rollout_id: str) -> int:
        """The attempt a row is sent as: its live registry entry's, else the next after its retired ones."""
        with contextlib.suppress(KeyError):
            info = self.registry.get(rollout_id)
            if info.state in _LIVE:
                return info.attempt
            raise InvalidArgumentError(
                f"rollout {rollout_id} is {info.state} in the checkpoint but not in the output JSONL: the "
                "output was changed behind the collection; restore it or collect into a new output/store",
                rollout_id=rollout_id,
            )
        return self.registry.retired().get(rollout_id, -1) + 1

    def stamp(self, rows: Iterable[dict[str, Any]]) -> None:
        """Put ``_ng_rollout_id`` and ``_ng_attempt_index`` on each row (Gym appends ``-a<N>`` to
        the capture key from attempt 1 on, as the SDK expects)."""
        seen: set[str] = set()
        for row in rows:
            rollout_id = row_rollout_id(row)
            if rollout_id in seen:
                raise InvalidArgumentError(
                    f"two rows have the rollout id {rollout_id!r} (num_repeats or fan_out copy an explicit "
                    f"{ROLLOUT_ID_KEY}): make the ids unique or leave them to Gym's task and rollout indices",
                    rollout_id=rollout_id,
                )
            seen.add(rollout_id)
            row[ROLLOUT_ID_KEY] = rollout_id
            row[ATTEMPT_KEY] = self.attempt_for(rollout_id)

    def started(self, body: Mapping[str, Any]) -> ExecutionId | None:
        """A row's ``/run`` is about to be sent: dispatch it (if new) and start it. Returns the
        execution, or ``None`` while a checkpoint holds dispatch frozen (the caller waits)."""
        rollout_id = str(body[ROLLOUT_ID_KEY])
        attempt = int(body.get(ATTEMPT_KEY) or 0)
        with self._lock:
            if rollout_id in self.registry:
                info = self.registry.get(rollout_id)
                execution = info.execution
            else:
                try:
                    execution = self.registry.dispatch(rollout_id)
                except AdmissionClosedError:
                    return None
                info = self.registry.get(rollout_id)
            if execution.attempt != attempt:
                raise StaleAttemptError(
                    f"row {rollout_id} was stamped attempt {attempt}, the registry holds {execution}",
                    rollout_id=rollout_id,
                    attempt=attempt,
                )
            if info.state == "queued":
                self.registry.start(execution)
            return execution

    def finished(self, body: Mapping[str, Any]) -> None:
        """``/run`` answered 200: the result exists, not yet accepted."""
        execution = ExecutionId(rollout_id=str(body[ROLLOUT_ID_KEY]), attempt=int(body.get(ATTEMPT_KEY) or 0))
        with self._lock, contextlib.suppress(KeyError):
            info = self.registry.get(execution.rollout_id)
            if info.execution == execution and info.state == "running":
                self.registry.finish(execution)

    def hand_off_written(self) -> int:
        """Hand off every row Gym has appended to the output since the last call."""
        count = 0
        for row in self.tail.read():
            if self._complete(row):
                count += 1
        self.handed_off += count
        return count

    def _complete(self, row: Mapping[str, Any]) -> bool:
        rollout_id = row.get(ROLLOUT_ID_KEY)
        if rollout_id is None:
            return False
        execution = ExecutionId(rollout_id=str(rollout_id), attempt=int(row.get(ATTEMPT_KEY) or 0))
        with self._lock:
            try:
                info = self.registry.get(execution.rollout_id)
            except KeyError:
                return False
            if info.state in _DONE:
                return False
            if info.execution != execution:
                log.warning("output row %s does not match the registry's %s", execution, info.execution)
                return False
            if info.state == "queued":
                self.registry.start(execution)
            if info.state in ("queued", "running"):
                self.registry.finish(execution)
            self.registry.hand_off(execution, {"reward": _reward(row)}, reward=_reward(row))
            self._to_retire.append(execution)
            return True

    def take_handed_off(self) -> list[ExecutionId]:
        """The attempts handed off since the last call: their results are in the output, yet a
        stateful tool server may still hold their sessions (Gym's ``/run`` never closes one) and a
        model their lineage, and a restore refuses a participant with live attempts. The caller
        retires them everywhere (:meth:`give_back` what it could not)."""
        with self._lock:
            taken, self._to_retire = self._to_retire, []
        return taken

    def give_back(self, executions: Iterable[ExecutionId]) -> None:
        """Attempts :meth:`take_handed_off` gave that were not retired: the next call gives them again."""
        with self._lock:
            self._to_retire[:0] = list(executions)

    # -- after a restore ------------------------------------------------------------------------
    def reconcile(
        self, rollout_ids: Sequence[str], retire: Callable[[list[ExecutionId]], None]
    ) -> dict[str, int]:
        """Bring the restored registry in line with the output and the servers (see the module
        docstring). ``rollout_ids`` are every row of the materialized inputs; ``retire`` retires
        attempts at every participant (and in the registry)."""
        written = {row_rollout_id(r): r for r in self.tail.read()}
        counts = {"completed_in_output": 0, "retired_unknown": 0, "retired_written": 0}
        stale: list[ExecutionId] = []
        for rollout_id in written:
            if rollout_id not in self.registry:
                continue
            info = self.registry.get(rollout_id)
            if info.state == "running":  # continued by the restore, yet its result is already written
                stale.append(info.execution)
        if stale:
            retire(stale)
            counts["retired_written"] = len(stale)
        for rollout_id, row in written.items():
            if rollout_id in self.registry and self.registry.get(rollout_id).state in _DONE:
                continue
            if rollout_id in self.registry:  # queued: nothing of it runs anywhere
                execution = self.registry.get(rollout_id).execution
            else:
                execution = self.registry.dispatch(rollout_id)
            self.registry.start(execution)
            self.registry.finish(execution)
            self.registry.hand_off(execution, {"reward": _reward(row)}, reward=_reward(row))
            with self._lock:
                self._to_retire.append(execution)
            counts["completed_in_output"] += 1
        # a row the last checkpoint does not list may have been sent after it: its attempt may be
        # running at the servers. Fence it everywhere; the row is sent as the next attempt.
        unknown = [
            self.registry.dispatch(rollout_id)
            for rollout_id in dict.fromkeys(rollout_ids)
            if rollout_id not in written and rollout_id not in self.registry
        ]
        if unknown:
            retire(unknown)
            counts["retired_unknown"] = len(unknown)
        self.handed_off += counts["completed_in_output"]
        return counts
