"""CPU time of one checkpoint: in-process participants against worker groups, in one process.

    python benchmarks/worker_group_cpu.py [--rollouts 1000] [--runs 5] [--mode both|in-process|groups]
        [--json]

``demo_scale.py`` measures the pause over real processes, which on a shared host mostly
measures the host's load. This script counts CPU instead, which the load barely moves: the same
state as ``demo_scale.py`` (``_scale_servers.py``'s populate steps) checkpointed by a coordinator
either over three in-process participants (agent, policy model, resources) or over three
``WorkerGroup``s of two workers each. The workers run in this process, each behind its own
``checkpoint_router`` on a Unix socket served by a uvicorn thread (so every control call is a
real HTTP request), and every thread's CPU is counted by ``time.process_time()``. Reported per
mode: CPU per checkpoint (p50 of ``--runs`` checkpoints after a first, full one), the pause p50,
and the CPU a worker group spends in its own step (``commit_parts``: reading the parts'
indexes and reference tables, writing the component's manifest) and in the workers' commits.
With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fastapi import FastAPI

from _common import machine_info, median
from _scale_servers import populate_agent, populate_model, populate_resources
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.protocol import Participant
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import WorkerGroup, _workers, checkpoint_router, serve_thread
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.tokens import ObjectStoreTokenStore

TOKEN = "worker-group-cpu-token-0000"
KINDS = ("agent", "model", "resources")
SPENT: defaultdict[str, float] = defaultdict(float)
"""Thread CPU seconds spent inside the functions ``_count`` wraps, by label."""


def _count(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += time.thread_time() - started

    setattr(owner, name, counted)


def _participant(kind: str, tokens: ObjectStoreTokenStore) -> tuple[Participant, Callable[[list[str]], None]]:
    if kind == "agent":
        agent = AgentParticipant("agent-0")
        return agent, lambda ids: populate_agent(agent, ids)
    if kind == "model":
        model = PolicyModelParticipant(tokens, "policy-0")
        return model, lambda ids: populate_model(model, tokens, ids)
    resources = ResourcesParticipant("resources-0", mode="exported")
    return resources, lambda ids: populate_resources(resources, ids)


def _registry(ids: list[str]) -> LiveExecutionRegistry:
    registry = LiveExecutionRegistry()
    for rollout_id in ids:
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
    return registry


def run(mode: str, n: int, runs: int) -> dict[str, Any]:
    ids = [f"rollout-{i:07d}" for i in range(n)]
    folder = Path(tempfile.mkdtemp(prefix="wg-cpu-"))
    store = LocalStore(folder / "store")
    tokens = ObjectStoreTokenStore(store)
    SPENT.clear()
    with contextlib.ExitStack() as stack:
        members: list[Any] = []
        for kind in KINDS:
            if mode == "in-process":
                participant, populate = _participant(kind, tokens)
                populate(ids)
                members.append(participant)
                continue
            group = WorkerGroup(store, expected_workers=2, token=TOKEN)
            for w in range(2):
                participant, populate = _participant(kind, tokens)
                populate(ids[w::2])
                app = FastAPI()
                app.include_router(checkpoint_router(participant, token=TOKEN))
                sock = str(folder / f"{kind}{w}.sock")
                stack.enter_context(serve_thread(app, uds=sock))
                group.register(f"w{w}", sock, os.getpid(), participant.capabilities())
            members.append(group)
        coordinator = Coordinator(store, members, _registry(ids), tokens)
        coordinator.checkpoint(deadline_s=600)  # the first one writes everything
        SPENT.clear()
        cpu, pauses = [], []
        for _ in range(runs):
            started = time.process_time()
            outcome = coordinator.checkpoint(deadline_s=600)
            cpu.append(time.process_time() - started)
            pauses.append(outcome.pause_seconds)
    return {
        "mode": mode,
        "cpu_ms_p50": median(cpu) * 1000,
        "pause_ms_p50": median(pauses) * 1000,
        "spent_ms_per_checkpoint": {k: v * 1000 / runs for k, v in sorted(SPENT.items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=["both", "in-process", "groups"], default="both")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if hasattr(_workers, "commit_parts"):
        _count(_workers, "commit_parts", "group step (commit_parts)")
    _count(Participant, "commit", "participant commits")
    modes = ["in-process", "groups"] if args.mode == "both" else [args.mode]
    results = [run(mode, args.rollouts, args.runs) for mode in modes]
    for r in results:
        spent = ", ".join(f"{k} {v:.0f} ms" for k, v in r["spent_ms_per_checkpoint"].items())
        print(
            f"{r['mode']:10}: CPU p50 {r['cpu_ms_p50']:.0f} ms, "
            f"pause p50 {r['pause_ms_p50']:.0f} ms ({spent})"
        )
    summary: dict[str, Any] = {"benchmark": "worker_group_cpu", "machine": machine_info(), "results": results}
    if len(results) == 2:
        summary["groups_over_in_process_cpu"] = results[1]["cpu_ms_p50"] / results[0]["cpu_ms_p50"]
        print(f"groups / in-process CPU: {summary['groups_over_in_process_cpu']:.2f}")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
