"""Loading and classifying a checkpoint of a million rollouts written by 64 participants.

    python benchmarks/million.py [--rollouts 100000 1000000] [--participants 64] [--runs 3]
        [--state-bytes 64] [--build-groups G] [--verify] [--store DIR] [--json]

The checkpoint (built once per size, not timed as a figure): ``--participants`` real
participants, half ``AgentParticipant`` and half ``ResourcesParticipant`` (``agent-NN`` and
``resources-NN``), the real ``LiveExecutionRegistry`` and a real ``Coordinator`` take one real
checkpoint (id ``million``) on a local store. Rollout i lives on agent ``i mod P/2`` (an agent
boundary with ``--state-bytes`` of opaque state, naming the revision of its session) and on
resources ``i mod P/2`` (one session, mutated once): two members per rollout, each participant's
component holding N/(P/2) of each kind, the registry's one dispatch record per rollout, as a
real run writes them. The state is small on purpose: the reader never reads payloads, so their
size changes the build, not what is measured. Everything in the checkpoint is real; only the
workload is synthetic (one boundary and one session per rollout, no model participant, so no
lineage or token receipts to cross-check).

How it is built, and why (memory): a participant holds about 11 KB per rollout before the
checkpoint and 16-22 KB at its peak, so one process holding all 64 needs about 22 GB for
1,000,000 rollouts, more than the host has. So the build runs in child processes, one after the
other (``--build-groups G``; default: enough that a group holds at most about 150,000 rollouts):

1. each group's child holds agent and resources k for its share of k, populated as a run leaves
   them, and each participant runs its own real control calls of the checkpoint: ``prepare``,
   ``commit`` (scope None: all its executions; its component is written to the store) and
   ``resume``; the child records each participant's ``capabilities()``, ``status()`` and the
   three answers (``model_dump(mode="json")``) in a file, then exits, its memory freed;
2. the last child builds the registry (one dispatch per rollout, in dispatch order) and runs
   ``Coordinator(store, proxies, registry).checkpoint("million")`` over one proxy per
   participant that answers the coordinator's calls with what the real participant answered
   (same capabilities and incarnation, its prepare report, its commit reply naming the manifest
   it wrote, its resume reply; only for that checkpoint id). The coordinator validates every
   component from the store (digests, identity, every shard and index) and writes the registry
   component, the aggregate and the global record, as in any checkpoint.

The result is the checkpoint the one-process build writes (``--build-groups 0``, kept: every
participant and the coordinator in one process, calling each other directly): the same objects
of the same sizes, read and classified the same (``tests/test_million_build.py``). The build's
JSON reports each child's populate and commit seconds and peak RSS. ``--store DIR`` keeps each
built checkpoint under DIR (``n<N>-p<P>-s<S>``, a ``built.json`` written last) and reuses it on
the next run, so the reads can be repeated without building again.

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
CHECKPOINT_ID = "million"
GROUP_ROLLOUTS = 150_000


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _populate(agent: Any, res: Any, rollouts: range, state: bytes, registry: Any | None = None) -> None:
    """Rollouts ``rollouts`` on this agent and resources pair, as a real run leaves them: a
    session opened and mutated once, an agent boundary naming its revision (and, when a
    ``registry`` is given, its dispatch record)."""
    from rollout_checkpoint.format.records import AgentBoundaryRecord
    from rollout_checkpoint.ids import ExecutionId

    for i in rollouts:
        rollout_id = f"r-{i:07d}"
        if registry is not None:
            registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
        e = ExecutionId(rollout_id=rollout_id, attempt=0)
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


def _pairs(participants: int) -> tuple[list[Any], list[Any]]:
    from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant

    half = participants // 2
    agents = [AgentParticipant(f"agent-{i:02d}") for i in range(half)]
    resources = [ResourcesParticipant(f"resources-{i:02d}", mode="exported") for i in range(half)]
    return agents, resources


def _store_totals(url: str) -> dict[str, Any]:
    from rollout_checkpoint.store import open_store

    objects = open_store(url).list("")
    return {"objects": len(objects), "bytes": sum(o.size for o in objects)}


def build(url: str, n: int, participants: int, state_bytes: int) -> dict[str, Any]:
    """``--build-groups 0``: every participant, the registry and the coordinator in this process."""
    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.registry import LiveExecutionRegistry
    from rollout_checkpoint.store import open_store

    half = participants // 2
    agents, resources = _pairs(participants)
    registry = LiveExecutionRegistry()
    state = os.urandom(state_bytes)
    started = time.perf_counter()
    for i in range(n):  # the dispatch order of a run: rollout by rollout, pair i mod P/2
        _populate(agents[i % half], resources[i % half], range(i, i + 1), state, registry)
    populated = time.perf_counter() - started
    store = open_store(url)
    coordinator = Coordinator(store, [*agents, *resources], registry)
    started = time.perf_counter()
    outcome = coordinator.checkpoint(CHECKPOINT_ID, deadline_s=3600)
    assert outcome.clean, outcome.post_commit_errors
    written = time.perf_counter() - started
    for p in (*agents, *resources):
        p.close()
    return {
        "mode": "one process",
        "populate_s": populated,
        "checkpoint_s": written,
        **_store_totals(url),
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
    }


def build_group(
    url: str, n: int, participants: int, state_bytes: int, pairs: list[int], replies: str
) -> dict[str, Any]:
    """One group's participants (agent and resources k for every k in ``pairs``), populated with
    their rollouts (i = k, k + P/2, ...), then each runs its own real control calls of the
    checkpoint: prepare, commit (scope None: all its executions) and resume; every answer is
    recorded (``model_dump(mode="json")``) in ``replies`` for the coordinator's child."""
    from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant
    from rollout_checkpoint.store import open_store

    half = participants // 2
    agents = {k: AgentParticipant(f"agent-{k:02d}") for k in pairs}
    resources = {k: ResourcesParticipant(f"resources-{k:02d}", mode="exported") for k in pairs}
    state = os.urandom(state_bytes)
    started = time.perf_counter()
    for k in pairs:
        _populate(agents[k], resources[k], range(k, n, half), state)
    populated = time.perf_counter() - started
    store = open_store(url)
    recorded: dict[str, Any] = {}
    started = time.perf_counter()
    deadline = time.time() + 3600
    for p in (*agents.values(), *resources.values()):
        caps = p.capabilities()
        status = p.status()
        prepare = p.prepare(CHECKPOINT_ID, deadline)
        assert prepare.ready, prepare.blockers
        commit = p.commit(CHECKPOINT_ID, store, deadline)
        resume = p.resume(CHECKPOINT_ID, deadline)
        recorded[f"{caps.kind}/{caps.instance}"] = {
            name: reply.model_dump(mode="json")
            for name, reply in (
                ("capabilities", caps),
                ("status", status),
                ("prepare", prepare),
                ("commit", commit),
                ("resume", resume),
            )
        }
        p.close()
    committed = time.perf_counter() - started
    Path(replies).write_text(json.dumps(recorded))
    return {
        "pairs": pairs,
        "rollouts": sum(len(range(k, n, half)) for k in pairs),
        "populate_s": populated,
        "commit_s": committed,
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
    }


