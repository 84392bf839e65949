"""Checkpoint real NeMo Gym servers through a SIGKILL, in one command.

    python examples/nemo_gym_blackjack.py [--store URL] [--rollouts N] [--seed S] [--workers N]
                                          [--kill agent|resources|model|none] [--json]

Starts, as real processes on 127.0.0.1 and each through Gym's own server start-up
(``run_webserver()``): the scripted Responses-API model (the policy model participant), Gym's
blackjack resources server with the checkpoint participant attached (``--workers`` worker
processes), and the checkpointed Gym gymnasium agent. It dispatches ``--rollouts`` games,
holds each game's second model call (so the games stay mid-episode), checkpoints until a
published checkpoint lets a rollout continue, SIGKILLs the ``--kill`` server, restarts only it,
restores the checkpoint into every server, resumes, finishes every rollout and compares each
with an uninterrupted run of the same seed. The store is a local directory by default, or any
URL the SDK opens (``s3://bucket/prefix`` with the usual ``AWS_*`` variables). With ``--json``
the last line is one JSON object. Exit status 0 only for a correct run (every rollout completed, nothing lost,
no completed model or tool call repeated, results equal to the uninterrupted run): ``ok`` and
``failures`` say that; ``demonstrated`` / ``not_demonstrated`` say, apart from it, what the run
showed (the crash, a rollout continued, one resumed mid-episode) and why not.

Needs NeMo Gym installed beside the SDK (see docs/nemo-gym.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=None, help="checkpoint store URL (default: a new local directory)")
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="worker processes of the blackjack server")
    parser.add_argument("--kill", choices=["agent", "resources", "model", "none"], default="resources")
    parser.add_argument(
        "--model-delay", type=float, default=0.3, help="seconds the scripted model takes per call"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object last")
    args = parser.parse_args(argv)
    if args.rollouts < 1 or args.workers < 1:
        print("error: --rollouts and --workers must be at least 1", file=sys.stderr)
        return 1
    try:
        from rollout_checkpoint.integrations.nemo_gym import GymNotInstalledError, GymServers, run_scenario
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="nemo-gym-blackjack-"))
    store = args.store or str(workdir / "store")
    servers = GymServers(
        store=store,
        workdir=workdir / "servers",
        seed=args.seed,
        workers=args.workers,
        model_delay_s=args.model_delay,
    )
    kill = None if args.kill == "none" else args.kill
    started = time.monotonic()
    print(f"store {store}; servers log to {servers.workdir}", flush=True)
    try:
        result = run_scenario(servers, rollouts=args.rollouts, kill=kill)
    except GymNotInstalledError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary = {
        "ok": result.ok,
        "failures": result.failures,
        **result.summary,
        "store": store,
        "seconds": round(time.monotonic() - started, 1),
    }
    crash = f"killed the {kill} server" if kill else "no crash (--kill none)"
    turns = sorted(summary["resumed_at_turns"].values())
    print(
        f"{summary['completed']}/{summary['rollouts']} rollouts completed; {crash}; "
        f"continued {summary['continued']} (resumed at turns {turns}), "
        f"fresh {summary['fresh_dispatch']}; "
        f"repeated model calls {summary['repeated_model_calls']}, "
        f"tool calls {summary['repeated_tool_calls']}; "
        f"matches the uninterrupted run: {summary['matches_uninterrupted']}; "
        f"checkpoint pause p50 {summary['pause_ms_p50']} ms"
    )
    for feature, reason in summary["not_demonstrated"].items():
        print(f"not demonstrated: {feature}: {reason}")
    for failure in result.failures:
        print(f"FAILED: {failure}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
