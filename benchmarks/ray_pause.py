"""Checkpoint pause with the participants as Ray actors against plain processes, in one run.

    python benchmarks/ray_pause.py [--rollouts 1000] [--runs 3] [--json]

The same three participants (``_scale_servers.py``: agent, policy model, resources, each
holding ``--rollouts`` parked rollouts) run twice: as plain ``run_server`` processes on
127.0.0.1 driven by ``RemoteParticipant`` (the baseline), then as ``ParticipantHost`` actors on
a simulated 3-node Ray cluster (one per node, STRICT_SPREAD; Ray's files in a temporary folder)
driven by ``RayParticipant``. Each takes ``--runs`` checkpoints to a local store; reported: the
pause (first prepare to last resume) p50 and max of each, and the ratio of the p50s (the goal:
at most 1.2). With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: keep 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median
from demo_scale import CHUNK, KINDS, TOKEN, _registry, _servers, _timed
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


def _measure(url: str, participants: list[ParticipantControl], ids: list[str], runs: int) -> dict[str, Any]:
    store = open_store(url)
    coordinator = Coordinator(store, participants, _registry(ids), ObjectStoreTokenStore(store))
    outcomes, _ = _timed(coordinator, runs)
    assert all(o.clean for o in outcomes)
    pauses = [o.pause_seconds * 1000 for o in outcomes]
    return {"pause_ms_p50": median(pauses), "pause_ms_max": max(pauses), "pauses_ms": pauses}


def run_processes(url: str, ids: list[str], runs: int) -> dict[str, Any]:
    with _servers(url, 1, {}) as urls:
        _populate(urls, ids)
        remotes = [RemoteParticipant(urls[k], token=TOKEN, brief_commits=True) for k in KINDS]
        try:
            return _measure(url, list(remotes), ids, runs)
        finally:
            for remote in remotes:
                remote.close()


def run_actors(url: str, ids: list[str], runs: int, work: Path) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from rollout_checkpoint.integrations.ray import HostSpec, RayDeployment

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
        specs = [HostSpec(kind, f"_scale_servers:build_{kind}") for kind in KINDS]
        with RayDeployment(specs, store=url, placement="STRICT_SPREAD") as deployment:
            _populate(deployment.endpoints(), ids)
            return _measure(url, list(deployment.participants()), ids, runs)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ids = [f"rollout-{i:07d}" for i in range(args.rollouts)]
    work = Path(tempfile.mkdtemp(prefix="rc-ray-bench-"))
    started = time.perf_counter()
    processes = run_processes(str(work / "store-processes"), ids, args.runs)
    actors = run_actors(str(work / "store-actors"), ids, args.runs, work)
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
