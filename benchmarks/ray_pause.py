"""Checkpoint pause with the participants as Ray actors against plain processes, in one run.

    python benchmarks/ray_pause.py [--rollouts 1000] [--runs 3] [--json]

The same three participants (``_scale_servers.py``: agent, policy model, resources, each
holding ``--rollouts`` parked rollouts) run twice, at the same time: as plain ``run_server``
processes on 127.0.0.1 driven by ``RemoteParticipant`` (the baseline), and as
``ParticipantHost`` actors on a simulated 3-node Ray cluster (one per node, STRICT_SPREAD; Ray's
files in a temporary folder) driven by ``RayParticipant``. Their checkpoints alternate (so both
see the same background load, the cluster's own included), ``--runs`` each, to two local
stores; reported: the pause (first prepare to last resume) p50 and max of each, and the ratio of
the p50s (the goal: at most 1.2). With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: keep 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median
from demo_scale import CHUNK, GAP_S, KINDS, TOKEN, _registry, _servers
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.protocol import ParticipantControl
from rollout_checkpoint.server import RemoteParticipant
from rollout_checkpoint.store import open_store
from rollout_checkpoint.tokens import ObjectStoreTokenStore

HERE = Path(__file__).resolve().parent


def _populate(urls: dict[str, str], ids: list[str]) -> None:
    with httpx.Client(timeout=300, trust_env=False) as client:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            for base in urls.values():
                response = client.post(
                    f"{base}/ng-rollout/{chunk[0]}/bench/populate", json={"rollout_ids": chunk}
                )
                response.raise_for_status()


def _coordinator(url: str, participants: list[ParticipantControl], ids: list[str]) -> Coordinator:
    store = open_store(url)
    return Coordinator(store, participants, _registry(ids), ObjectStoreTokenStore(store))


def _summary(pauses: list[float], steps: list[dict[str, float]]) -> dict[str, Any]:
    names = sorted({name for timings in steps for name in timings})
    return {
        "pause_ms_p50": median(pauses),
        "pause_ms_max": max(pauses),
        "pauses_ms": pauses,
        # each step's median (prepare, commit, publish, latest, resume, ...): where the pause goes
        "steps_ms_p50": {n: round(median([t.get(n, 0.0) * 1000 for t in steps]), 1) for n in names},
    }


@contextlib.contextmanager
def _cluster(work: Path) -> Iterator[Any]:
    """A head (no CPUs) and one node per participant on 127.0.0.1; Ray's files under ``work``."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ.update(
        {
            "HOME": str(work),  # Ray writes ~/.ray/auth_token
            "RAY_TMPDIR": str(work / "t"),
            "ROLLOUT_CHECKPOINT_TOKEN": TOKEN,  # the nodes' environment: the hosts read it there
            "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p),
        }
    )
    (work / "t" / "ray").mkdir(parents=True)
    args = {"temp_dir": str(work / "t" / "ray"), "include_dashboard": False, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, **args})
    try:
        for _ in KINDS:
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def run(ids: list[str], runs: int, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both set-ups up at once (the same background load), their checkpoints alternating."""
    from rollout_checkpoint.integrations.ray import HostSpec, RayDeployment

    specs = [HostSpec(kind, f"_scale_servers:build_{kind}") for kind in KINDS]
    plain_url, ray_url = str(work / "store-processes"), str(work / "store-actors")
    with (
        _cluster(work),
        RayDeployment(specs, store=ray_url, placement="STRICT_SPREAD") as deployment,
        _servers(plain_url, 1, {}) as urls,
    ):
        _populate(urls, ids)
        _populate(deployment.endpoints(), ids)
        remotes = [RemoteParticipant(urls[k], token=TOKEN, brief_commits=True) for k in KINDS]
        plain = _coordinator(plain_url, list(remotes), ids)
        actors = _coordinator(ray_url, list(deployment.participants()), ids)
        pauses: dict[str, list[float]] = {"processes": [], "actors": []}
        steps: dict[str, list[dict[str, float]]] = {"processes": [], "actors": []}
        for index in range(runs):
            if index:
                time.sleep(GAP_S)
            for name, coordinator in (("processes", plain), ("actors", actors)):
                outcome = coordinator.checkpoint(deadline_s=600)
                assert outcome.clean
                pauses[name].append(outcome.pause_seconds * 1000)
                steps[name].append(dict(outcome.timings))
        for remote in remotes:
            remote.close()
    return (
        _summary(pauses["processes"], steps["processes"]),
        _summary(pauses["actors"], steps["actors"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ids = [f"rollout-{i:07d}" for i in range(args.rollouts)]
    work = Path(tempfile.mkdtemp(prefix="rc-ray-bench-"))
    started = time.perf_counter()
    try:
        processes, actors = run(ids, args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = actors["pause_ms_p50"] / processes["pause_ms_p50"]
    out = {
        "rollouts": args.rollouts,
        "runs": args.runs,
        "processes": processes,
        "actors": actors,
        "ratio_p50": round(ratio, 3),
        "goal": 1.2,
        "within_goal": ratio <= 1.2,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": machine_info(),
    }
    if not args.json:
        print(
            f"{args.rollouts} live rollouts, {args.runs} checkpoints each: pause p50 "
            f"{processes['pause_ms_p50']:.0f} ms as processes, {actors['pause_ms_p50']:.0f} ms as Ray actors "
            f"({ratio:.2f}x, goal <= 1.2x)"
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
