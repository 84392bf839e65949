"""Pre-encoded, columnar record batches: what a participant exports and a component archive takes.

A :class:`RecordBatch` holds one kind of record as columns (rollout ids, attempts, member keys,
revisions, index refs) and each record's payload as the JSON bytes a reader decodes with the
record model (:func:`~rollout_checkpoint.format.records.decode_record`). Payloads are built in bulk with
orjson from plain dicts of the model's JSON shape (``Record.model_dump(mode="json")``), not one
pydantic model and ``model_dump_json`` per record; what the models would have validated is
checked here once per column (``check_*``), so the path stays fail-closed.

A batch is immutable once built: tuples of ``str``/``int``/``bytes``, and refs dicts built
fresh for the batch, so nothing a participant does to its live state afterwards changes it.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import InvalidRecordError
from ..ids import ID_MAX_LENGTH, validate_id
from .records import RECORD_TYPES, Record, decode_record

if TYPE_CHECKING:
    from ..archive import ArchiveWriter

__all__ = [
    "RecordBatch",
    "RecordBatches",
    "b64",
    "check_ids",
    "check_lengths",
    "check_non_negative",
    "check_pattern",
    "encode_docs",
]


@dataclass(frozen=True)
class RecordBatch:
    """Members of one record ``kind``, one column per field, payloads already encoded."""

    kind: str
    rollout_ids: tuple[str, ...]
    attempts: tuple[int, ...]
    keys: tuple[str, ...]
    payloads: tuple[bytes, ...]
    revisions: tuple[int | None, ...] | None = None
    refs: tuple[Mapping[str, Any] | None, ...] | None = None
    schema_version: int = 1
    """The record schema of every payload of the batch (stored in each shard row)."""

    def __post_init__(self) -> None:
        if self.kind not in RECORD_TYPES:
            raise InvalidRecordError(f"unknown record kind {self.kind!r}", kind=self.kind)
        n = len(self.payloads)
        columns = [self.rollout_ids, self.attempts, self.keys, self.revisions, self.refs]
        if any(c is not None and len(c) != n for c in columns):
            raise InvalidRecordError(f"the columns of a {self.kind} batch must have {n} entries each")

    def __len__(self) -> int:
        return len(self.payloads)

    def write_to(self, writer: ArchiveWriter) -> None:
        """Append the batch to ``writer`` through its columnar path (``write_columns``)."""
        writer.write_columns(
            self.kind,
            self.rollout_ids,
            self.attempts,
            self.keys,
            self.payloads,
            revisions=self.revisions,
            refs=self.refs,
            schema_version=self.schema_version,
        )

    def records(self) -> Iterator[Record]:
        """The records as the readers decode them (a check, and the per-record view of a batch)."""
        for payload in self.payloads:
            yield decode_record(self.kind, payload)


class RecordBatches(Sequence[Record]):
    """An export's records as columnar batches; indexing and iterating decode the payloads
    (the per-record view, for tests and wrappers; the commit writes the batches as they are)."""

    def __init__(self, batches: Iterable[RecordBatch]) -> None:
        self.batches: tuple[RecordBatch, ...] = tuple(b for b in batches if len(b))
        self._count = sum(len(b) for b in self.batches)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Record]:
        for batch in self.batches:
            yield from batch.records()

    def __getitem__(self, index: Any) -> Any:
        return list(self)[index]

    def __repr__(self) -> str:
        kinds = ", ".join(f"{b.kind}: {len(b)}" for b in self.batches)
        return f"RecordBatches({kinds})"


_DUMPS = orjson.dumps


def encode_docs(docs: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Compact JSON of each dict, in bulk; what orjson refuses (integers beyond 64 bits) goes
    through ``json`` as pydantic would write it, and anything else not JSON raises
    ``InvalidRecordError``."""
    try:
        return [_DUMPS(d) for d in docs]
    except TypeError:
        out = []
        for doc in docs:
            try:
                out.append(_DUMPS(doc))
            except TypeError:
                try:
                    out.append(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode())
                except (TypeError, ValueError) as exc:
                    raise InvalidRecordError(f"a record is not JSON-serialisable: {exc}") from None
        return out


def b64(data: bytes) -> str:
    """Bytes as the record models write them in JSON (URL-safe base64, padded)."""
    return base64.urlsafe_b64encode(data).decode("ascii")


_ID_LINES = re.compile(rf"(?:[A-Za-z0-9][A-Za-z0-9._-]{{0,{ID_MAX_LENGTH - 1}}}\n)*")


def check_ids(values: Iterable[Any], what: str) -> None:
    """Every value is a valid identifier (one regex pass; ``validate_id`` names the first bad one)."""
    unique = set(values)
    if all(type(v) is str for v in unique):
        joined = "\n".join(unique) + "\n" if unique else ""
        if joined.count("\n") == len(unique) and ".." not in joined and _ID_LINES.fullmatch(joined):
            return
    for value in unique:
        validate_id(value, what)


def check_non_negative(values: Iterable[Any], what: str) -> None:
    """Every value is an ``int`` (not a bool) ``>= 0``."""
    for value in values:
        if type(value) is not int or value < 0:
            raise InvalidRecordError(f"{what} must be a non-negative integer, got {value!r}")


def check_lengths(values: Iterable[Any], what: str, low: int, high: int | None) -> None:
    """Every value is a ``str`` of ``low`` to ``high`` characters."""
    for value in values:
        if type(value) is not str or len(value) < low or (high is not None and len(value) > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise InvalidRecordError(f"{what} must be a string of {bound} characters, got {value!r}")


def check_pattern(values: Iterable[Any], what: str, pattern: re.Pattern[str]) -> None:
    """Every value is a ``str`` that ``pattern`` matches whole."""
    for value in set(values):
        if type(value) is not str or not pattern.fullmatch(value):
            raise InvalidRecordError(f"{what} {value!r} does not match {pattern.pattern}")
