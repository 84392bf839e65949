"""``benchmarks/million.py`` builds its checkpoint per group of participants (child processes
whose participants' real prepare, commit and resume answers are replayed to a real coordinator)
and the result is the checkpoint the one-process build writes: the same objects, of the same
sizes (but the agents' shards of random state), read and classified the same. No figure here is
timed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MILLION = Path(__file__).resolve().parents[1] / "benchmarks" / "million.py"


def _run(store: Path, groups: int) -> dict[str, Any]:
    args = ["--rollouts", "240", "--participants", "6", "--runs", "1", "--build-groups", str(groups)]
    proc = subprocess.run(
        [sys.executable, str(MILLION), *args, "--store", str(store), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    result: dict[str, Any] = row
    return result


def _objects(store: Path) -> dict[str, int]:
    """Every stored object's key (ids of the build replaced) -> its size, but the agents' shards
    (random state) and the benchmark's marker."""
    (built,) = store.iterdir()
    return {
        re.sub("[0-9a-f]{32}", "X", str(p.relative_to(built))): p.stat().st_size
        for p in built.rglob("*")
        if p.is_file() and p.name != "built.json" and not ("/agent/" in str(p) and "/shards/" in str(p))
    }


@pytest.mark.slow
def test_grouped_build_writes_the_one_process_checkpoint(tmp_path: Path) -> None:
    one = _run(tmp_path / "one", 0)
    grouped = _run(tmp_path / "grouped", 2)
    assert one["build"]["mode"] == "one process" and grouped["build"]["mode"] == "2 groups"
    groups = grouped["build"]["groups"]
    assert [g["pairs"] for g in groups] == [[0, 2], [1]]  # agent and resources k, k = 0..2
    assert [g["rollouts"] for g in groups] == [160, 80]  # rollout i on pair i mod 3
    assert grouped["build"]["publish"]["timings"]["validate"] > 0  # the coordinator validated them
    assert _objects(tmp_path / "grouped") == _objects(tmp_path / "one")
    for key in ("objects_read", "payload_objects_read", "dispositions"):
        assert grouped[key] == one[key], key
    assert grouped["dispositions"] == {"completed": 0, "continue": 240, "fresh_dispatch": 0}
    assert abs(grouped["bytes_read"] - one["bytes_read"]) < 64  # ids and times only
