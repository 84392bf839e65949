"""Decoded records over a component archive.

The archive layer reads raw members (kind, identity, key, payload bytes) and knows nothing of
the record models; :class:`ArchiveReader` adds what this format defines on top: decoding each
payload into its record model (:func:`~rollout_checkpoint.format.records.decode_record`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..archive import RawArchiveReader
from .records import Record, decode_record

__all__ = ["MEMBER_COLUMNS", "ArchiveReader"]

MEMBER_COLUMNS = ("rollout_id", "attempt", "key", "revision", "refs")
"""What :meth:`ArchiveReader.member_columns` gives per kind, in this order (``refs``: JSON text)."""


class ArchiveReader(RawArchiveReader):
    """A committed component archive whose members decode into record models."""

    def iter_records(self, kind: str | None = None) -> Iterator[Record]:
        """Decoded records (``records.decode_record``), shard by shard; see :meth:`iter_raw`."""
        for raw in self.iter_raw(kind):
            yield decode_record(raw.kind, raw.payload)

    def get(self, kind: str, rollout_id: str, attempt: int, key: str) -> Record:
        """One decoded record; ``MemberNotFoundError`` when the index has no such member."""
        raw = self.get_raw(kind, rollout_id, attempt, key)
        return decode_record(raw.kind, raw.payload)

    def prepare_member_columns(self) -> None:
        """Fetch, digest-check and decode the index columns :meth:`member_columns` reads (it
        does this itself when not done): a bulk reader runs it for the next archives on other
        threads while it converts this one, since Arrow decodes without holding the GIL."""
        self._member_index().load("kind", *MEMBER_COLUMNS)

    def member_columns(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, dict[str, list[Any]]]:
        """The members by kind, as Python lists of index columns, from the index only (no shard
        is read): per kind the stored members in write order, then (version 2) the referenced
        ones, as :meth:`members` yields them, with ``refs`` left as the stored JSON text.

        ``wanted[kind]`` names the columns (of ``MEMBER_COLUMNS``) to give for that kind; a kind
        present but not in ``wanted`` gets ``"refs"`` only, and only its non-null texts (for a
        caller that checks every refs text parses). A bulk reader's view: a million members cost
        a few column conversions, not a ``MemberRef`` each."""
        from pyarrow._compute import call_function  # not pyarrow.compute: see archive's compute()

        index = self._member_index()
        index.load("kind", *MEMBER_COLUMNS)
        kinds = index.column("kind")
        out: dict[str, dict[str, list[Any]]] = {}
        unique = call_function("unique", [kinds])
        for i, kind in enumerate(unique.to_pylist()):
            # the Arrow scalar of the column itself: building one from a Python str would make
            # pyarrow import pandas (seconds) to check the value's type
            mask = call_function("equal", [kinds, unique[i]])
            if kind in wanted:
                out[kind] = {
                    name: _pylist(call_function("filter", [index.column(name), mask]), name in _SHARED)
                    for name in wanted[kind]
                }
            else:
                texts = call_function("filter", [index.column("refs"), mask])
                out[kind] = {"refs": call_function("drop_null", [texts]).to_pylist()}
        for r in self.references():
            columns = out.get(r.kind)
            if columns is None:
                names = wanted.get(r.kind, ("refs",))
                columns = out[r.kind] = {name: [] for name in names}
            if r.kind in wanted:
                for name, column in columns.items():
                    column.append(r[_FIELD[name]])
            elif r.refs is not None:
                columns["refs"].append(r.refs)
        return out


_SHARED = frozenset({"key", "refs"})
"""Columns whose values repeat (session names, a dispatch's state): each distinct value becomes
one Python string, shared by its rows."""


def _pylist(column: Any, shared: bool) -> list[Any]:
    """``column.to_pylist()``; with ``shared``, equal strings are one object when the column has
    few distinct values (Arrow dictionary-encodes it: no string built per row, and a repeated
    string's hash is computed once)."""
    if not shared or len(column) < 256:
        return list(column.to_pylist())
    from pyarrow._compute import call_function

    encoded = call_function("dictionary_encode", [column.combine_chunks()])
    values = encoded.dictionary.to_pylist()
    if len(values) * 4 > len(column):
        return list(column.to_pylist())  # mostly distinct: nothing to share
    return [values[i] if i is not None else None for i in encoded.indices.to_pylist()]


_FIELD = {name: i + 1 for i, name in enumerate(MEMBER_COLUMNS)}
"""Position of each ``MEMBER_COLUMNS`` field in a reference row (``Reference``: kind first)."""
