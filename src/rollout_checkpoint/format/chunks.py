"""Output-item chunks (format version 2): an agent boundary's history written once, in pieces.

A schema-2 ``agent_boundary`` keeps ``output_items`` empty and lists ``output_chunks``: the
``output_chunk`` members of the same execution that hold the items, in order, each with its item
count and the SHA-256 of its payload bytes as stored. The chunks of a growing history are
immutable, so a later checkpoint refers to the earlier ones (archive member references) and
writes only the chunk of new items. :func:`assemble_boundaries` turns a component's records back
into schema-1 boundaries, checking every chunk; nothing is installed from a boundary whose
chunks are missing, altered, out of order or left over.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRecordError
from .records import AgentBoundaryRecord, OutputChunkRecord, Record, chunk_key, decode_record

if TYPE_CHECKING:
    from ..archive import RawArchiveReader

__all__ = [
    "DEFAULT_MAX_CHUNKS",
    "assemble_boundaries",
    "chunk_payload",
    "component_records",
    "read_boundary",
]

DEFAULT_MAX_CHUNKS = 32
"""A boundary lists at most this many chunks: one more makes the writer write the whole history
as one chunk again, so a restore reads a bounded number of row groups per rollout."""


def chunk_payload(rollout_id: str, attempt: int, first: int, items: Iterable[bytes]) -> bytes:
    """The payload of the ``output_chunk`` holding the encoded ``items`` from item ``first``
    (what ``OutputChunkRecord`` decodes; ids are validated identifiers, so they need no escaping)."""
    return (
        b'{"schema_version":1,"rollout_id":"%s","attempt":%d,"first_item":%d,"items":['
        % (rollout_id.encode(), attempt, first)
        + b",".join(items)
        + b"]}"
    )


def assemble_boundaries(records: Iterable[tuple[Record, bytes]]) -> list[Record]:
    """The records with every schema-2 boundary replaced by the schema-1 boundary its chunks
    make (``(record, payload bytes as stored)`` pairs in; chunk members consumed).

    ``InvalidRecordError`` when a listed chunk is missing, has another digest or item count, does
    not start where the previous one ended, or when a chunk is listed by no boundary."""
    out: list[Record] = []
    chunks: dict[tuple[str, int, str], tuple[OutputChunkRecord, str]] = {}
    boundaries: list[AgentBoundaryRecord] = []
    for record, payload in records:
        if isinstance(record, OutputChunkRecord):
            chunks[(record.rollout_id, record.attempt, record.record_key)] = (
                record,
                hashlib.sha256(payload).hexdigest(),
            )
        elif isinstance(record, AgentBoundaryRecord) and record.output_chunks is not None:
            boundaries.append(record)
        else:
            out.append(record)
    used: set[tuple[str, int, str]] = set()
    for boundary in boundaries:
        items: list[Any] = []
        where = f"agent_boundary {boundary.rollout_id}#{boundary.attempt}/{boundary.record_key}"
        for ref in boundary.output_chunks or []:
            ident = (boundary.rollout_id, boundary.attempt, ref.key)
            found = chunks.get(ident)
            if found is None:
                raise InvalidRecordError(f"{where}: output_chunk {ref.key} is missing")
            chunk, digest = found
            if digest != ref.sha256:
                raise InvalidRecordError(f"{where}: output_chunk {ref.key} is altered (sha256 {digest})")
            if len(chunk.items) != ref.items or chunk.first_item != len(items):
                raise InvalidRecordError(
                    f"{where}: output_chunk {ref.key} does not continue the history at item {len(items)}"
                )
            if ref.key != chunk_key(chunk.first_item, chunk.first_item + len(chunk.items)):
                raise InvalidRecordError(f"{where}: output_chunk {ref.key} names other items")
            items.extend(chunk.items)
            used.add(ident)
        out.append(
            boundary.model_copy(update={"schema_version": 1, "output_items": items, "output_chunks": None})
        )
    unused = sorted(set(chunks) - used)
    if unused:
        rollout_id, attempt, key = unused[0]
        raise InvalidRecordError(f"output_chunk {rollout_id}#{attempt}/{key} belongs to no agent boundary")
    return out


def component_records(reader: RawArchiveReader) -> list[Record]:
    """Every record of a component archive as its participant committed it: decoded, referenced
    members included (format 2), boundaries assembled from their chunks."""
    return assemble_boundaries(
        (decode_record(raw.kind, raw.payload), raw.payload) for raw in reader.iter_raw()
    )


def read_boundary(reader: RawArchiveReader, rollout_id: str, attempt: int, key: str) -> Record:
    """One agent boundary of a component, its history assembled, reading only what it needs:
    the boundary's row group, and per output chunk either its row group here or, for a chunk
    an earlier archive stores, that base's pinned manifest, the shard footer and the row group
    (``RawArchiveReader.read_digested``: never a base's member index). Every chunk is checked
    against the digest the boundary names, then assembled as :func:`assemble_boundaries` does."""
    raw = reader.get_raw("agent_boundary", rollout_id, attempt, key)
    boundary = decode_record(raw.kind, raw.payload)
    if not isinstance(boundary, AgentBoundaryRecord) or boundary.output_chunks is None:
        return boundary
    referenced = {
        r.key: r
        for r in reader.references("output_chunk")
        if r.rollout_id == rollout_id and r.attempt == attempt
    }
    pairs: list[tuple[Record, bytes]] = [(boundary, raw.payload)]
    wanted = []
    for chunk in boundary.output_chunks:
        ref = referenced.get(chunk.key)
        if ref is None:  # stored here: the index and the row group's own digest
            stored = reader.get_raw(OutputChunkRecord.kind, rollout_id, attempt, chunk.key)
            pairs.append((decode_record(stored.kind, stored.payload), stored.payload))
        else:
            wanted.append((ref, chunk.sha256))
    for found in reader.read_digested(wanted):
        pairs.append((decode_record(found.kind, found.payload), found.payload))
    (assembled,) = assemble_boundaries(pairs)
    return assembled
