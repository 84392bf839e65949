"""Loading and classifying a checkpoint of a million rollouts written by 64 participants.

    python benchmarks/million.py [--rollouts 100000 1000000] [--participants 64] [--runs 3]
        [--state-bytes 64] [--verify] [--store DIR] [--json]

Build (one child process per size, not timed as a figure): ``--participants`` real in-process
participants, half ``AgentParticipant`` and half ``ResourcesParticipant`` (``agent-NN`` and
``resources-NN``), and a ``Coordinator`` take one real checkpoint on a local store. Rollout i
lives on agent ``i mod P/2`` (an agent boundary with ``--state-bytes`` of opaque state, naming the
revision of its session) and on resources ``i mod P/2`` (one session, mutated once): two members
per rollout, each participant's component holding N/(P/2) of each kind, the registry's one
dispatch record per rollout, as a real run writes them. The state is small on purpose: the reader
never reads payloads, so their size changes the build, not what is measured.

Everything in the checkpoint is real: the participants' own commits write their components and the
coordinator publishes them; only the workload is synthetic (one boundary and one session per
rollout, no model participant, so no lineage or token receipts to cross-check). Building holds
every participant's state in one process, about 11 KB per rollout before the checkpoint and 22 KB
at its peak (measured at 50,000), and takes minutes per 100,000 rollouts: 300,000 is the largest
that fits 8 GB; 1,000,000 does not (about 22 GB). ``--store DIR`` keeps each built checkpoint
under DIR (``n<N>-p<P>-s<S>``, a ``built.json`` written last) and reuses it on the next run, so
the reads can be repeated without building again.

Read (``--runs`` fresh processes per size, medians): ``load_checkpoint(store, verify=False)``,
which reads the global record, the aggregate, every component manifest and member index (the
registry's included) and classifies every rollout, from manifests and indexes only (checked:
``CountingStore`` counts every object and byte read, and no shard is among them). Reported: the
call's wall seconds and its process CPU seconds, each per rollout (goal <= 5 us; on a shared
host the wall time is mostly waiting for a core, the CPU time is the work), objects and bytes
read, peak RSS of the process (``VmHWM``) and its RSS before the call (imports done), their
difference per rollout, the dispositions (``plan.counts()``, which builds no per-rollout object),
and, separately, the seconds to then build every rollout's ``RolloutPlan`` (iterating
``plan.rollouts.values()``, what a caller that walks every rollout pays on top). ``--verify``
adds one run of ``verify=True`` per size (which reads every shard the plan depends on). With
``--json`` the last line printed is one JSON object.
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

GOAL_US_PER_ROLLOUT = 5.0


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def build(url: str, n: int, participants: int, state_bytes: int) -> dict[str, Any]:
    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.format.records import AgentBoundaryRecord
    from rollout_checkpoint.ids import ExecutionId
    from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant
    from rollout_checkpoint.registry import LiveExecutionRegistry
    from rollout_checkpoint.store import open_store

    half = participants // 2
    agents = [AgentParticipant(f"agent-{i:02d}") for i in range(half)]
    resources = [ResourcesParticipant(f"resources-{i:02d}", mode="exported") for i in range(half)]
    registry = LiveExecutionRegistry()
    state = os.urandom(state_bytes)
    started = time.perf_counter()
    for i in range(n):
        rollout_id = f"r-{i:07d}"
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
        e = ExecutionId(rollout_id=rollout_id, attempt=0)
        agent, res = agents[i % half], resources[i % half]
        res.open_session(e, "env", {"turn": 0})
        revision = res.mutate(e, "env", lambda s: {"turn": 1})
        agent.begin(e)
        agent.boundary(
            e,
            AgentBoundaryRecord(
                rollout_id=rollout_id,
                attempt=0,
                boundary_index=1,
                turn_index=1,
                resource_revisions={res.instance: {"env": revision}},
                output_items=[{"role": "assistant", "content": "move 1"}],
                usage={"output_tokens": 2},
                agent_state=state,
            ),
        )
    populated = time.perf_counter() - started
    store = open_store(url)
    coordinator = Coordinator(store, [*agents, *resources], registry)
    started = time.perf_counter()
    outcome = coordinator.checkpoint("million", deadline_s=3600)
    assert outcome.clean, outcome.post_commit_errors
    written = time.perf_counter() - started
    for p in (*agents, *resources):
        p.close()
    objects = store.list("")
    return {
        "populate_s": populated,
        "checkpoint_s": written,
        "objects": len(objects),
        "bytes": sum(o.size for o in objects),
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
    }


def read(url: str, verify: bool) -> dict[str, Any]:
    from rollout_checkpoint.reader import load_checkpoint
    from rollout_checkpoint.store import CountingStore, open_store

    store = CountingStore(open_store(url))
    before = _rss_kb("VmRSS")
    started, cpu = time.perf_counter(), time.process_time()
    plan = load_checkpoint(store, "million", verify=verify)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    peak = _rss_kb("VmHWM")
    dispositions = plan.counts()
    started = time.perf_counter()
    materialised = sum(1 for _ in plan.rollouts.values())
    iterate_seconds = time.perf_counter() - started
    assert materialised == len(plan.rollouts)
    shards_read = sum(1 for k in store.keys_read if "/shards/" in k)  # payloads (and token rows)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "iterate_seconds": iterate_seconds,
        "rollouts": len(plan.rollouts),
        "objects_read": sum(store.requests[op] for op in ("get", "get_range", "open_read")),
        "bytes_read": store.bytes_read,
        "payload_objects_read": shards_read,
        "rss_before_mb": before / 1024,
        "peak_rss_mb": peak / 1024,
        "dispositions": dict(dispositions),
    }


def _child(argv: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {argv} failed: {out.stderr.strip()[-2000:]}")
    value: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--participants", type=int, default=64, help="an even number: half agents, half resources"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-bytes", type=int, default=64)
    parser.add_argument("--verify", action="store_true", help="also one run of verify=True per size")
    parser.add_argument(
        "--store",
        "--dir",
        dest="dir",
        default=None,
        help="where to build and keep the checkpoints (reused when already built there; "
        "default: a new temporary folder, removed)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, url, *rest = args.child
        if what == "build":
            result = build(url, int(rest[0]), int(rest[1]), int(rest[2]))
        else:
            result = read(url, verify=what == "verify")
        print(json.dumps(result))
        return 0
    if args.participants < 2 or args.participants % 2:
        parser.error("--participants must be an even number >= 2")
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="million-"))
    results = []
    try:
        for n in sorted(args.rollouts):
            url = str(scratch / f"n{n}-p{args.participants}-s{args.state_bytes}")
            marker = Path(url) / "built.json"  # written last: a build cut short is rebuilt
            if marker.exists():
                built = json.loads(marker.read_text())
                built["reused"] = True
            else:
                shutil.rmtree(url, ignore_errors=True)
                built = _child(["build", url, str(n), str(args.participants), str(args.state_bytes)])
                marker.write_text(json.dumps(built))
                built["reused"] = False
            reads = [_child(["read", url]) for _ in range(args.runs)]
            seconds = median([r["seconds"] for r in reads])
            cpu_seconds = median([r["cpu_seconds"] for r in reads])
            peak = median([r["peak_rss_mb"] for r in reads])
            before = median([r["rss_before_mb"] for r in reads])
            row: dict[str, Any] = {
                "rollouts": n,
                "participants": args.participants,
                "build": built,
                "seconds": seconds,
                "us_per_rollout": seconds / n * 1e6,
                "cpu_seconds": cpu_seconds,
                "cpu_us_per_rollout": cpu_seconds / n * 1e6,
                "iterate_us_per_rollout": median([r["iterate_seconds"] for r in reads]) / n * 1e6,
                "goal_us_per_rollout": GOAL_US_PER_ROLLOUT,
                "goal_met": seconds / n * 1e6 <= GOAL_US_PER_ROLLOUT,
                "peak_rss_mb": peak,
                "rss_before_mb": before,
                "rss_growth_bytes_per_rollout": (peak - before) * 2**20 / n,
                "objects_read": reads[-1]["objects_read"],
                "bytes_read": reads[-1]["bytes_read"],
                "payload_objects_read": reads[-1]["payload_objects_read"],
                "bytes_read_over_stored": reads[-1]["bytes_read"] / built["bytes"],
                "dispositions": reads[-1]["dispositions"],
                "runs": reads,
            }
            if args.verify:
                row["verify"] = _child(["verify", url])
            results.append(row)
            if not args.json:
                print(
                    f"N={n:>8} x {args.participants} participants: load+classify {seconds:.2f} s = "
                    f"{row['us_per_rollout']:.2f} us/rollout (goal <= {GOAL_US_PER_ROLLOUT}), CPU "
                    f"{row['cpu_us_per_rollout']:.2f} us/rollout; peak RSS "
                    f"{peak:.0f} MB ({before:.0f} before: "
                    f"{row['rss_growth_bytes_per_rollout']:.0f} B/rollout); "
                    f"read {row['objects_read']} objects, {row['bytes_read'] / 1e6:.1f} MB of "
                    f"{built['bytes'] / 1e6:.1f} MB stored; {row['dispositions']}",
                    flush=True,
                )
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        "benchmark": "million",
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "results": results,
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
