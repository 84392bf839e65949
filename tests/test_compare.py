"""benchmarks/compare.py, the regression guard: its table and flags on synthetic results, a base
that cannot run a benchmark, an unknown revision, and one real (quick, one-benchmark) run
against HEAD in a temporary git worktree that is removed afterwards."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compare.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


compare = _load()


def _results(name: str, base: dict[str, list[float]], new: dict[str, list[float]]) -> dict[str, object]:
    return {name: {"base": base, "new": new}}


def test_flags_only_what_is_worse_beyond_the_threshold_in_its_bad_direction() -> None:
    bench = compare.Benchmark(
        "synthetic",
        "none.py",
        (),
        (),
        (
            compare.Figure("slower", compare.LOWER, lambda o: 0.0),
            compare.Figure("faster", compare.LOWER, lambda o: 0.0),
            compare.Figure("within", compare.LOWER, lambda o: 0.0),
            compare.Figure("speedup fell", compare.HIGHER, lambda o: 0.0),
            compare.Figure("speedup rose", compare.HIGHER, lambda o: 0.0),
            compare.Figure("base could not", compare.LOWER, lambda o: 0.0),
        ),
    )
    results = _results(
        "synthetic",
        base={
            "slower": [1.0, 1.0, 9.0],  # median 1.0: one outlier round does not count
            "faster": [2.0, 2.0, 2.0],
            "within": [1.0, 1.0, 1.0],
            "speedup fell": [47.5, 47.5],
            "speedup rose": [12.5, 12.5],
            "base could not": [],
        },
        new={
            "slower": [1.2, 1.3, 1.2],
            "faster": [1.0, 1.0, 1.0],
            "within": [1.09, 1.09, 1.09],
            "speedup fell": [12.5, 12.5],
            "speedup rose": [47.5, 47.5],
            "base could not": [3.0],
        },
    )
    rows = {r["figure"]: r for r in compare.table_rows(results, [bench], 0.10)}
    assert rows["slower"]["flag"] == "WORSE" and rows["slower"]["ratio"] == pytest.approx(1.2)
    assert rows["faster"]["flag"] == "" and rows["faster"]["ratio"] == pytest.approx(0.5)
    assert rows["within"]["flag"] == ""
    assert rows["speedup fell"]["flag"] == "WORSE"
    assert rows["speedup fell"]["worse_by"] == pytest.approx(47.5 / 12.5 - 1)
    assert rows["speedup rose"]["flag"] == ""
    assert rows["base could not"]["base"] is None and rows["base could not"]["flag"] == ""
    assert compare.exit_status(list(rows.values()), no_fail=False) == 1
    assert compare.exit_status(list(rows.values()), no_fail=True) == 0
    calm = [r for r in rows.values() if not r["flag"]]
    assert compare.exit_status(calm, no_fail=False) == 0
    table = compare.format_table(list(rows.values()))
    assert "WORSE" in table and "n/a" in table and table.count("\n") == len(rows) + 1


def test_the_new_side_failing_is_flagged() -> None:
    bench = compare.Benchmark("b", "none.py", (), (), (compare.Figure("f", compare.LOWER, lambda o: 0.0),))
    rows = compare.table_rows(_results("b", {"f": [1.0]}, {"f": []}), [bench], 0.10)
    assert rows[0]["flag"] == "FAILED" and compare.exit_status(rows, no_fail=False) == 1


def test_reads_the_json_a_benchmark_prints_last_on_one_line_or_indented() -> None:
    assert compare.parse_json_output('progress\n{"a": 1}\n') == {"a": 1}
    indented = json.dumps({"a": {"b": [1, 2]}, "c": 3}, indent=1)
    assert compare.parse_json_output("N=10: done\n" + indented + "\n") == {"a": {"b": [1, 2]}, "c": 3}
    with pytest.raises(ValueError):
        compare.parse_json_output("no json here\n")


def test_a_base_that_lacks_what_a_script_needs_is_na_not_a_crash(tmp_path: Path) -> None:
    package = tmp_path / "src" / "rollout_checkpoint"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")  # a library with none of the modules imported
    figures, error, _ = compare.run_side(compare.BY_NAME["steady_state"], tmp_path, quick=True, timeout=120)
    assert figures == {} and error is not None and "exit 1" in error


def test_an_unknown_revision_is_one_line_and_exit_2() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "no-such-revision-26"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no-such-revision-26" in lines[0] and "Traceback" not in out.stderr


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_quick_run_of_one_benchmark_against_head() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "HEAD",
            "--quick",
            "--only",
            "cli_startup",
            "--rounds",
            "1",
            "--no-fail",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["base_sha"] == _git("rev-parse", "HEAD").strip() and summary["errors"] == {}
    rows = summary["rows"]
    assert [r["figure"] for r in rows] == ["import", "--version", "list --json"]
    assert all(r["base"] > 0 and r["new"] > 0 and r["ratio"] is not None for r in rows)
    assert "new/base" in out.stdout  # the table
    checkout = summary["base_worktree"]
    assert "compare-base-" in checkout and not Path(checkout).exists()  # the base's checkout is gone
    assert checkout not in _git("worktree", "list", "--porcelain")  # and unregistered
