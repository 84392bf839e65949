"""``archive.UnitedReferences``: a worker group's reference table over its parts, in Arrow, and
its duplicate count (sorted identities, each compared with the one before)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rollout_checkpoint.archive import UnitedReferences
from rollout_checkpoint.archive._references import REFERENCE_SCHEMA


class _Part:
    """What the united table reads of a part: its stored members and its references."""

    def __init__(
        self, stored: list[tuple[str, str, int, str]], referenced: list[tuple[str, str, int, str, int]]
    ):
        self.stored = stored
        self.referenced = referenced

    def stored_arrays(self) -> list[pa.ChunkedArray]:
        rows = [(k, r, a, key, 1, None, 0, 0, i) for i, (k, r, a, key) in enumerate(self.stored)]
        types = [f.type for f in REFERENCE_SCHEMA if f.name != "base"]
        return [pa.chunked_array([pa.array([row[i] for row in rows], type=t)]) for i, t in enumerate(types)]

    def reference_arrays(self) -> list[pa.ChunkedArray]:
        rows = [
            (k, r, a, key, 1, None, base, 0, 0, i) for i, (k, r, a, key, base) in enumerate(self.referenced)
        ]
        return [
            pa.chunked_array([pa.array([row[i] for row in rows], type=f.type)], type=f.type)
            for i, f in enumerate(REFERENCE_SCHEMA)
        ]


def _united(*parts: tuple[Any, int, list[int]]) -> UnitedReferences:
    united = UnitedReferences()
    for part, own, bases in parts:
        united.add_stored(part, own)
        united.add_references(part, bases)
    return united


def test_columns_unite_stored_and_referenced_members_with_their_bases() -> None:
    a = _Part([("agent_boundary", "r1", 0, "")], [("agent_boundary", "r2", 0, "", 0)])
    b = _Part([("agent_boundary", "r3", 1, "")], [])
    united = _united((a, 0, [5]), (b, 1, []))
    columns = united.columns()
    assert [c.type for c in columns] == [f.type for f in REFERENCE_SCHEMA]
    assert columns[1].to_pylist() == ["r1", "r2", "r3"]
    assert columns[6].to_pylist() == [0, 5, 1]  # own base, the reference's base mapped, own base
    assert united.repeated() == 0


def test_repeated_counts_every_extra_copy_of_an_identity() -> None:
    twice = ("resource_snapshot", "r1", 0, "env")
    a = _Part([twice, ("resource_snapshot", "r1", 1, "env")], [])  # another attempt: distinct
    b = _Part([twice, ("resource_snapshot", "r1", 0, "other")], [(*twice, 0)])  # stored + referenced
    assert _united((a, 0, []), (b, 1, [0])).repeated() == 2
    assert _united((a, 0, [])).repeated() == 0
    assert UnitedReferences().repeated() == 0
