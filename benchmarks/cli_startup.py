"""How long the CLI takes to start, in fresh processes, against ``import rollout_checkpoint``.

    python benchmarks/cli_startup.py [--runs 15] [--baseline SRC_TREE] [--json]

Each figure is the median wall time of ``--runs`` fresh processes (interleaved, so a slow spell
of a shared machine falls on all of them): ``python -c pass`` (the interpreter alone),
``python -c "import rollout_checkpoint"``, and the CLI's ``--version``, ``--help``,
``list --help`` and ``list DIR --json`` on an empty local directory, each run through the
console script's own import (``from rollout_checkpoint.cli import main``). The installed
``rollout-checkpoint`` script itself is timed for ``--version`` as well. ``--baseline`` runs the
same CLI commands from another source tree (``PYTHONPATH=SRC_TREE/src``: the code before a
change) in the same loop. Ratios are against ``import rollout_checkpoint`` of this tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median

_MAIN = "import sys; from rollout_checkpoint.cli import main; sys.exit(main())"


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=120
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--baseline", type=Path, default=None, help="source tree to compare with")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    empty = tempfile.mkdtemp(prefix="cli-startup-")
    py = sys.executable
    here = dict(os.environ)
    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "python": ([py, "-c", "pass"], here),
        "import": ([py, "-c", "import rollout_checkpoint"], here),
        "version": ([py, "-c", _MAIN, "--version"], here),
        "help": ([py, "-c", _MAIN, "--help"], here),
        "list_help": ([py, "-c", _MAIN, "list", "--help"], here),
        "list": ([py, "-c", _MAIN, "list", empty, "--json"], here),
    }
    script = shutil.which("rollout-checkpoint", path=str(Path(py).parent))
    if script:
        cases["version_script"] = ([script, "--version"], here)
    if args.baseline is not None:
        old = {**os.environ, "PYTHONPATH": str(args.baseline.resolve() / "src")}
        for name in ("import", "version", "help", "list_help", "list"):
            command, _ = cases[name]
            cases[f"baseline_{name}"] = (command, old)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (command, env) in cases.items():
            times[name].append(_timed(command, env))
    medians = {name: median(values) for name, values in times.items()}
    base = medians["import"]
    summary: dict[str, Any] = {
        "benchmark": "cli_startup",
        "runs": args.runs,
        "machine": machine_info(),
        "seconds": medians,
        "ratio_to_import": {name: value / base for name, value in medians.items()},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for name, value in medians.items():
            print(f"{name:<22} {value * 1000:7.1f} ms  x{value / base:.2f} of import rollout_checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
