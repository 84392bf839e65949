"""The columnar write path: checks whole batches of members at once, and encodes JSON with orjson.

``ArchiveWriter.write_columns`` takes one column per member field (a batch of one kind) and
appends it with list ``extend``s; the Arrow arrays are built from those columns once per row group
on the encoder thread. Nothing here validates a payload against its record model: that is what
``ArchiveWriter.write`` (pydantic models) is for. orjson (Rust) is used for JSON because it encodes
the nested dicts of agent state about 5-8 times faster than ``json.dumps`` and gives the same
compact, key-sorted bytes for ``refs``.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any, overload

import orjson
import pyarrow as pa

from ..errors import InvalidRecordError
from ..ids import ID_MAX_LENGTH, validate_id

__all__ = [
    "Batch",
    "PackedPayloads",
    "check_batch",
    "check_member",
    "duplicate_error",
    "encode_records",
    "encode_refs",
    "encode_refs_column",
]

MAX_MEMBER_KEY = 1024
ID_CACHE_LIMIT = 1 << 16
_SORTED = orjson.OPT_SORT_KEYS


def encode_refs(refs: Any) -> str | None:
    """Compact, key-sorted JSON of ``Record.index_refs()`` (stable bytes for equal refs)."""
    if refs is None:
        return None
    try:
        return orjson.dumps(refs, option=_SORTED).decode()
    except TypeError:
        # what orjson refuses (integers beyond 64 bits, non-string keys) json still writes
        return json.dumps(refs, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def encode_refs_column(refs: Sequence[Any]) -> list[str | None]:
    """``encode_refs`` of every item; an object that recurs in the column (the registry's members
    share one refs dict per state) is encoded once. Keyed by identity while every object is held
    alive, so two objects are never mistaken for one (equal ones may still differ in type)."""
    items = list(refs)  # every object stays alive (and its id its own) until the end
    out: list[str | None] = []
    seen: dict[int, str | None] = {}
    for r in items:
        key = id(r)
        encoded = seen.get(key, _MISSING)
        if encoded is _MISSING:
            encoded = seen[key] = encode_refs(r)
        out.append(encoded)
    return out


_MISSING: Any = object()

_MAX_BINARY = (1 << 31) - 1
"""Largest total of one ``pa.binary()`` array (32-bit offsets)."""


class PackedPayloads(Sequence[bytes]):
    """A batch's payloads packed into one buffer (``encode_records``): one copy of each
    payload, no Python object per payload, and Arrow arrays of any slice without a copy.

    orjson's output keeps the capacity it grew to (about 8 KiB for a 2.3 KB record), so a list
    of its ``bytes`` would hold several times the payload; packing frees each one at once."""

    def __init__(self, data: bytearray, lengths: list[int]) -> None:
        self._data = data  # never changed after this point: Arrow arrays view it
        self.lengths = lengths
        self._offsets = array("q", accumulate(lengths, initial=0))
        self._array: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        offsets = self._offsets
        return bytes(self._data[offsets[i] : offsets[i + 1]])

    def arrow(self, start: int, end: int) -> pa.Array:
        """Payloads ``[start, end)`` as an Arrow binary array viewing the packed buffer."""
        if len(self._data) > _MAX_BINARY:
            return pa.array(self[start:end], pa.binary())  # rare: more than 2 GiB in one batch
        if self._array is None:
            offsets = pa.py_buffer(array("i", self._offsets))
            self._array = pa.Array.from_buffers(
                pa.binary(), len(self), [None, offsets, pa.py_buffer(self._data)]
            )
        return self._array.slice(start, end - start)


@dataclass
class Batch:
    """A checked batch of one kind, as column lists ready to be appended."""

    kind: str
    rollout_ids: list[str]
    attempts: list[int]
    keys: list[str]
    revisions: list[int | None]
    refs: list[str | None]
    payloads: list[bytes] | PackedPayloads
    lengths: list[int]
    hashes: list[int]

    def __len__(self) -> int:
        return len(self.payloads)


_ID_LINES = re.compile(rf"(?:[A-Za-z0-9][A-Za-z0-9._-]{{0,{ID_MAX_LENGTH - 1}}}\n)*")


def validate_ids(ids: set[str], what: str) -> None:
    """``validate_id`` of many ids in one regex pass over them; the first bad one raises."""
    if all(type(i) is str for i in ids):
        joined = "\n".join(ids) + "\n"
        if joined.count("\n") == len(ids) and ".." not in joined and _ID_LINES.fullmatch(joined):
            return
    for value in ids:
        validate_id(value, what)


def check_batch(
    kind: str,
    rollout_ids: Sequence[str],
    attempts: Sequence[int],
    keys: Sequence[str],
    payloads: Sequence[bytes | bytearray | memoryview],
    revisions: Sequence[int | None] | None,
    refs: Sequence[Mapping[str, Any] | None] | None,
) -> Batch:
    """Check every column of a batch; ``InvalidRecordError`` (or ``InvalidIdentifierError``)
    names the first bad value, and nothing of the batch is taken."""
    n = len(payloads)
    lengths_of = {"rollout_ids": len(rollout_ids), "attempts": len(attempts), "keys": len(keys)}
    if revisions is not None:
        lengths_of["revisions"] = len(revisions)
    if refs is not None:
        lengths_of["refs"] = len(refs)
    if any(m != n for m in lengths_of.values()):
        raise InvalidRecordError(f"columns of one batch must have equal lengths: payloads {n}, {lengths_of}")
    validate_id(kind, "record kind")
    validate_ids(set(rollout_ids), "rollout_id")
    attempt_list = list(attempts)
    if not all(type(a) is int and a >= 0 for a in attempt_list):
        bad_attempt = next(a for a in attempt_list if type(a) is not int or a < 0)
        raise InvalidRecordError(
            f"attempt must be a non-negative int, got {bad_attempt!r}", attempt=bad_attempt
        )
    key_list = list(keys)
    if not all(type(k) is str and 0 < len(k) <= MAX_MEMBER_KEY for k in key_list):
        bad = next(k for k in key_list if type(k) is not str or not 0 < len(k) <= MAX_MEMBER_KEY)
        raise InvalidRecordError(
            f"member key must be a non-empty string of at most {MAX_MEMBER_KEY} characters", key=bad
        )
    payload_list: list[bytes] | PackedPayloads
    if isinstance(payloads, PackedPayloads):
        payload_list = payloads
    else:
        payload_list = [p if type(p) is bytes else _as_bytes(p) for p in payloads]
    if revisions is None:
        revision_list: list[int | None] = [None] * n
    else:
        revision_list = list(revisions)
        if not all(r is None or type(r) is int for r in revision_list):
            bad_revision = next(r for r in revision_list if r is not None and type(r) is not int)
            raise InvalidRecordError(f"revision must be an int or None, got {bad_revision!r}")
    refs_list: list[str | None] = [None] * n if refs is None else encode_refs_column(refs)
    rid_list = list(rollout_ids)
    hashes = list(map(hash, zip(repeat(kind), rid_list, attempt_list, key_list)))
    if len(set(hashes)) != n:
        seen: set[tuple[str, str, int, str]] = set()
        for ident in zip([kind] * n, rid_list, attempt_list, key_list, strict=True):
            if ident in seen:
                raise duplicate_error(ident, "within one batch")
            seen.add(ident)
    return Batch(
        kind=kind,
        rollout_ids=rid_list,
        attempts=attempt_list,
        keys=key_list,
        revisions=revision_list,
        refs=refs_list,
        payloads=payload_list,
        lengths=payload_list.lengths
        if isinstance(payload_list, PackedPayloads)
        else list(map(len, payload_list)),
        hashes=hashes,
    )


def check_member(
    valid_ids: set[str],
    kind: str,
    rollout_id: str,
    attempt: int,
    key: str,
    payload: bytes | bytearray | memoryview,
    revision: int | None,
    schema_version: int,
) -> bytes:
    """Check one member's fields (``ArchiveWriter.write_raw``); its payload as ``bytes``.
    ``valid_ids`` caches ids already validated (cleared when it grows past ``ID_CACHE_LIMIT``)."""
    if kind not in valid_ids or rollout_id not in valid_ids:
        if len(valid_ids) > ID_CACHE_LIMIT:
            valid_ids.clear()
        valid_ids.add(validate_id(kind, "record kind"))
        valid_ids.add(validate_id(rollout_id, "rollout_id"))
    if type(attempt) is not int or attempt < 0:
        raise InvalidRecordError(f"attempt must be a non-negative int, got {attempt!r}", attempt=attempt)
    if type(key) is not str or not key or len(key) > MAX_MEMBER_KEY:
        raise InvalidRecordError(
            f"member key must be a non-empty string of at most {MAX_MEMBER_KEY} characters", key=key
        )
    if not isinstance(payload, bytes):
        payload = _as_bytes(payload)
    if revision is not None and type(revision) is not int:
        raise InvalidRecordError(f"revision must be an int or None, got {revision!r}")
    if type(schema_version) is not int or schema_version < 1:
        raise InvalidRecordError(f"schema_version must be a positive int, got {schema_version!r}")
    return payload


def duplicate_error(ident: tuple[str, str, int, str], where: str) -> InvalidRecordError:
    """The error for member ``ident`` written twice (``where``: "in archive 'p'", ...)."""
    kind, rollout_id, attempt, key = ident
    return InvalidRecordError(
        f"duplicate member {kind}/{rollout_id}#{attempt}/{key} {where}",
        kind=kind,
        rollout_id=rollout_id,
        attempt=attempt,
        key=key,
    )


def _as_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    raise InvalidRecordError(f"payload must be bytes, got {type(payload).__name__}")


Field = str | Callable[[Mapping[str, Any]], Any]


def _column(records: Sequence[Mapping[str, Any]], field: Field, what: str) -> list[Any]:
    try:
        if callable(field):
            return [field(r) for r in records]
        return [r[field] for r in records]
    except (KeyError, TypeError) as exc:
        raise InvalidRecordError(f"cannot take {what} from a record: {exc!r}") from None


PULSE_RECORDS = 256
"""``encode_records`` calls its ``pulse`` after this many records (see ``ShardRotation.pulse``)."""


def encode_records(
    records: Sequence[Mapping[str, Any]],
    key: Field,
    revision: Field | None,
    refs: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None,
    pulse: Callable[[], None] | None = None,
) -> tuple[list[str], list[int], list[str], PackedPayloads, list[Any] | None, list[Any] | None]:
    """Columns of a batch of JSON-shaped records: ids and attempts from the ``rollout_id`` and
    ``attempt`` fields, ``key``/``revision`` from a field name or a function, payloads by orjson.
    ``pulse`` is called every ``PULSE_RECORDS`` records (the writer lets its encoder run)."""
    dumps = orjson.dumps
    data = bytearray()
    lengths: list[int] = []
    append = lengths.append
    try:
        for start in range(0, len(records), PULSE_RECORDS):
            for r in records[start : start + PULSE_RECORDS]:
                encoded = dumps(r)
                data += encoded
                append(len(encoded))
            if pulse is not None:
                pulse()
    except TypeError as exc:
        raise InvalidRecordError(f"a record is not JSON-serialisable: {exc}") from None
    payloads = PackedPayloads(data, lengths)
    return (
        _column(records, "rollout_id", "rollout_id"),
        _column(records, "attempt", "attempt"),
        _column(records, key, "the member key"),
        payloads,
        None if revision is None else _column(records, revision, "the revision"),
        None if refs is None else [refs(r) for r in records],
    )
