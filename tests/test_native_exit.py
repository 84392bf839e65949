"""A process that used the SDK exits cleanly, whatever native threads are still winding down.

pyarrow's default Parquet reads (``pre_buffer=True``) run on Arrow's I/O thread pool; over a
Python file object those native threads call into Python and now and then drop the last
reference to the stream. One that does so while the interpreter finalizes is ended by CPython
inside a C++ destructor: ``terminate called without an active exception`` and SIGABRT, after the
work was done (issue 18, item 13: the crash tests' ``recover`` worker). Every Parquet read of the
SDK goes through ``open_parquet_file``, which reads on the calling thread only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import rollout_checkpoint
from rollout_checkpoint.archive import ArchiveWriter, _reader
from rollout_checkpoint.format import ArchiveReader, layout
from rollout_checkpoint.store import LocalStore, MemoryStore

WORKER = Path(__file__).with_name("_native_exit_worker.py")


def test_a_process_exits_cleanly_right_after_reading_token_shards(tmp_path: Path) -> None:
    """Before the fix the worker aborted (exit -6) within a few dozen reads: pyarrow's I/O
    threads called the streams and released some of them while the interpreter finalized."""
    report = _run(tmp_path, "reads", 200)
    assert report == {"reads": 200, "released_elsewhere": False, "callers": ["MainThread"]}


def test_an_upload_in_flight_ends_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """A served participant stopped while it uploads: the upload thread is joined before the
    interpreter finalizes (it was a daemon thread that still ran pyarrow then, 4 runs in 5), the
    process exits 0, and nothing half written is published: a manifest, if the upload got that
    far, describes a whole archive."""
    out = _run(tmp_path, "upload", 400)
    assert out == [
        {"uploading": ["upload-agent/agent-0-ck-exit"]},
        {"uploading_at_finalization": []},
    ]
    prefix = layout.component_prefix("ck-exit", "agent", "agent-0")
    store = LocalStore(tmp_path, fsync=False)
    if store.exists(f"{prefix}/manifest.json"):
        ArchiveReader.open(store, prefix).verify()


def _run(root: Path, mode: str, number: int) -> Any:
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(root), mode, str(number)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "terminate called" not in proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return lines[0] if len(lines) == 1 else lines


def test_a_member_lookup_decodes_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranged read of one row group is served from memory by a file object; pyarrow calls
    it from this thread only."""
    callers: set[str] = set()

    class Recording(_reader.WindowFile):
        def readinto(self, buffer: Any) -> int:
            callers.add(threading.current_thread().name)
            return super().readinto(buffer)

        def seek(self, pos: int, whence: int = 0) -> int:
            callers.add(threading.current_thread().name)
            return super().seek(pos, whence)

    monkeypatch.setattr(_reader, "WindowFile", Recording)
    store = MemoryStore("native-exit")
    writer = ArchiveWriter(store, "ck/agent", checkpoint_id="c1", participant_kind="agent", instance="a0")
    records = [{"rollout_id": f"r{i}", "attempt": 0, "n": i} for i in range(50)]
    writer.write_records("boundary", records, key=lambda r: "t0")
    writer.commit()
    raw = ArchiveReader.open(store, "ck/agent").get_raw("boundary", "r7", 0, "t0")
    assert json.loads(raw.payload)["n"] == 7
    assert callers == {threading.current_thread().name}


def test_every_parquet_read_of_the_sdk_goes_through_open_parquet_file() -> None:
    """``pq.ParquetFile``/``pq.read_table``/``dataset`` default to pre-buffered reads on Arrow's
    I/O pool: the SDK opens Parquet for reading in one place only."""
    root = Path(rollout_checkpoint.__file__).parent
    opener = root / "archive" / "_parquet_io.py"
    pattern = re.compile(r"\b(pq|parquet|ds|dataset)\.(ParquetFile|read_table|ParquetDataset|dataset)\(")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in sorted(root.rglob("*.py"))
        if path != opener
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "open Parquet with open_parquet_file:\n" + "\n".join(found)