class _Recorded:
    """A participant's control calls answered by what the real participant answered to them in
    its group's child (``build_group``): the same capabilities, incarnation, prepare report,
    commit reply (naming the manifest it wrote) and resume reply. Only the checkpoint it
    recorded is answered; the coordinator never calls the other operations in a checkpoint."""

    def __init__(self, recorded: dict[str, Any]) -> None:
        from rollout_checkpoint.protocol import (
            Capabilities,
            CommitReply,
            ParticipantStatus,
            PrepareReport,
            ResumeReply,
        )

        self._capabilities = Capabilities.model_validate(recorded["capabilities"])
        self._status = ParticipantStatus.model_validate(recorded["status"])
        self._prepare = PrepareReport.model_validate(recorded["prepare"])
        self._commit = CommitReply.model_validate(recorded["commit"])
        self._resume = ResumeReply.model_validate(recorded["resume"])

    def _recorded(self, checkpoint_id: str) -> None:
        if checkpoint_id != self._prepare.checkpoint_id:
            raise ValueError(f"recorded checkpoint {self._prepare.checkpoint_id}, not {checkpoint_id}")

    def capabilities(self) -> Any:
        return self._capabilities

    def status(self) -> Any:
        return self._status

    def prepare(self, checkpoint_id: str, deadline: float) -> Any:
        self._recorded(checkpoint_id)
        return self._prepare

    def commit(self, checkpoint_id: str, store: Any, deadline: float, scope: Any = None) -> Any:
        self._recorded(checkpoint_id)
        return self._commit

    def resume(self, checkpoint_id: str, deadline: float) -> Any:
        self._recorded(checkpoint_id)
        return self._resume

    def _not_recorded(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("only a checkpoint's prepare, commit and resume were recorded")

    restore = abort_restore = retire = forget = _not_recorded


def build_publish(url: str, n: int, replies: list[str]) -> dict[str, Any]:
    """The real registry (one dispatch per rollout, in dispatch order) and a real ``Coordinator``
    whose checkpoint calls the participants' recorded answers; it validates every component from
    the store and writes the registry component, the aggregate and the global record."""
    from rollout_checkpoint.coordinator import Coordinator
    from rollout_checkpoint.registry import LiveExecutionRegistry
    from rollout_checkpoint.store import open_store

    registry = LiveExecutionRegistry()
    started = time.perf_counter()
    for i in range(n):
        rollout_id = f"r-{i:07d}"
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
    populated = time.perf_counter() - started
    proxies = []
    for path in replies:
        proxies.extend(_Recorded(r) for r in json.loads(Path(path).read_text()).values())
    store = open_store(url)
    coordinator = Coordinator(store, proxies, registry)
    started = time.perf_counter()
    outcome = coordinator.checkpoint(CHECKPOINT_ID, deadline_s=3600)
    assert outcome.clean, outcome.post_commit_errors
    written = time.perf_counter() - started
    return {
        "registry_s": populated,
        "checkpoint_s": written,
        "timings": outcome.timings,
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
    }


def build_grouped(url: str, n: int, participants: int, state_bytes: int, groups: int) -> dict[str, Any]:
    """``groups`` child processes one after the other, each building and committing its share of
    the participants, then one child publishing the checkpoint (``build_group``, ``build_publish``)."""
    half = participants // 2
    groups = max(1, min(groups, half))
    shares = [list(range(half))[g::groups] for g in range(groups)]
    children = []
    with tempfile.TemporaryDirectory(prefix="million-replies-") as folder:
        replies = []
        for g, pairs in enumerate(shares):
            path = str(Path(folder) / f"group-{g}.json")
            args = [url, str(n), str(participants), str(state_bytes), ",".join(map(str, pairs)), path]
            children.append(_child(["build-group", *args]))
            replies.append(path)
        publish = _child(["build-publish", url, str(n), *replies])
    return {
        "mode": f"{groups} groups",
        "groups": children,
        "publish": publish,
        "populate_s": sum(c["populate_s"] for c in children) + publish["registry_s"],
        "checkpoint_s": sum(c["commit_s"] for c in children) + publish["checkpoint_s"],
        **_store_totals(url),
        "peak_rss_mb": max([c["peak_rss_mb"] for c in children] + [publish["peak_rss_mb"]]),
    }


def default_groups(n: int, participants: int) -> int:
    """Enough groups that one holds at most about ``GROUP_ROLLOUTS`` rollouts."""
    return max(1, min(participants // 2, -(-n // GROUP_ROLLOUTS)))


def read(url: str, verify: bool) -> dict[str, Any]:
    from rollout_checkpoint.reader import load_checkpoint
    from rollout_checkpoint.store import CountingStore, open_store

    store = CountingStore(open_store(url))
    before = _rss_kb("VmRSS")
    started, cpu = time.perf_counter(), time.process_time()
    plan = load_checkpoint(store, CHECKPOINT_ID, verify=verify)
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
    parser.add_argument(
        "--build-groups",
        type=int,
        default=None,
        help="build in this many child processes of participants, one after the other (default: "
        f"a group holds at most about {GROUP_ROLLOUTS:,} rollouts); 0: every participant and the "
        "coordinator in one process",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, url, *rest = args.child
        if what == "build":
            result = build(url, int(rest[0]), int(rest[1]), int(rest[2]))
        elif what == "build-group":
            pairs = [int(k) for k in rest[3].split(",")]
            result = build_group(url, int(rest[0]), int(rest[1]), int(rest[2]), pairs, rest[4])
        elif what == "build-publish":
            result = build_publish(url, int(rest[0]), rest[1:])
        else:
            result = read(url, verify=what == "verify")
        print(json.dumps(result))
        return 0
    if args.participants < 2 or args.participants % 2:
        parser.error("--participants must be an even number >= 2")
    if args.build_groups is not None and args.build_groups < 0:
        parser.error("--build-groups must be >= 0")
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
                groups = args.build_groups
                if groups is None:
                    groups = default_groups(n, args.participants)
                if groups == 0:
                    built = _child(["build", url, str(n), str(args.participants), str(args.state_bytes)])
                else:
                    built = build_grouped(url, n, args.participants, args.state_bytes, groups)
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
