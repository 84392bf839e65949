"""The writer's open row group: one Python list per shard column, appended record by record
(``write``/``write_raw``) or a batch slice at a time (``write_columns``), and handed over whole
to be turned into Arrow arrays once per row group."""

from __future__ import annotations

from typing import Any

from ._bulk import Batch

__all__ = ["OpenRowGroup"]

Ident = tuple[str, str, int, str]


class OpenRowGroup:
    """Column lists in shard-schema order, their payload bytes, and the members' identity hashes
    (for the exact duplicate check of :meth:`contains`)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.rollout_ids: list[str] = []
        self.attempts: list[int] = []
        self.keys: list[str] = []
        self.schema_versions: list[int] = []
        self.revisions: list[int | None] = []
        self.refs: list[str | None] = []
        self.payloads: list[bytes] = []
        self.payload_bytes = 0
        self.seen: set[int] = set()

    def __len__(self) -> int:
        return len(self.payloads)

    def append(
        self,
        ident: Ident,
        ident_hash: int,
        schema_version: int,
        revision: int | None,
        refs: str | None,
        payload: bytes,
    ) -> None:
        kind, rollout_id, attempt, key = ident
        self.seen.add(ident_hash)
        self.kinds.append(kind)
        self.rollout_ids.append(rollout_id)
        self.attempts.append(attempt)
        self.keys.append(key)
        self.schema_versions.append(schema_version)
        self.revisions.append(revision)
        self.refs.append(refs)
        self.payloads.append(payload)
        self.payload_bytes += len(payload)

    def extend(self, batch: Batch, start: int, end: int, schema_version: int, payload_bytes: int) -> None:
        """Append members ``[start, end)`` of ``batch`` (their payloads total ``payload_bytes``)."""
        n = end - start
        self.kinds.extend([batch.kind] * n)
        self.rollout_ids.extend(batch.rollout_ids[start:end])
        self.attempts.extend(batch.attempts[start:end])
        self.keys.extend(batch.keys[start:end])
        self.schema_versions.extend([schema_version] * n)
        self.revisions.extend(batch.revisions[start:end])
        self.refs.extend(batch.refs[start:end])
        self.payloads.extend(batch.payloads[start:end])
        self.seen.update(batch.hashes[start:end])
        self.payload_bytes += payload_bytes

    def contains(self, ident: Ident) -> bool:
        """Exact membership (callers ask only when the identity's hash is in :attr:`seen`)."""
        kind, rollout_id, attempt, key = ident
        for i, k in enumerate(self.keys):
            if (
                k == key
                and self.kinds[i] == kind
                and self.rollout_ids[i] == rollout_id
                and self.attempts[i] == attempt
            ):
                return True
        return False

    def columns(self) -> list[list[Any]]:
        """The column lists in shard-schema order."""
        return [
            self.kinds,
            self.rollout_ids,
            self.attempts,
            self.keys,
            self.schema_versions,
            self.revisions,
            self.refs,
            self.payloads,
        ]
