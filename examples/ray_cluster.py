"""The reference servers as Ray actors on a simulated multi-node cluster, crashed and recovered.

    python examples/ray_cluster.py [--nodes N] [--rollouts N] [--store URL]
                                   [--kill model|agent|resources|node|driver|none] [--json]

A head plus ``--nodes`` worker nodes (``ray.cluster_utils.Cluster``, all on 127.0.0.1) run the
policy model, the agent and one resources server per reference environment, each a
``ParticipantHost`` actor on its own node (a STRICT_SPREAD placement group with a spare node
left for ``--kill node``; SPREAD when there are fewer nodes than hosts plus one). A driver
process deploys them (``RayDeployment``), runs the demo workload through the agent and
checkpoints every second while rollouts run, its coordinator driving the actors over
``RayParticipant``. Once a checkpoint lets half the rollouts continue, this process
kills the victim:

* ``model`` / ``agent`` / ``resources``: the actor is killed; Ray restarts it empty (paused);
* ``node``: the node of the first environment's actor is removed; Ray restarts the actor on the
  spare node (another address: the agent resolves its peers again for every attempt);
* ``driver``: the driver is SIGKILLed; the actors it owns die with it; a new driver deploys fresh
  actors and restores this run's latest checkpoint into them.

The driver then calls ``Coordinator.recover()``, dispatches what the restore plan says and
finishes; the final states and rewards are compared with the same seed run uninterrupted, and
the report uses the same JSON keys as ``rollout-checkpoint demo --json``. Exit 0 only when the
run is correct. The control token lives only in the nodes' environment. Ray's files go to a
temporary folder; every Ray process is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

# before Ray is imported: Ray reads it once, and ``0`` keeps its node address on 127.0.0.1
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

KILLS = ("model", "agent", "resources", "node", "driver", "none")
NAMESPACE = "rollout-checkpoint-ray-example"
BUILDS = "rollout_checkpoint.demo._servers"
MAX_TOKENS = 12
CUT_WAIT = 6


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


# -- the driver (a child process) -------------------------------------------------------------------


def _driver(config_path: str) -> int:
    """Deploy the hosts, run the workload, checkpoint, recover after an announced kill."""
    import httpx
    import ray

    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.errors import CheckpointError
    from rollout_checkpoint.ids import ExecutionId
    from rollout_checkpoint.integrations.ray import HostSpec, RayDeployment
    from rollout_checkpoint.reader import load_checkpoint
    from rollout_checkpoint.registry import LiveExecutionRegistry
    from rollout_checkpoint.server import ParticipantUnreachableError
    from rollout_checkpoint.store import open_store
    from rollout_checkpoint.tokens import ObjectStoreTokenStore

    config = json.loads(Path(config_path).read_text())
    state_path, control_path = Path(config["state"]), Path(config["control"])
    state = _read(state_path) or {"results": {}, "pauses_ms": [], "checkpoints": [], "restores": []}
    state.setdefault("running", {})
    handled = int(state.get("handled", 0))
    ray.init(address=config["address"], namespace=NAMESPACE, log_to_driver=False)
    store = open_store(config["store"])
    envs: list[str] = config["envs"]
    common = {
        "ROLLOUT_CHECKPOINT_DEMO_SEED": str(config["seed"]),
        "ROLLOUT_CHECKPOINT_DEMO_TOKEN_DELAY": str(config["token_delay"]),
        "ROLLOUT_CHECKPOINT_DEMO_CONCURRENCY": "64",
    }
    resolve = {"ROLLOUT_CHECKPOINT_DEMO_RESOLVE": "rollout_checkpoint.integrations.ray:resolve_endpoint"}
    specs = [
        HostSpec("model", f"{BUILDS}:build_model", settings=common),
        HostSpec("agent", f"{BUILDS}:build_agent", settings={**common, **resolve}),
        *(
            HostSpec(
                env, f"{BUILDS}:build_resources", settings={**common, "ROLLOUT_CHECKPOINT_DEMO_ENV": env}
            )
            for env in envs
        ),
    ]
    rollouts = {s["rollout_id"]: s for s in config["specs"]}
    modes: dict[str, str] = config["modes"]
    registry = LiveExecutionRegistry()
    running = {r: ExecutionId(rollout_id=r, attempt=a) for r, a in state["running"].items()}

    def save() -> None:
        state["running"] = {r: e.attempt for r, e in running.items()}
        _write(state_path, state)

    with RayDeployment(specs, store=store.url, placement=config["placement"]) as deployment:
        coordinator = Coordinator(
            store, deployment.participants(), registry, ObjectStoreTokenStore(store), run_id=config["run_id"]
        )
        agent = httpx.Client(timeout=120, trust_env=False)

        def dispatch(execution: ExecutionId) -> None:
            spec = rollouts[execution.rollout_id]
            running[execution.rollout_id] = execution
            save()
            url = deployment.endpoints()["agent"]  # asked again: the agent may have moved
            body = {
                "attempt": execution.attempt,
                "env": spec["env"],
                "seed": spec["seed"],
                "turns": spec["turns"],
                "max_tokens": MAX_TOKENS,
                "restart_only": modes[spec["env"]] == "restart_only",
            }
            response = agent.post(f"{url}/ng-rollout/{execution.rollout_id}/run", json=body)
            if response.status_code >= 300:
                raise CheckpointError(f"{execution}: the agent refused the run: {response.text}")

        def recover(after_kill: bool = True) -> None:
            """After a kill: wait for the restarted actors, recover(), dispatch the plan."""
            end = time.monotonic() + 300
            while after_kill and not deployment.check(timeout_s=300) and time.monotonic() < end:
                time.sleep(0.2)  # the victim is not back yet (Ray restarts it)
            retired = list(running.values())
            while True:
                try:
                    restored = coordinator.recover(retired, deadline_s=120)
                    break
                except ParticipantUnreachableError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(1.0)  # Ray still settling the restarted actor ("temporarily unavailable")
            plan = restored.plan
            state["restores"].append(
                {"checkpoint_id": plan.checkpoint_id, "restore_id": restored.restore_id, **plan.counts()}
            )
            state["restarts"] = dict(deployment.restarts)
            running.clear()
            for entry in plan.rollouts.values():
                if entry.disposition == "completed":
                    continue
                nxt = entry.execution.next_attempt()
                if entry.disposition == "fresh_dispatch":
                    registry.start(nxt)
                dispatch(nxt)

        if config.get("restore"):  # a new driver: fresh actors, this run's latest checkpoint
            recover(after_kill=False)
        else:
            for rollout_id, spec in rollouts.items():
                execution = registry.dispatch(
                    rollout_id,
                    input_digest=spec["digest"],
                    restart_only=modes[spec["env"]] == "restart_only",
                )
                registry.start(execution)
                dispatch(execution)
        save()
        next_checkpoint = time.monotonic() + 1.0
        while running:
            killed = int(_read(control_path).get("killed", 0))
            if killed > handled:
                recover()
                handled = state["handled"] = killed
                save()
                continue
            try:
                url = deployment.endpoints()["agent"]
                for rollout_id, execution in list(running.items()):
                    result = agent.get(
                        f"{url}/ng-rollout/{rollout_id}/result", params={"attempt": execution.attempt}
                    ).json()
                    if result.get("status") == "done":
                        outcome = {k: result.get(k) for k in ("summary", "reward", "cuts_continued")}
                        outcome.update(
                            restored_turn=result.get("restored_turn"), first_turn=result.get("first_turn")
                        )
                        registry.finish(execution)
                        registry.hand_off(execution, outcome, reward=float(result["reward"]))
                        state["results"][rollout_id] = outcome
                        del running[rollout_id]
                    elif result.get("status") in ("failed", "unknown"):
                        raise CheckpointError(f"{execution}: {result.get('error', result)}")
                if running and time.monotonic() >= next_checkpoint:
                    outcome = coordinator.checkpoint(deadline_s=120)
                    state["pauses_ms"].append(outcome.pause_seconds * 1000)
                    state["checkpoints"].append(outcome.checkpoint_id)
                    plan = load_checkpoint(store, outcome.checkpoint_id, verify=False)
                    state["continuable"] = int(plan.counts().get("continue", 0))
                    state["continuable_cuts"] = _continuable_cuts(plan)
                    next_checkpoint = time.monotonic() + 1.0
            except (CheckpointError, httpx.HTTPError, ray.exceptions.RayError) as exc:
                if int(_read(control_path).get("killed", 0)) > handled:
                    continue  # a symptom of the announced kill: recovery follows
                state.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
                save()
                return 1
            save()
            time.sleep(0.05)
        state["done"] = True
        save()
    return 0


def _continuable_cuts(plan: Any) -> int:
    from rollout_checkpoint.demo._cluster_coordinator import continuable_cuts

    return int(continuable_cuts(plan))


# -- the cluster and the kill (this process) --------------------------------------------------------


def _run(args: argparse.Namespace, say: Any) -> tuple[dict[str, Any], int]:
    import ray
    from ray.cluster_utils import Cluster

    from rollout_checkpoint.demo import DemoReport, rollout_specs
    from rollout_checkpoint.demo._cluster import _uninterrupted
    from rollout_checkpoint.format.commit_log import list_published
    from rollout_checkpoint.participants.environments import reference_environments
    from rollout_checkpoint.store import open_store

    work = Path(tempfile.mkdtemp(prefix="rc-ray-example-"))
    os.environ["HOME"] = str(work)  # Ray writes ~/.ray/auth_token
    os.environ["RAY_TMPDIR"] = str(work / "t")  # and its session folders under $RAY_TMPDIR/ray
    os.environ["ROLLOUT_CHECKPOINT_TOKEN"] = secrets.token_urlsafe(24)  # the nodes' environment only
    (work / "t" / "ray").mkdir(parents=True)
    store_url = args.store or str(work / "store")
    store = open_store(store_url)
    environments = reference_environments()
    envs = [e.name for e in environments]
    hosts = 2 + len(envs)
    # one node per host plus a spare (where a removed node's actor restarts); fewer: best effort
    placement = "STRICT_SPREAD" if args.nodes > hosts else "SPREAD"
    specs = rollout_specs(args.rollouts, args.turns, args.seed, envs, prefix=f"run{uuid.uuid4().hex[:8]}")
    state_path, control_path = work / "state.json", work / "control.json"
    _write(control_path, {"killed": 0})
    report = DemoReport(rollouts=args.rollouts, turns=args.turns, seed=args.seed)
    extra: dict[str, Any] = {"killed": None, "nodes": args.nodes, "placement": placement}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "temp_dir": str(work / "t" / "ray"),
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
        },
    )
    driver: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        cluster.wait_for_nodes()
        say(
            f"1. a head and {args.nodes} nodes on 127.0.0.1; {hosts} hosts ({placement}), "
            f"{args.rollouts} rollouts"
        )
        config = {
            "address": cluster.address,
            "store": store.url,
            "envs": envs,
            "modes": {e.name: e.mode for e in environments},
            "specs": [{**asdict(s), "digest": s.digest} for s in specs],
            "seed": args.seed,
            "token_delay": args.token_delay,
            "placement": placement,
            "run_id": f"ray-example-{uuid.uuid4().hex[:12]}",
            "state": str(state_path),
            "control": str(control_path),
        }
        config_path = work / "config.json"
        _write(config_path, config)

        def start_driver() -> subprocess.Popen[bytes]:
            log = (work / "driver.log").open("ab")
            return subprocess.Popen(
                [sys.executable, __file__, "--as-driver", str(config_path)], stdout=log, stderr=log
            )

        driver = start_driver()
        end = time.monotonic() + args.timeout
        if args.kill != "none":
            half_since = 0
            while time.monotonic() < end and driver.poll() is None:
                state = _read(state_path)
                if 2 * int(state.get("continuable", 0)) >= args.rollouts:
                    half_since = half_since or len(state.get("checkpoints", []))
                    waited = len(state.get("checkpoints", [])) - half_since
                    if int(state.get("continuable_cuts", 0)) > 0 or waited >= CUT_WAIT:
                        break
                time.sleep(0.05)
            if driver.poll() is None:
                published = len(_read(state_path).get("checkpoints", []))
                extra["killed"] = _kill(args.kill, envs, cluster, driver, control_path)
                say(f"2. killed {extra['killed']} ({published} checkpoints published so far)")
                if args.kill == "driver":
                    driver.wait(60)
                    config["restore"] = True
                    _write(config_path, config)
                    driver = start_driver()
                    say("3. a new driver deploys fresh actors and restores this run's latest checkpoint")
                else:
                    say("3. Ray restarts it empty (paused); the driver calls recover()")
        while time.monotonic() < end and driver.poll() is None:
            time.sleep(0.1)
        status = driver.poll()
        if status is None:
            report.errors.append(f"the run did not finish in {args.timeout:.0f} s")
        elif status != 0:
            report.errors.append(f"the driver exited with {status}; see {work / 'driver.log'}")
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
            driver.wait(30)
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()
    state = _read(state_path)
    report.errors.extend(state.get("errors", []))
    results: dict[str, Any] = state.get("results", {})
    pauses = [float(p) for p in state.get("pauses_ms", [])]
    restores = state.get("restores", [])
    published_ids = {p.checkpoint_id for p in list_published(store)}
    report.checkpoint_ids = list(state.get("checkpoints", []))
    report.checkpoints_published = len(published_ids & set(report.checkpoint_ids))
    if restores:
        report.restore_id = restores[-1]["restore_id"]
        report.continued = int(restores[-1].get("continue", 0))
        report.fresh_dispatch = int(restores[-1].get("fresh_dispatch", 0))
    report.generation_cuts_continued = sum(int(r.get("cuts_continued") or 0) for r in results.values())
    report.repeated_model_calls = report.repeated_tool_calls = sum(
        1
        for r in results.values()
        if r.get("restored_turn") is not None and int(r.get("first_turn") or 0) <= int(r["restored_turn"])
    )
    report.completed = len(results)
    report.lost_results = args.rollouts - len(results)
    report.pause_ms = report.pause_ms_max = round(max(pauses, default=0.0), 3)
    report.pause_ms_p50 = round(statistics.median(pauses), 3) if pauses else 0.0
    expected = _uninterrupted(specs, args.seed, args.token_delay, args.timeout)
    final = {k: {"summary": v["summary"], "reward": v["reward"]} for k, v in results.items()}
    report.mismatched = sorted(
        s.rollout_id for s in specs if final.get(s.rollout_id) != expected.get(s.rollout_id)
    )
    report.matches_uninterrupted = not report.mismatched and len(expected) == args.rollouts
    if args.kill != "none" and not restores:
        report.errors.append("no recovery ran (the run finished before the kill?)")
    out = {**report.to_json(), "kill": args.kill, **extra, "restarts": state.get("restarts", {})}
    if args.kill == "none":  # nothing restored: no generation can continue from a cut
        out["failures"] = [f for f in out["failures"] if not f.startswith("no generation was continued")]
        out["ok"] = not out["failures"]
    if out["ok"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        out["workdir"] = str(work)
    return out, 0 if out["ok"] else 1


def _kill(kind: str, envs: list[str], cluster: Any, driver: subprocess.Popen[bytes], control: Path) -> str:
    import ray

    if kind == "driver":
        os.kill(driver.pid, signal.SIGKILL)
        return "the driver"
    _write(control, {"killed": 1})  # announced first: every symptom the driver sees is after it
    name = envs[0] if kind in ("resources", "node") else kind
    handle = ray.get_actor(f"rc-host-{name}", namespace=NAMESPACE)
    if kind == "node":
        node_id = ray.get(handle.health.remote(), timeout=60)["node_id"]
        node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
        cluster.remove_node(node)
        return f"the node of {name}"
    ray.kill(handle, no_restart=False)
    return f"the {name} actor"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=6, help="worker nodes besides the head (>= 3)")
    parser.add_argument("--rollouts", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--token-delay", type=float, default=0.05)
    parser.add_argument("--store", default=None, help="store URL (default: a temporary folder)")
    parser.add_argument("--kill", choices=KILLS, default="resources")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--as-driver", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.as_driver:
        return _driver(args.as_driver)
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    say = (lambda _line: None) if args.json else (lambda line: print(line, flush=True))
    out, status = _run(args, say)
    if args.json:
        print(json.dumps(out))
    else:
        verdict = "correct" if out["ok"] else "NOT correct: " + "; ".join(out["failures"])
        print(
            f"4. {out['completed']}/{out['rollouts']} results, {out['checkpoints_published']} checkpoints "
            f"(pause p50 {out['pause_ms_p50']:.0f} ms), restore continued {out['continued']} and "
            f"dispatched {out['fresh_dispatch']} afresh; same as uninterrupted: "
            f"{out['matches_uninterrupted']} -> {verdict}"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
