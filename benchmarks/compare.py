"""Regression guard: the headline benchmarks on the working tree against revision BASE.

    python benchmarks/compare.py BASE [--quick] [--rounds R] [--only NAME ...] [--threshold 0.10]
        [--no-fail] [--json]

BASE (any git revision: ``main``, ``HEAD~3``, a sha) is checked out as a temporary
``git worktree`` (removed afterwards). Every benchmark runs on both sides, alternating round by
round (tree then base, then base then tree, ...), in fresh processes of this tree's
``.venv`` python (``sys.executable``) with ``PYTHONPATH=<side>/src``: each side imports its own
library, and both run this tree's benchmark scripts, so both take the same measurement. A
script that needs something the base lacks fails on the base side only: its figures are
reported as ``n/a`` for the base (with the error), not a crash. For an older BASE,
``--base-scripts`` runs the base's own copy of such a script instead (said in the output: the
figure is then what that script measured, with the sizes given here).

The headline figures, and which direction is better (``HEADLINES``; ``--list`` prints them):

* ``async_publication`` (10,000 rollouts; ``--quick``: 2,000): ``sync_pause_s``,
  ``async_pause_s``, lower is better;
* ``peer_store`` (10,000 records; ``--quick``: 2,000): ``lookup_speedup`` over the JSONL peer
  (higher), the SDK's own cold lookup, ``write_ratio`` and ``read_all_ratio`` against the peer
  and ``sdk_peak_rss_mb`` (lower);
* ``demo_scale`` (1,000 rollouts, local store; ``--quick``: 500): HTTP and in-process pause
  p50, lower;
* ``long_run`` (200 rollouts x 10 turns; ``--quick``: 100 x 6): the incremental run's bytes
  written and median pause, and ``incremental_bytes_over_full``, lower;
* ``cli_startup``: ``import rollout_checkpoint``, ``--version`` and ``list DIR --json``, lower;
* ``steady_state`` (10,000 live rollouts in process, 10% moved; ``--quick``: 2,000): sync and
  async pause, bytes written per checkpoint and the peak-over-before RSS ratio, lower.

Each figure is the median over ``--rounds`` (default 3; ``--quick``: 2) of the side's runs. The
table gives base, new, new/base and ``WORSE`` where the new figure is more than ``--threshold``
(10%) worse in the bad direction (lower-is-better: new/base - 1; higher-is-better: base/new - 1).
The exit status is 1 when a figure is flagged (``--no-fail``: 0), 2 on a usage error (an
unknown revision), 0 otherwise. With ``--json`` the last line printed is one JSON object.
``--quick`` finishes within 5 minutes on 2 cores (measured: 230 s at a load average of 19); the
full run takes several times longer. Counts and memory ratios are exact; timings on a busy host
swing by up to 2x with identical code (docs/benchmarks.md, "Calibration"). On a shared machine run it
when the load is low (the load average is reported) and read one flag as a prompt to re-run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
LOWER, HIGHER = "lower", "higher"


@dataclass(frozen=True)
class Figure:
    name: str
    better: str  # LOWER or HIGHER
    extract: Callable[[dict[str, Any]], float]
    unit: str = ""


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    figures: tuple[Figure, ...]


def _median(values: list[float]) -> float:
    xs = sorted(values)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _long_run_pause(out: dict[str, Any]) -> float:
    return _median([c["pause_ms"] for c in out["incremental"]["checkpoints"]])


def _sdk_lookup(out: dict[str, Any]) -> float:
    """The SDK's own cold lookup at the largest size: catches a fixed cost the ratio hides."""
    local = out["local"]
    return float(local[max(local, key=int)]["sdk"]["lookup_s"])


