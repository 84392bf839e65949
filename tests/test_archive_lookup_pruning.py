"""A cold lookup decodes only the member index's row groups whose ``rollout_id`` statistics may
hold the member, and finds the same member (or none) as a full scan."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_checkpoint.archive import ArchiveWriter, MemberNotFoundError, _index
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.store import MemoryStore

PREFIX = "ckpt/components/agent/a0"


def _archive(ids: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[MemoryStore, list[dict[str, Any]]]:
    monkeypatch.setattr(_index, "INDEX_FLUSH_ROWS", 40)  # many index row groups
    store = MemoryStore(f"prune-{uuid.uuid4().hex}")
    records = [{"rollout_id": rid, "attempt": i % 2, "turn": i % 3, "n": i} for i, rid in enumerate(ids)]
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c1", participant_kind="agent", instance="a0", row_group_rows=16
    )
    for start in range(0, len(records), 50):
        writer.write_records("boundary", records[start : start + 50], key=lambda r: f"t{r['turn']}")
    writer.commit()
    return store, records


def _get(store: MemoryStore, rec: dict[str, Any]) -> dict[str, Any]:
    reader = ArchiveReader.open(store, PREFIX)  # a fresh reader: a cold lookup
    raw = reader.get_raw("boundary", rec["rollout_id"], rec["attempt"], f"t{rec['turn']}")
    return dict(json.loads(raw.payload))


def test_ids_written_in_order_decode_one_index_row_group(monkeypatch: pytest.MonkeyPatch) -> None:
    store, records = _archive([f"r{i:05d}" for i in range(400)], monkeypatch)
    decoded: list[list[int]] = []
    real = _index.MemberIndex._scan_row_groups

    def spy(self: Any, groups: list[int], *args: Any) -> Any:
        decoded.append(groups)
        return real(self, groups, *args)

    monkeypatch.setattr(_index.MemberIndex, "_scan_row_groups", spy)
    for rec in (records[0], records[123], records[-1]):
        assert _get(store, rec) == rec
    assert decoded and all(len(groups) == 1 for groups in decoded)
    reader = ArchiveReader.open(store, PREFIX)
    assert reader._member_index()._pf.metadata.num_row_groups >= 8  # the pruning had a choice
    with pytest.raises(MemberNotFoundError):  # inside a row group's id range, but not written
        reader.get_raw("boundary", "r00123", 1 - records[123]["attempt"], "t0")
    with pytest.raises(MemberNotFoundError):  # outside every row group's id range
        ArchiveReader.open(store, PREFIX).get_raw("boundary", "zzz", 0, "t0")


def test_ids_in_random_order_fall_back_to_a_full_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"r{i:05d}" for i in range(300)]
    random.Random(7).shuffle(ids)
    store, records = _archive(ids, monkeypatch)
    for rec in random.Random(8).sample(records, 12):
        assert _get(store, rec) == rec


@settings(max_examples=25, deadline=None)
@given(
    ids=st.lists(
        st.text("aB0._-", min_size=1, max_size=4).filter(lambda s: ".." not in s).map(lambda s: "r" + s),
        min_size=1,
        max_size=150,
    ),
    sort=st.booleans(),
    probe=st.text("aB0._-", min_size=1, max_size=4).filter(lambda s: ".." not in s),
)
def test_pruned_lookups_agree_with_the_records(ids: list[str], sort: bool, probe: str) -> None:
    """Any ids (characters on both sides of each other in byte order), in order or not, repeated
    across attempts: every member is found, a probe that was never written is not."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        ids = sorted(ids) if sort else ids
        # (rollout_id, attempt, turn) must be unique: repeats of an id get other attempts/turns
        seen: dict[str, int] = {}
        unique = []
        for rid in ids:
            seen[rid] = seen.get(rid, 0) + 1
            if seen[rid] <= 6:
                unique.append(rid)
        monkeypatch.setattr(_index, "INDEX_FLUSH_ROWS", 8)
        store = MemoryStore(f"prune-{uuid.uuid4().hex}")
        counters: dict[str, int] = {}
        records = []
        for n, rid in enumerate(unique):
            c = counters.get(rid, 0)
            counters[rid] = c + 1
            records.append({"rollout_id": rid, "attempt": c // 3, "turn": c % 3, "n": n})
        writer = ArchiveWriter(
            store, PREFIX, checkpoint_id="c1", participant_kind="agent", instance="a0", row_group_rows=4
        )
        writer.write_records("boundary", records, key=lambda r: f"t{r['turn']}")
        writer.commit()
        for rec in records:
            assert _get(store, rec) == rec
        missing = "r" + probe
        if missing not in counters:
            with pytest.raises(MemberNotFoundError):
                ArchiveReader.open(store, PREFIX).get_raw("boundary", missing, 0, "t0")


def test_a_cold_lookup_imports_neither_pandas_nor_pyarrow_parquet_nor_the_compute_wrappers(
    tmp_path: Path,
) -> None:
    """A lookup's Arrow scalars and arrays are built from bytes and its Parquet reads go through
    ``pyarrow._parquet``: no ``pa.scalar`` / ``pa.array`` of a Python value (which imports pandas
    when it is installed, as beside NeMo Gym), no ``pyarrow.parquet`` (and its filesystem
    bindings), no ``pyarrow.compute`` wrappers; the record found is the one written."""
    from rollout_checkpoint.store import LocalStore

    writer = ArchiveWriter(
        LocalStore(str(tmp_path)),
        "p",
        checkpoint_id="c",
        participant_kind="agent",
        instance="a0",
        row_group_rows=16,
    )
    records = [{"rollout_id": f"r{i:03d}", "attempt": 0, "n": i} for i in range(100)]
    writer.write_records("boundary", records, key=lambda r: "k")
    writer.commit()
    code = (
        "import sys, json\n"
        "from rollout_checkpoint.format import ArchiveReader\n"
        "from rollout_checkpoint.store import LocalStore\n"
        "heavy = ['pandas', 'pyarrow.parquet', 'pyarrow.fs', 'pyarrow.compute']\n"
        "before = sorted(m for m in heavy if m in sys.modules)\n"
        f"raw = ArchiveReader.open(LocalStore({str(tmp_path)!r}), 'p').get_raw('boundary', 'r042', 0, 'k')\n"
        "print(json.loads(raw.payload)['n'])\n"
        "print(before, sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == ["42", "[] []"]


def test_lookup_scalars_equal_pyarrows() -> None:
    import pyarrow as pa

    for value in ("", "r-00042", "é✓", 0, -1, 7, (1 << 63) - 1, -(1 << 63)):
        assert _index.scalar(value).equals(
            pa.scalar(value, pa.string() if isinstance(value, str) else pa.int64())
        )
    assert _index.int64_array([3, 0, -2]).equals(pa.array([3, 0, -2], pa.int64()))
