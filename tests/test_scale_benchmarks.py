"""The scale benchmarks run and measure what they say, at tiny sizes: ``steady_state.py`` (an
incremental checkpoint writes less than the full one, memory figures per process) and
``million.py`` (the reader classifies every rollout from manifests and indexes, reading no shard).
No figure here is timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_steady_state_writes_what_moved_and_reports_memory(tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = _run(
        "steady_state.py",
        "--rollouts",
        "200",
        "--runs",
        "1",
        "--transport",
        "inprocess",
        "--store",
        str(store),
    )
    (row,) = out["results"]
    assert row["rollouts"] == 200 and row["moved"] == 20
    for mode in ("sync", "async"):
        (checkpoint,) = row[mode]["checkpoints"]
        assert checkpoint["mode"] == mode and checkpoint["pause_s"] > 0
        # incremental: the moved rollouts' records, not everyone's again
        assert 0 < checkpoint["bytes_new"] < row["first"]["bytes_new"]
        assert checkpoint["objects_new"] == sum(n for n, _ in checkpoint["new_by_category"].values())
        assert any(k.startswith("component agent: refs-") for k in checkpoint["new_by_category"])
        (process,) = checkpoint["rss"]["processes"].values()
        assert process["peak_mb"] >= process["before_mb"] > 0
    assert store.is_dir()  # --store is kept


@pytest.mark.slow
def test_million_reads_manifests_and_indexes_only(tmp_path: Path) -> None:
    args = ("--rollouts", "300", "--participants", "4", "--runs", "1", "--store", str(tmp_path))
    out = _run("million.py", *args)
    (row,) = out["results"]
    assert row["dispositions"] == {"completed": 0, "continue": 300, "fresh_dispatch": 0}
    assert row["build"]["reused"] is False and row["cpu_seconds"] > 0
    (again,) = _run("million.py", *args)["results"]  # --store: the built checkpoint is read again
    assert again["build"]["reused"] is True and again["dispositions"] == row["dispositions"]
    assert row["payload_objects_read"] == 0 and 0 < row["objects_read"] < row["build"]["objects"]
    assert row["peak_rss_mb"] >= row["rss_before_mb"] > 0