HEADLINES: tuple[Benchmark, ...] = (
    Benchmark(
        "async_publication",
        "async_publication.py",
        ("--rollouts", "10000", "--runs", "1"),
        ("--rollouts", "2000", "--runs", "1"),
        (
            Figure("sync pause", LOWER, lambda o: o["results"][-1]["sync_pause_s"], "s"),
            Figure("async pause", LOWER, lambda o: o["results"][-1]["async_pause_s"], "s"),
        ),
    ),
    Benchmark(
        "peer_store",
        "peer_store.py",
        ("--sizes", "10000", "--runs", "1"),
        ("--sizes", "2000", "--runs", "1"),
        (
            Figure("lookup_speedup", HIGHER, lambda o: o["lookup_speedup"], "x"),
            Figure("SDK cold lookup", LOWER, _sdk_lookup, "s"),
            Figure("write_ratio", LOWER, lambda o: o["write_ratio"], "x"),
            Figure("read_all_ratio", LOWER, lambda o: o["read_all_ratio"], "x"),
            Figure("sdk peak RSS", LOWER, lambda o: o["sdk_peak_rss_mb"], "MB"),
        ),
    ),
    Benchmark(
        "demo_scale",
        "demo_scale.py",
        ("--rollouts", "1000", "--runs", "3", "--stores", "local", "--gap", "0.5"),
        ("--rollouts", "500", "--runs", "2", "--stores", "local", "--gap", "0.2"),
        (
            Figure("HTTP pause p50", LOWER, lambda o: o["results"][0]["http"]["pause_ms_p50"], "ms"),
            Figure(
                "in-process pause p50", LOWER, lambda o: o["results"][0]["in_process"]["pause_ms_p50"], "ms"
            ),
        ),
    ),
    Benchmark(
        "long_run",
        "long_run.py",
        ("--rollouts", "200", "--turns", "10"),
        ("--rollouts", "100", "--turns", "6"),
        (
            Figure(
                "incremental bytes written", LOWER, lambda o: o["incremental"]["bytes_written_total"], "B"
            ),
            Figure("incremental pause median", LOWER, _long_run_pause, "ms"),
            Figure("incremental/full bytes", LOWER, lambda o: o["incremental_bytes_over_full"], "x"),
        ),
    ),
    Benchmark(
        "cli_startup",
        "cli_startup.py",
        ("--runs", "7"),
        ("--runs", "3"),
        (
            Figure("import", LOWER, lambda o: o["seconds"]["import"], "s"),
            Figure("--version", LOWER, lambda o: o["seconds"]["version"], "s"),
            Figure("list --json", LOWER, lambda o: o["seconds"]["list"], "s"),
        ),
    ),
    Benchmark(
        "steady_state",
        "steady_state.py",
        ("--rollouts", "10000", "--transport", "inprocess", "--runs", "1"),
        ("--rollouts", "2000", "--transport", "inprocess", "--runs", "1"),
        (
            Figure("sync pause", LOWER, lambda o: o["results"][0]["sync"]["pause_s"], "s"),
            Figure("async pause", LOWER, lambda o: o["results"][0]["async"]["pause_s"], "s"),
            Figure("bytes per checkpoint", LOWER, lambda o: o["results"][0]["sync"]["bytes_new"], "B"),
            Figure("RSS peak/before", LOWER, lambda o: o["results"][0]["rss_peak_over_before"], "x"),
        ),
    ),
)
BY_NAME = {b.name: b for b in HEADLINES}


# -- the table: pure, tested on synthetic results ---------------------------------------------


def worse_by(better: str, base: float, new: float) -> float:
    """How much worse ``new`` is than ``base`` (0.25 = 25% worse; negative = better)."""
    if better == LOWER:
        return new / base - 1 if base else (0.0 if new == base else float("inf"))
    return base / new - 1 if new else (0.0 if new == base else float("inf"))


