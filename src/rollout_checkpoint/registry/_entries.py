"""A registry entry: one rollout's current attempt, its state and its pre-encoded payloads, and
the columnar batches a checkpoint writes from the entries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from ..format.columnar import RecordBatch, encode_docs
from ..format.records import RECORD_SCHEMA_VERSION, CompletedResultRecord, DispatchRecord, DispatchState
from ..ids import ExecutionId

__all__ = [
    "REGISTRY_INSTANCE",
    "REGISTRY_KIND",
    "ExecutionInfo",
    "RegistryEntry",
    "registry_batches",
    "result_payload",
]

REGISTRY_KIND: Final = "framework"
REGISTRY_INSTANCE: Final = "registry"

_LIVE: Final[frozenset[str]] = frozenset({"queued", "running", "finished"})


@dataclass(frozen=True)
class ExecutionInfo:
    """A read-only view of one registry entry."""

    rollout_id: str
    attempt: int
    state: DispatchState
    input_digest: str | None
    restart_only: bool
    result: CompletedResultRecord | None

    @property
    def execution(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt)


@dataclass(frozen=True)
class RegistryEntry:
    """One entry to install with :meth:`LiveExecutionRegistry.install` (restore builds these)."""

    rollout_id: str
    attempt: int
    state: DispatchState
    input_digest: str | None = None
    restart_only: bool = False
    result: CompletedResultRecord | None = None


class _Entry:
    """One registry entry. Its ``dispatch`` payload is kept encoded around the state (``head``
    + state + ``tail``) and its result's payload encoded once, so a checkpoint only joins bytes:
    a dispatched entry encodes when it is made, an installed one (restore, a copy) on first use.
    """

    __slots__ = (
        "_execution",
        "_head",
        "_result_payload",
        "_tail",
        "attempt",
        "input_digest",
        "restart_only",
        "result",
        "rollout_id",
        "state",
    )

    def __init__(
        self,
        rollout_id: str,
        attempt: int,
        state: DispatchState,
        input_digest: str | None,
        restart_only: bool,
        result: CompletedResultRecord | None = None,
        *,
        encode: bool = True,
    ) -> None:
        self.rollout_id = rollout_id
        self.attempt = attempt
        self.state: DispatchState = state
        self.input_digest = input_digest
        self.restart_only = restart_only
        self.result = result
        self._execution: ExecutionId | None = None
        self._head: bytes | None = None
        self._tail: bytes | None = None
        self._result_payload: bytes | None = None
        if encode:
            self.execution()
            self.payload()
            self.result_payload()

    def execution(self) -> ExecutionId:
        """The id a checkpoint freezes, built once (from validated values: no second validation)."""
        if self._execution is None:
            self._execution = ExecutionId.model_construct(rollout_id=self.rollout_id, attempt=self.attempt)
        return self._execution

    def payload(self) -> bytes:
        """The ``dispatch`` payload in the current state."""
        if self._head is None or self._tail is None:
            head, tail = encode_docs(
                [
                    {
                        "schema_version": RECORD_SCHEMA_VERSION,
                        "rollout_id": self.rollout_id,
                        "attempt": self.attempt,
                    },
                    {"input_digest": self.input_digest, "restart_only": self.restart_only},
                ]
            )
            self._head = head[:-1] + b',"state":"'  # the state is one of DispatchState: no escaping
            self._tail = b'",' + tail[1:]
        return self._head + self.state.encode() + self._tail

    def result_payload(self) -> bytes | None:
        """The kept result's ``completed_result`` payload, if a result is kept."""
        if self.result is None:
            return None
        if self._result_payload is None:
            self._result_payload = result_payload(self.result)
        return self._result_payload

    def set_result(self, result: CompletedResultRecord | None, payload: bytes | None) -> None:
        self.result = result
        self._result_payload = payload

    def clone(self) -> _Entry:
        """A copy sharing the encoded parts (bytes and the frozen id: immutable)."""
        twin = _Entry.__new__(_Entry)  # field by field: inside the pause, for every live entry
        twin._execution, twin._head, twin._result_payload, twin._tail = (
            self._execution,
            self._head,
            self._result_payload,
            self._tail,
        )
        twin.attempt, twin.input_digest, twin.restart_only, twin.result, twin.rollout_id, twin.state = (
            self.attempt,
            self.input_digest,
            self.restart_only,
            self.result,
            self.rollout_id,
            self.state,
        )
        return twin

    def info(self) -> ExecutionInfo:
        return ExecutionInfo(
            self.rollout_id, self.attempt, self.state, self.input_digest, self.restart_only, self.result
        )


_STATE_REFS: dict[tuple[str, bool], dict[str, JsonValue]] = {}


def _state_refs(state: str, restart_only: bool) -> dict[str, JsonValue]:
    """``DispatchRecord.index_refs()``: one shared dict per (state, restart_only), never changed."""
    refs = _STATE_REFS.get((state, restart_only))
    if refs is None:
        refs = _STATE_REFS.setdefault((state, restart_only), {"state": state, "restart_only": restart_only})
    return refs


def result_payload(result: CompletedResultRecord) -> bytes:
    """A ``completed_result`` payload: orjson of the model's JSON shape."""
    doc = {
        "schema_version": result.schema_version,
        "rollout_id": result.rollout_id,
        "attempt": result.attempt,
        "result": result.result,
        "reward": result.reward,
        "acknowledged": result.acknowledged,
    }
    return encode_docs([doc])[0]


def registry_batches(entries: Sequence[_Entry]) -> list[RecordBatch]:
    """The ``dispatch`` batch of every entry and the ``completed_result`` batch of the kept
    results, from the payloads the entries keep encoded (entries were validated when made)."""
    dispatch = RecordBatch(
        kind=DispatchRecord.kind,
        rollout_ids=tuple(e.rollout_id for e in entries),
        attempts=tuple(e.attempt for e in entries),
        keys=("dispatch",) * len(entries),
        payloads=tuple(e.payload() for e in entries),
        refs=tuple(_state_refs(e.state, e.restart_only) for e in entries),
    )
    results = [(e, p) for e in entries if (p := e.result_payload()) is not None]
    completed = RecordBatch(
        kind=CompletedResultRecord.kind,
        rollout_ids=tuple(e.rollout_id for e, _ in results),
        attempts=tuple(e.attempt for e, _ in results),
        keys=("result",) * len(results),
        payloads=tuple(p for _, p in results),
    )
    return [dispatch, completed]
