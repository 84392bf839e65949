"""Agent boundaries kept encoded: a boundary's payload is built once, when the agent reports it,
so a commit only gathers bytes (no per-record encoding inside the checkpoint's pause).

The payload is the JSON a reader decodes with :class:`AgentBoundaryRecord`, built by orjson
from the record's fields. ``pending_model_call_id`` is left out while it is ``None`` (its
default, so the decoded record is the same); a run parked on a model call gets it as the
object's first key at export, a splice of two byte strings (the call id is a validated
identifier: it needs no JSON escaping).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..format.chunks import chunk_payload
from ..format.columnar import RecordBatch, b64, check_ids, encode_docs
from ..format.records import AgentBoundaryRecord, OutputChunkRecord, chunk_key, decode_record

__all__ = ["Chunk", "SavedBoundary", "boundary_batch", "chunked_batches", "seal_chunks"]


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
    items: tuple[bytes, ...] = ()
    """Each output item encoded on its own (format 2 writes them in chunks); the items equal to
    the previous boundary's are the very same bytes objects."""
    head: bytes = b""
    """The schema-2 payload up to ``"output_chunks":`` (the chunk list and ``}`` follow)."""

    @classmethod
    def of(cls, record: AgentBoundaryRecord, previous: SavedBoundary | None = None) -> SavedBoundary:
        pending = record.pending_model_call_id
        doc = _doc(record, pending)
        payload = encode_docs([doc])[0]
        items = encode_docs([{"i": item} for item in record.output_items])  # orjson, as above
        encoded = tuple(b[5:-1] for b in items)  # strip '{"i":' and '}'
        if previous is not None:  # share the bytes of the unchanged prefix with the previous one
            old = previous.items
            encoded = tuple(
                old[i] if i < len(old) and old[i] == item else item for i, item in enumerate(encoded)
            )
        head_doc = {**doc, "schema_version": 2, "output_items": []}
        head = encode_docs([head_doc])[0][:-1] + b',"output_chunks":'
        return cls(
            rollout_id=record.rollout_id,
            attempt=record.attempt,
            boundary_index=record.boundary_index,
            payload=payload,
            pending=pending,
            refs=record.index_refs() or {},  # fresh dicts, held by this object only
            items=encoded,
            head=head,
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

    def chunked_payload(self, chunks: Sequence[Chunk], call_id: str | None) -> bytes:
        """The schema-2 payload listing ``chunks`` (with ``pending_model_call_id`` = ``call_id``)."""
        listed = orjson.dumps([{"key": c.key, "items": c.end - c.first, "sha256": c.sha256} for c in chunks])
        payload = self.head + listed + b"}"
        if call_id is None or call_id == self.pending:
            return payload
        if self.pending is None:
            return b'{"pending_model_call_id":' + orjson.dumps(call_id) + b"," + payload[1:]
        doc = orjson.loads(payload)
        doc["pending_model_call_id"] = call_id
        return encode_docs([doc])[0]

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


@dataclass(frozen=True, slots=True)
class Chunk:
    """Items ``[first, end)`` of a run's history as one ``output_chunk`` payload (immutable)."""

    first: int
    end: int
    payload: bytes
    sha256: str
    key: str


def seal_chunks(saved: SavedBoundary, chunks: tuple[Chunk, ...], max_chunks: int) -> tuple[Chunk, ...]:
    """``chunks`` (which hold a prefix of ``saved.items``) plus one chunk of the items after them;
    the whole history as one chunk once there would be more than ``max_chunks``."""
    n = len(saved.items)
    done = chunks[-1].end if chunks else 0
    if n == done:
        return chunks
    if len(chunks) + 1 > max_chunks:
        chunks, done = (), 0
    payload = chunk_payload(saved.rollout_id, saved.attempt, done, saved.items[done:])
    return (*chunks, Chunk(done, n, payload, hashlib.sha256(payload).hexdigest(), chunk_key(done, n)))


def chunked_batches(
    parked: Sequence[tuple[SavedBoundary, str | None, tuple[Chunk, ...], bytes]],
) -> list[RecordBatch]:
    """Format 2: the schema-2 ``agent_boundary`` members of ``(boundary, awaited call, chunks,
    payload)`` and the ``output_chunk`` members they list."""
    check_ids((a for _, a, _, _ in parked if a is not None), "pending_model_call_id")
    boundaries = RecordBatch(
        kind=AgentBoundaryRecord.kind,
        rollout_ids=tuple(b.rollout_id for b, _, _, _ in parked),
        attempts=tuple(b.attempt for b, _, _, _ in parked),
        keys=tuple(f"{b.boundary_index:08d}" for b, _, _, _ in parked),
        payloads=tuple(p for _, _, _, p in parked),
        revisions=tuple(b.boundary_index for b, _, _, _ in parked),
        refs=tuple(b.refs_awaiting(a) for b, a, _, _ in parked),
        schema_version=2,
    )
    rollout_ids: list[str] = []
    attempts: list[int] = []
    keys: list[str] = []
    payloads: list[bytes] = []
    for b, _, chunks, _ in parked:  # columns straight away: no object per chunk in the pause
        rollout_ids.extend([b.rollout_id] * len(chunks))
        attempts.extend([b.attempt] * len(chunks))
        keys.extend([c.key for c in chunks])
        payloads.extend([c.payload for c in chunks])
    chunk_batch = RecordBatch(
        kind=OutputChunkRecord.kind,
        rollout_ids=tuple(rollout_ids),
        attempts=tuple(attempts),
        keys=tuple(keys),
        payloads=tuple(payloads),
    )
    return [boundaries, chunk_batch]