def table_rows(
    results: dict[str, dict[str, dict[str, list[float]]]],
    benchmarks: list[Benchmark],
    threshold: float,
) -> list[dict[str, Any]]:
    """One row per headline figure from ``results[bench][side][figure]`` (the rounds' values;
    an empty list: that side could not run it): medians, new/base and the flag."""
    rows = []
    for bench in benchmarks:
        sides = results.get(bench.name, {})
        for fig in bench.figures:
            base_vals = sides.get("base", {}).get(fig.name, [])
            new_vals = sides.get("new", {}).get(fig.name, [])
            base = _median(base_vals) if base_vals else None
            new = _median(new_vals) if new_vals else None
            row: dict[str, Any] = {
                "benchmark": bench.name,
                "figure": fig.name,
                "unit": fig.unit,
                "better": fig.better,
                "base": base,
                "new": new,
                "ratio": None,
                "worse_by": None,
                "flag": "",
            }
            if base is not None and new is not None:
                row["ratio"] = new / base if base else None
                row["worse_by"] = worse_by(fig.better, base, new)
                if row["worse_by"] > threshold:
                    row["flag"] = "WORSE"
            elif new is None:
                row["flag"] = "FAILED"  # the working tree could not run its own benchmark
            rows.append(row)
    return rows


def exit_status(rows: list[dict[str, Any]], no_fail: bool) -> int:
    return 0 if no_fail or not any(r["flag"] for r in rows) else 1


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("benchmark", "figure", "better", "base", "new", "new/base", "flag")
    lines = [header]
    for r in rows:
        unit = f" {r['unit']}" if r["unit"] else ""
        lines.append(
            (
                r["benchmark"],
                r["figure"],
                r["better"],
                _fmt(r["base"]) + unit,
                _fmt(r["new"]) + unit,
                "n/a" if r["ratio"] is None else f"{r['ratio']:.3f}",
                r["flag"],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


# -- running the benchmarks -------------------------------------------------------------------


def parse_json_output(stdout: str) -> dict[str, Any]:
    """The JSON object a benchmark prints last: one line, or (``indent``) from the last line
    that opens it at column 0 to the end."""
    lines = stdout.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            with contextlib.suppress(ValueError):
                value = json.loads("\n".join(lines[i:]))
                if isinstance(value, dict):
                    return value
    raise ValueError("no JSON object in the output")


def run_side(
    bench: Benchmark, src_tree: Path, quick: bool, timeout: float, scripts: Path = HERE
) -> tuple[dict[str, float], str | None, float]:
    """Run ``bench`` once with ``src_tree``'s library and the script in ``scripts``:
    (figures, error or None, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(src_tree / "src")}
    argv = [sys.executable, str(scripts / bench.script), *(bench.quick if quick else bench.full), "--json"]
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {}, f"timed out after {timeout:.0f} s", time.perf_counter() - started
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {}, f"exit {proc.returncode}: {tail}", elapsed
    try:
        out = parse_json_output(proc.stdout)
        return {f.name: float(f.extract(out)) for f in bench.figures}, None, elapsed
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return {}, f"unreadable output: {exc!r}", elapsed


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(TREE), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextlib.contextmanager
def base_worktree(revision: str) -> Iterator[tuple[Path, str]]:
    """Check ``revision`` out in a temporary git worktree; yield (path, sha); remove it after."""
    sha = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    scratch = Path(tempfile.mkdtemp(prefix="compare-base-"))
    path = scratch / "base"
    _git("worktree", "add", "--detach", "--quiet", str(path), sha)
    try:
        yield path, sha
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "remove", "--force", str(path))
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(subprocess.CalledProcessError):
            _git("worktree", "prune")


def compare(
    base_tree: Path,
    benchmarks: list[Benchmark],
    rounds: int,
    quick: bool,
    timeout: float,
    log: Callable[[str], None],
    base_scripts: bool = False,
) -> tuple[dict[str, dict[str, dict[str, list[float]]]], dict[str, list[str]]]:
    """Every benchmark on both sides, alternating. ``base_scripts``: where this tree's script
    fails on the base, run the base's own copy of it instead (noted in the errors)."""
    results: dict[str, dict[str, dict[str, list[float]]]] = {
        b.name: {"new": {f.name: [] for f in b.figures}, "base": {f.name: [] for f in b.figures}}
        for b in benchmarks
    }
    errors: dict[str, list[str]] = {}
    trees = {"new": TREE, "base": base_tree}
    for r in range(rounds):
        for bench in benchmarks:
            order = ("new", "base") if r % 2 == 0 else ("base", "new")
            for side in order:
                figures, error, elapsed = run_side(bench, trees[side], quick, timeout)
                log(f"round {r + 1}/{rounds} {bench.name:18} {side:4} {elapsed:6.1f} s {error or ''}")
                own = base_tree / "benchmarks"
                if error is not None and side == "base" and base_scripts and (own / bench.script).exists():
                    errors.setdefault(f"{bench.name} (base)", []).append(
                        f"{error}; ran the base's own script"
                    )
                    figures, error, elapsed = run_side(bench, base_tree, quick, timeout, scripts=own)
                    log(
                        f"round {r + 1}/{rounds} {bench.name:18} base (own script) "
                        f"{elapsed:6.1f} s {error or ''}"
                    )
                if error is not None:
                    errors.setdefault(f"{bench.name} ({side})", []).append(error)
                for name, value in figures.items():
                    results[bench.name][side][name].append(value)
    return results, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", nargs="?", help="git revision to compare with (e.g. main, HEAD~1, a sha)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and 2 rounds: under 5 minutes")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick 2)")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), help="run only these benchmarks")
    parser.add_argument("--threshold", type=float, default=0.10, help="flag a figure this much worse (0.10)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a figure is flagged")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed for one benchmark run")
    parser.add_argument(
        "--base-scripts",
        action="store_true",
        help="where this tree's script fails on BASE, run BASE's own copy of it (for an old BASE; "
        "the figure then measures what that script measured)",
    )
    parser.add_argument("--list", action="store_true", help="print the headline figures and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    benchmarks = [BY_NAME[n] for n in args.only] if args.only else list(HEADLINES)
    if args.list:
        for b in benchmarks:
            for f in b.figures:
                print(f"{b.name:18} {f.name:28} {f.better} is better")
        return 0
    if args.base is None:
        parser.error("BASE is required")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rounds = args.rounds or (2 if args.quick else 3)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        checkout = base_worktree(args.base)
        base_path, sha = checkout.__enter__()
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "").strip().splitlines()
        print(
            f"compare.py: cannot check out {args.base!r} as a git worktree of {TREE}"
            + (f": {detail[-1]}" if detail else " (unknown revision?)"),
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        log(f"base {args.base} = {sha[:12]} in {base_path}; {rounds} rounds")
        results, errors = compare(
            base_path, benchmarks, rounds, args.quick, args.timeout, log, base_scripts=args.base_scripts
        )
    finally:
        checkout.__exit__(None, None, None)
    rows = table_rows(results, benchmarks, args.threshold)
    head = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    summary = {
        "benchmark": "compare",
        "base": args.base,
        "base_sha": sha,
        "base_worktree": str(base_path),
        "new_sha": head,
        "new_dirty": dirty,
        "quick": args.quick,
        "rounds": rounds,
        "threshold": args.threshold,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "nproc": os.cpu_count(),
        "rows": rows,
        "errors": errors,
        "base_scripts": args.base_scripts,
        "raw": results,
    }
    print(
        f"base {args.base} ({sha[:12]}) vs working tree ({head[:12]}{', modified' if dirty else ''}); "
        f"medians of {rounds} alternating rounds{' (quick)' if args.quick else ''}; "
        f"{summary['seconds']:.0f} s; load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(format_table(rows))
    for what, messages in errors.items():
        print(f"n/a: {what}: {messages[-1]}")
    flagged = [f"{r['benchmark']} {r['figure']}" for r in rows if r["flag"]]
    print(f"flagged: {', '.join(flagged)}" if flagged else f"no figure more than {args.threshold:.0%} worse")
    if args.json:
        print(json.dumps(summary))
    return exit_status(rows, args.no_fail)


if __name__ == "__main__":
    sys.exit(main())
