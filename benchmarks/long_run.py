"""Bytes written over a long run: full checkpoints (format 1) against incremental ones (format 2).

    python benchmarks/long_run.py [--rollouts 1000] [--turns 60] [--item-bytes 2048] [--every 2]
        [--store URL | --moto] [--max-chunks 32] [--json]

R rollouts take T turns each. A turn appends one item of about ``--item-bytes`` to the rollout's
history (``output_items`` of its agent boundary) and mutates the rollout's resources session; a
checkpoint is taken every ``--every`` turns (synchronous: the pause includes the upload). The
run is done twice with the same seed: once with every participant and the registry writing full
checkpoints (format 1), once incremental (format 2). Reported per checkpoint: bytes written,
objects written, shard (payload) bytes, pause, requests made (by operation) and the cycle's step
timings; per run: ``bytes_written_total``,
``final_state_bytes`` (the logical state of the last checkpoint: the uncompressed payload of
every record it holds, histories in full), their ratio, and the restore of one rollout from the
last checkpoint (objects and bytes read by ``format.chunks.read_boundary`` and the session's
point lookup; ``_cold`` also counts opening the two components). ``--store`` defaults to a
fresh local directory; ``s3://bucket/prefix`` with ``AWS_ENDPOINT_URL`` runs against S3;
``--moto`` starts a moto S3 server on 127.0.0.1 and runs there.
With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, storage_options
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.format.chunks import component_records
from rollout_checkpoint.format.layout import component_prefix
from rollout_checkpoint.format.records import AgentBoundaryRecord
from rollout_checkpoint.ids import ExecutionId
from rollout_checkpoint.participants import AgentParticipant, ResourcesParticipant
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.store import CountingStore, ObjectStore, open_store

_WORDS = [
    "the",
    "model",
    "calls",
    "a",
    "tool",
    "and",
    "reads",
    "its",
    "result",
    "then",
    "thinks",
    "about",
    "the",
    "next",
    "step",
    "error",
    "trace",
]
_WRITES = ("put", "put_if_absent", "put_if_match", "open_write")


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        word = rng.choice(_WORDS) if rng.random() < 0.8 else f"{rng.getrandbits(32):08x}"
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:size]


def run(url: str, args: argparse.Namespace, incremental: bool) -> dict[str, Any]:
    base = open_store(url, **storage_options(url, args.endpoint))
    store = CountingStore(base)
    agent = AgentParticipant("agent-0")
    resources = ResourcesParticipant("resources-0", mode="exported")
    for p in (agent, resources):
        p.incremental_commits = incremental
    agent.max_chunks = args.max_chunks
    registry = LiveExecutionRegistry()
    coordinator = Coordinator(store, [agent, resources], registry)
    if not incremental:
        coordinator.registry_catalog.enabled = False
    rng = random.Random(args.seed)
    executions: list[ExecutionId] = []
    histories: list[list[Any]] = []
    for i in range(args.rollouts):
        e = registry.dispatch(f"r-{i:06d}", input_digest=f"in-{i}")
        registry.start(e)
        agent.begin(e)
        resources.open_session(e, "env", {"turn": 0})
        executions.append(e)
        histories.append([])
    checkpoints: list[dict[str, Any]] = []
    last = ""
    for turn in range(1, args.turns + 1):
        for e, history in zip(executions, histories, strict=True):
            if turn > 1:  # begin() started the first turn
                agent.start_turn(e)
            revision = resources.mutate(e, "env", lambda s, t=turn: {"turn": t, "seen": rng.getrandbits(32)})
            history.append({"role": "assistant", "turn": turn, "content": _text(rng, args.item_bytes)})
            agent.boundary(
                e,
                AgentBoundaryRecord(
                    rollout_id=e.rollout_id,
                    attempt=e.attempt,
                    boundary_index=turn,
                    turn_index=turn,
                    resource_revisions={"resources-0": {"env": revision}},
                    output_items=list(history),
                    usage={"output_tokens": 50 * turn},
                ),
            )
        if turn % args.every == 0 or turn == args.turns:
            checkpoints.append(_checkpoint(coordinator, store, f"ck-{turn:04d}"))
            last = checkpoints[-1]["checkpoint_id"]
    # and one in which nothing changed
    idle = _checkpoint(coordinator, store, "ck-idle")
    for p in (agent, resources):
        p.close()
    state = _state_bytes(base, last)
    restore = _restore_one(base, last, executions[len(executions) // 2])
    total = sum(c["bytes_written"] for c in checkpoints)
    return {
        "mode": "incremental" if incremental else "full",
        "checkpoints": checkpoints,
        "idle_checkpoint": idle,
        "bytes_written_total": total,
        "objects_written_total": sum(c["objects_written"] for c in checkpoints),
        "final_state_bytes": state,
        "bytes_written_over_final_state": total / state,
        "pause_last_over_first": checkpoints[-1]["pause_ms"] / checkpoints[0]["pause_ms"],
        "restore_one_rollout": restore,
    }


def _checkpoint(coordinator: Coordinator, store: CountingStore, cid: str) -> dict[str, Any]:
    store.reset()
    started = time.perf_counter()
    outcome = coordinator.checkpoint(cid)
    elapsed = time.perf_counter() - started
    shard_bytes = 0
    for ref in load_checkpoint(store.inner, cid).record.components:
        shard_bytes += sum(s.bytes for s in ArchiveReader.open(store.inner, ref.prefix).manifest.shards)
    return {
        "checkpoint_id": cid,
        "bytes_written": store.bytes_written,
        "objects_written": sum(store.requests[op] for op in _WRITES),
        "requests": sum(store.requests.values()),
        "requests_by_operation": dict(sorted(store.requests.items())),
        "shard_bytes": shard_bytes,
        "pause_ms": outcome.pause_seconds * 1000,
        "cycle_ms": elapsed * 1000,
        "steps_ms": {k: round(v * 1000, 1) for k, v in outcome.timings.items()},
    }


def _state_bytes(store: ObjectStore, cid: str) -> int:
    """The logical state of checkpoint ``cid``: every record's payload as a full checkpoint
    (format 1) stores it, histories assembled."""
    total = 0
    for ref in load_checkpoint(store, cid).record.components:
        for record in component_records(ArchiveReader.open(store, ref.prefix)):
            total += len(record.to_payload())
    return total


def _restore_one(store: ObjectStore, cid: str, e: ExecutionId) -> dict[str, Any]:
    """Read one rollout's agent boundary (history assembled, ``format.chunks.read_boundary``: never
    a base's member index) and resources session from ``cid``. ``objects_read``/``bytes_read``
    count the GETs and ranged GETs once the two components are open (manifest, member index and
    reference table read); the ``_cold`` figures count those too."""
    from rollout_checkpoint.format.chunks import read_boundary

    counting = CountingStore(store)
    agent = ArchiveReader.open(counting, component_prefix(cid, "agent", "agent-0"))
    resources = ArchiveReader.open(counting, component_prefix(cid, "resources", "resources-0"))
    boundary_key = max(
        m.key
        for m in agent.members("agent_boundary")
        if (m.rollout_id, m.attempt) == (e.rollout_id, e.attempt)
    )
    resources.references()  # its reference table, as opening the agent's did
    cold_objects, cold_bytes = sum(counting.requests.values()), counting.bytes_read
    counting.reset()
    boundary = read_boundary(agent, e.rollout_id, e.attempt, boundary_key)
    session = resources.get_raw("resource_snapshot", e.rollout_id, e.attempt, "env")
    assert isinstance(boundary, AgentBoundaryRecord) and session.payload
    objects, read = sum(counting.requests.values()), counting.bytes_read
    return {
        "history_items": len(boundary.output_items),
        "referenced_chunks": sum(1 for r in agent.references("output_chunk") if r.rollout_id == e.rollout_id),
        "objects_read": objects,
        "bytes_read": read,
        "objects_read_cold": objects + cold_objects,
        "bytes_read_cold": read + cold_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--item-bytes", type=int, default=2048)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--max-chunks", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--store", default=None, help="store URL (default: a fresh local directory)")
    parser.add_argument("--moto", action="store_true", help="run on a moto S3 server on 127.0.0.1")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    args.endpoint = None
    moto = None
    if args.moto:
        from peer_store import make_bucket, start_moto

        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
            os.environ.setdefault(name, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        moto, args.endpoint = start_moto()
        make_bucket(args.endpoint, "long-run")
        args.store = "s3://long-run/bench"
    try:
        return _main(args)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait()


def _main(args: argparse.Namespace) -> int:
    root = args.store or tempfile.mkdtemp(prefix="long-run-")
    tag = uuid.uuid4().hex[:8]
    results = {
        mode: run(f"{root.rstrip('/')}/{mode}-{tag}", args, mode == "incremental")
        for mode in ("full", "incremental")
    }
    full, inc = results["full"], results["incremental"]
    summary = {
        "benchmark": "long_run",
        "args": {k: v for k, v in vars(args).items() if k != "endpoint"},
        "machine": machine_info(),
        "full": full,
        "incremental": inc,
        "incremental_bytes_over_full": inc["bytes_written_total"] / full["bytes_written_total"],
    }
    if not args.json:
        for r in (full, inc):
            first, last = r["checkpoints"][0], r["checkpoints"][-1]
            restore = r["restore_one_rollout"]
            print(
                f"{r['mode']:11}: wrote {r['bytes_written_total']:,} B in {r['objects_written_total']} "
                f"objects; final state {r['final_state_bytes']:,} B; "
                f"ratio {r['bytes_written_over_final_state']:.2f}; pause first {first['pause_ms']:.0f} ms "
                f"last {last['pause_ms']:.0f} ms (x{r['pause_last_over_first']:.2f}); idle checkpoint "
                f"shard bytes {r['idle_checkpoint']['shard_bytes']:,}; restore of one rollout: "
                f"{restore['objects_read']} objects, {restore['bytes_read']:,} B",
                flush=True,
            )
        print(f"incremental / full bytes: {summary['incremental_bytes_over_full']:.3f}")
    print(json.dumps(summary) if args.json else "", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
