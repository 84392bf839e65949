"""The writer's encoding pipeline: row groups queued to one encoder thread, every Parquet write on
that thread, and per-row-group hashes of bytes that reach the store in arbitrary chunks."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_checkpoint.archive import ArchiveWriter, _bulk, _index, _shard, _shards
from rollout_checkpoint.archive._shard import _HashingSink
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.store import LocalStore, ObjectStore

PREFIX = "ckpt/components/agent/a0"


def _records(n: int, size: int = 900) -> list[dict[str, Any]]:
    return [
        {"rollout_id": f"r{i:05d}", "attempt": 0, "turn": i % 7, "state": f"{i:06d}" * (size // 6)}
        for i in range(n)
    ]


def _write(store: ObjectStore, records: list[dict[str, Any]], **options: Any) -> ArchiveWriter:
    writer = ArchiveWriter(
        store, PREFIX, checkpoint_id="c1", participant_kind="agent", instance="a0", **options
    )
    for start in range(0, len(records), 97):
        writer.write_records("boundary", records[start : start + 97], key=lambda r: f"{r['turn']:04d}")
    writer.commit()
    return writer


# -- the sink: row-group hashes of bytes arriving in any chunks -----------------------------------
@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 400), min_size=1, max_size=40),
    late_marks=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_sink_splits_any_chunking_at_the_marked_row_group_ends(
    lengths: list[int], cuts: list[int], late_marks: list[bool]
) -> None:
    """Bytes come in chunks that ignore row-group ends; an end is marked before any byte after
    it arrives, but possibly after all of its own bytes did (``late_marks``)."""
    head, footer = b"PAR1", b"footer-bytes"
    groups = [bytes((g * 37 + i) % 251 for i in range(n)) for g, n in enumerate(lengths)]
    inner = io.BytesIO()
    sink = _HashingSink(inner)
    sink.write(head)
    sink.begin_segments()
    pending = bytearray()
    pos = len(head)
    cut_iter = itertools.cycle(cuts)

    def hand_on(limit: int) -> None:
        # pass on pending bytes, in chunks, but never more than ``limit`` bytes in total
        nonlocal pending
        while len(pending) > limit:
            n = min(next(cut_iter), len(pending) - limit)
            sink.write(bytes(pending[:n]))
            del pending[:n]

    for g, data in enumerate(groups):
        pending += data
        pos += len(data)
        if late_marks[g]:
            hand_on(0)  # every byte of the row group arrives before its end is marked
        sink.mark(pos)
        hand_on(len(pending) // 2)
    hand_on(0)
    sink.end_segments()
    sink.write(footer)

    offsets = [len(head) + sum(lengths[:g]) for g in range(len(groups))]
    assert [(s.offset, s.length) for s in sink.spans] == list(zip(offsets, lengths, strict=True))
    assert [s.sha256 for s in sink.spans] == [hashlib.sha256(g).hexdigest() for g in groups]
    whole = head + b"".join(groups) + footer
    assert inner.getvalue() == whole and sink.hexdigest() == hashlib.sha256(whole).hexdigest()


def test_sink_refuses_bytes_of_an_unmarked_row_group_end() -> None:
    sink = _HashingSink(io.BytesIO())
    sink.begin_segments()
    sink.write(b"abcdef")
    sink.mark(4)  # an end behind bytes already handed on: the encoder's order was broken
    with pytest.raises(AssertionError):
        sink.write(b"g")
    sink2 = _HashingSink(io.BytesIO())
    sink2.begin_segments()
    sink2.mark(10)
    sink2.write(b"abc")
    with pytest.raises(AssertionError):  # closed before the marked row group's bytes arrived
        sink2.end_segments()


# -- one encoder thread for every Parquet write -----------------------------------------------------
def test_every_parquet_write_runs_on_one_encoder_thread(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int]] = []

    class Recording:
        def __init__(self, inner: Any, what: str) -> None:
            self._inner, self._what = inner, what
            calls.append((f"{what}.open", threading.get_ident()))

        def __getattr__(self, name: str) -> Any:
            attr = getattr(self._inner, name)
            if not callable(attr):
                return attr

            def call(*args: Any, **kwargs: Any) -> Any:
                calls.append((f"{self._what}.{name}", threading.get_ident()))
                return attr(*args, **kwargs)

            return call

    for module, what in ((_shard, "shard"), (_index, "index")):
        real = module.open_parquet_writer
        monkeypatch.setattr(
            module,
            "open_parquet_writer",
            lambda *a, _real=real, _what=what, **k: Recording(_real(*a, **k), _what),
        )
    monkeypatch.setattr(_index, "INDEX_FLUSH_ROWS", 64)  # several index row groups
    store = LocalStore(str(tmp_path))
    records = _records(1500)
    _write(store, records, target_shard_bytes=256 << 10, row_group_rows=50)
    threads = {ident for _, ident in calls}
    kinds = {name for name, _ in calls}
    assert {"shard.open", "shard.write_table", "shard.close", "index.open", "index.write_table"} <= kinds
    assert threads and threading.get_ident() not in threads and len(threads) == 1
    reader = ArchiveReader.open(store, PREFIX)
    reader.verify()
    assert list(reader.iter_dicts("boundary")) == records


def test_the_queue_to_the_encoder_is_bounded(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """However slow the encoder, the writer's thread hands over at most ``MAX_INFLIGHT`` row
    groups before it waits: the writer's memory does not grow with what is left to encode."""
    gate = threading.Semaphore(0)
    real_job = _shards._encode_job
    seen: list[int] = []

    def slow_job(*args: Any) -> Any:
        gate.acquire()
        return real_job(*args)

    real_encode = _shards.ShardRotation.encode

    def encode(self: _shards.ShardRotation, table: Any, payload_bytes: int) -> None:
        real_encode(self, table, payload_bytes)
        seen.append(len(self._jobs))
        gate.release()  # one more row group may encode

    monkeypatch.setattr(_shards, "_encode_job", slow_job)
    monkeypatch.setattr(_shards.ShardRotation, "encode", encode)
    records = _records(600)
    _write(LocalStore(str(tmp_path)), records, row_group_rows=20)
    assert max(seen) <= _shards.MAX_INFLIGHT and len(seen) == 30
    reader = ArchiveReader.open(LocalStore(str(tmp_path)), PREFIX)
    assert list(reader.iter_dicts("boundary")) == records


def test_encode_records_pulses_every_few_hundred_records() -> None:
    pulses: list[int] = []
    records = _records(_bulk.PULSE_RECORDS * 2 + 5, size=30)
    columns = _bulk.encode_records(records, "turn", None, None, lambda: pulses.append(1))
    assert len(pulses) == 3 and len(columns[3]) == len(records)
    assert _bulk.encode_records(records, "turn", None, None)[3][7] == columns[3][7]


@pytest.mark.slow
def test_rss_floor_benchmark_runs() -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "rss_floor.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--records", "3000", "--runs", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    peaks = result["peak_rss_mb"]
    assert set(peaks) == {"baseline", "pyarrow_import", "arrow_tables", "naive_parquet", "sdk"}
    assert all(isinstance(v, float) and v > 0 for v in peaks.values())
    assert peaks["pyarrow_import"] > peaks["baseline"]  # pyarrow's import alone weighs
