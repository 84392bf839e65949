"""What tracing costs the checkpoint pause: ``checkpoint_cycle.py`` with ``--tracing off`` and
``--tracing on`` (and, with ``--baseline``, an uninstrumented source tree), interleaved in one run.

    python benchmarks/tracing_overhead.py [--rollouts 10000] [--runs 7] [--baseline SRC_TREE] [--json]

Each run is a fresh process (the OpenTelemetry API takes one provider per process) doing one
cycle at N rollouts; the modes alternate run by run so that a slow spell of the shared machine
falls on all of them. Reported: the median pause (wall and CPU seconds) of each mode and its
ratio to ``off`` (the API without a provider) and, with ``--baseline``, ``off`` against the
baseline tree (a clone of the code before instrumentation, run by its own
``benchmarks/checkpoint_cycle.py`` with ``PYTHONPATH=SRC_TREE/src``).

Wall-clock pauses on a busy machine vary by more than what tracing costs, so the script also
measures the CPU time of one instrumented operation (a span and its duration record, 20,000
times in a fresh process, per mode) and multiplies it by the spans one cycle makes (counted by
the in-memory exporter): an upper bound of the pause tracing can add, as a fraction of the pause.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median

HERE = Path(__file__).resolve().parent


def run_cycle(mode: str, n: int, baseline: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if mode == "baseline":
        assert baseline is not None
        script = baseline / "benchmarks" / "checkpoint_cycle.py"
        env["PYTHONPATH"] = str(baseline / "src")
        extra: list[str] = []
    else:
        script = HERE / "checkpoint_cycle.py"
        extra = ["--tracing", mode]
    out = subprocess.run(
        [sys.executable, str(script), "--rollouts", str(n), "--runs", "1", "--json", *extra],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])["results"][0]
    return row


_SPAN_COST = """
import sys, time
if sys.argv[1] == "on":
    sys.path.insert(0, sys.argv[2])
    from checkpoint_cycle import install_tracing
    install_tracing()
from rollout_checkpoint.telemetry import Attr, Span, operation
attributes = {Attr.CHECKPOINT_ID: "ck-cost", Attr.PARTICIPANT_KIND: "model", Attr.PARTICIPANT_INSTANCE: "m-0"}
metric = {Attr.PARTICIPANT_KIND: "model"}
n = 20000
started = time.process_time()
for _ in range(n):
    with operation(Span.participant("prepare"), attributes=attributes, metric=metric):
        pass
print((time.process_time() - started) / n)
"""


def span_cost(mode: str) -> float:
    """CPU seconds of one ``operation()`` (span, duration record) in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _SPAN_COST, mode, str(HERE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None, help="source tree without instrumentation")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    modes = (["baseline"] if args.baseline else []) + ["off", "on"]
    rows: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for run in range(args.runs):
        for mode in modes:
            row = run_cycle(mode, args.rollouts, args.baseline)
            rows[mode].append(row)
            if not args.json:
                print(
                    f"run {run + 1} {mode:>8}: pause {row['pause_s']:.3f}s cpu {row['pause_cpu_s']:.3f}s",
                    flush=True,
                )
    summary: dict[str, Any] = {
        "benchmark": "tracing_overhead",
        "rollouts": args.rollouts,
        "runs": args.runs,
        "machine": machine_info(),
        "spans_per_cycle": rows["on"][-1].get("spans"),
    }
    for mode in ("off", "on"):
        summary[f"{mode}_cpu_s_per_span"] = median([span_cost(mode) for _ in range(args.runs)])
        # what the spans of one cycle cost at most, against the pause without a provider
        summary[f"{mode}_span_bound_of_pause"] = (
            summary[f"{mode}_cpu_s_per_span"]
            * (summary["spans_per_cycle"] or 0)
            / median([r["pause_s"] for r in rows["off"]])
        )
    for mode in modes:
        summary[f"{mode}_pause_s"] = median([r["pause_s"] for r in rows[mode]])
        summary[f"{mode}_pause_cpu_s"] = median([r["pause_cpu_s"] for r in rows[mode]])
    for key in ("pause_s", "pause_cpu_s"):
        summary[f"ratio_on_off_{key}"] = summary[f"on_{key}"] / summary[f"off_{key}"]
        if args.baseline:
            summary[f"ratio_off_baseline_{key}"] = summary[f"off_{key}"] / summary[f"baseline_{key}"]
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            if key.startswith("ratio") or key.endswith(("_s", "_span", "_pause")):
                print(f"{key:<32} {value:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
