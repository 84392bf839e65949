"""Agent boundaries kept encoded: a boundary's payload is built once, when the agent reports it,
so a commit only gathers bytes (no per-record encoding inside the checkpoint's pause).

The payload is the JSON a reader decodes with :class:`AgentBoundaryRecord`, built by orjson
from the record's fields. ``pending_model_call_id`` is left out while it is ``None`` (its
default, so the decoded record is the same); a run parked on a model call gets it as the
object's first key at export, a splice of two byte strings (the call id is a validated
identifier: it needs no JSON escaping).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..format.columnar import RecordBatch, b64, check_ids, encode_docs
from ..format.records import AgentBoundaryRecord, decode_record

__all__ = ["SavedBoundary", "boundary_batch"]


def _doc(record: AgentBoundaryRecord, pending: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": record.schema_version,
        "rollout_id": record.rollout_id,
        "attempt": record.attempt,
        "boundary_index": record.boundary_index,
        "turn_index": record.turn_index,
        "last_model_call_id": record.last_model_call_id,
    }
    if pending is not None:
        doc["pending_model_call_id"] = pending
    doc["resource_revisions"] = record.resource_revisions
    doc["output_items"] = record.output_items
    doc["usage"] = record.usage
    doc["cookies"] = record.cookies
    doc["agent_state"] = None if record.agent_state is None else b64(record.agent_state)
    return doc


@dataclass(frozen=True)
class SavedBoundary:
    """One reported (validated) boundary: its encoded payload and its member-index refs, both
    built when it was reported and never changed (an export may share them)."""

    rollout_id: str
    attempt: int
    boundary_index: int
    payload: bytes
    pending: str | None
    refs: Mapping[str, Any]

    @classmethod
    def of(cls, record: AgentBoundaryRecord) -> SavedBoundary:
        pending = record.pending_model_call_id
        return cls(
            rollout_id=record.rollout_id,
            attempt=record.attempt,
            boundary_index=record.boundary_index,
            payload=encode_docs([_doc(record, pending)])[0],
            pending=pending,
            refs=record.index_refs() or {},  # fresh dicts, held by this object only
        )

    def record(self) -> AgentBoundaryRecord:
        """The boundary as reported (decoded from its payload, as a reader would)."""
        record = decode_record(AgentBoundaryRecord.kind, self.payload)
        assert isinstance(record, AgentBoundaryRecord)
        return record

    def payload_awaiting(self, call_id: str | None) -> bytes:
        """The payload with ``pending_model_call_id`` = ``call_id`` (the call the run awaits)."""
        if call_id is None or call_id == self.pending:
            return self.payload
        if self.pending is None:
            return b'{"pending_model_call_id":' + orjson.dumps(call_id) + b"," + self.payload[1:]
        return encode_docs([_doc(self.record(), call_id)])[0]

    def refs_awaiting(self, call_id: str | None) -> Mapping[str, Any]:
        """``index_refs()`` of the record :meth:`payload_awaiting` encodes."""
        if call_id is None or call_id == self.pending:
            return self.refs
        return {**self.refs, "pending_model_call": call_id}


def boundary_batch(parked: Sequence[tuple[SavedBoundary, str | None]]) -> RecordBatch:
    """The ``agent_boundary`` members of ``(boundary, awaited model call)`` pairs: payloads and
    refs gathered (a run awaiting a call gets it spliced in), revisions as ``index_revision()``."""
    check_ids((a for _, a in parked if a is not None), "pending_model_call_id")
    return RecordBatch(
        kind=AgentBoundaryRecord.kind,
        rollout_ids=tuple(b.rollout_id for b, _ in parked),
        attempts=tuple(b.attempt for b, _ in parked),
        keys=tuple(f"{b.boundary_index:08d}" for b, _ in parked),
        payloads=tuple(b.payload_awaiting(a) for b, a in parked),
        revisions=tuple(b.boundary_index for b, _ in parked),
        refs=tuple(b.refs_awaiting(a) for b, a in parked),
    )
