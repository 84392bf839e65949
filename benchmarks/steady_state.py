"""Steady state: later, incremental checkpoints where a fraction of the live rollouts moved.

    python benchmarks/steady_state.py [--rollouts 10000 100000] [--moved 0.1]
        [--transport inprocess|http|both] [--workers 2] [--runs 3] [--store URL] [--json]

The participants are ``demo_scale.py``'s (``_scale_servers.py``: an agent, a policy model and a
resources participant; every parked rollout has an agent boundary with ``DEMO_SCALE_STATE_BYTES``
(2 KiB) of opaque state, one staged model call and one resources session). ``inprocess`` holds them
in this process; ``http`` serves each from its own server with ``--workers`` worker processes
(real processes on 127.0.0.1) driven by ``RemoteParticipant``. After a first, full checkpoint
(reported as ``first``, not in the medians), every run moves ``--moved`` of the N live rollouts one
turn on (a new agent boundary with new state, a new staged model call, a new resources revision:
a fresh random sample each time) and takes one checkpoint with ``publication="sync"`` and, after
moving another sample, one with ``publication="async"`` (which goes first alternates by run).
The checkpoints are incremental (the default): what did not move is referenced, not rewritten.

Per checkpoint:

* ``pause_s``: first prepare to last resume (what the rollouts wait); ``published_s``: the whole
  call, publication included (an asynchronous one is waited for, so the memory figures cover it);
* ``objects_new`` / ``bytes_new``: objects the checkpoint created in the store and their bytes
  (a listing of the whole store before and after: every writer, in every process, is counted);
  in process also ``puts`` (write requests through the coordinator's store, overwrites included);
* ``rss``: for every process holding a participant (in process: this one, which also holds the
  coordinator; over HTTP: each server's supervisor and workers) its resident set before the
  checkpoint and its peak during it (Linux: ``VmHWM`` after resetting it through
  ``/proc/PID/clear_refs``), and ``peak_over_before``, the worst ratio of them.

Goals at 100,000 live rollouts (issue 26): async pause <= 0.5 s, and peak RSS during a
checkpoint <= 1.5x the RSS before it, for every participant process; ``goals`` in the JSON says
whether each was met. With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, peak_rss_mb
from _scale_servers import (
    advance_agent,
    advance_model,
    advance_resources,
    populate_agent,
    populate_model,
    populate_resources,
)
from demo_scale import CHUNK, KINDS, TOKEN, _registry, _servers
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.server import RemoteParticipant
from rollout_checkpoint.store import CountingStore, ObjectStore, open_store
from rollout_checkpoint.tokens import ObjectStoreTokenStore

MODES = ("sync", "async")
_WRITES = ("put", "put_if_absent", "put_if_match", "open_write")
GOAL_AT = 100_000
GOAL_ASYNC_PAUSE_S = 0.5
GOAL_RSS_RATIO = 1.5


# -- memory of the participant processes ------------------------------------------------------


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak(pid: int) -> bool:
    """Reset ``VmHWM`` of ``pid`` to its current RSS (Linux >= 4.0); ``False`` where refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


class Memory:
    """RSS before and peak during a checkpoint of the named processes."""

    def __init__(self, processes: dict[str, int]) -> None:
        self.processes = processes
        self.before: dict[str, int] = {}

    def start(self) -> None:
        self.before = {}
        for name, pid in self.processes.items():
            if _reset_peak(pid):
                self.before[name] = _status_kb(pid, "VmRSS")

    def stop(self) -> dict[str, Any]:
        rows = {}
        for name, before in self.before.items():
            peak = _status_kb(self.processes[name], "VmHWM")
            rows[name] = {"before_mb": before / 1024, "peak_mb": peak / 1024, "ratio": peak / before}
        worst = max((r["ratio"] for r in rows.values()), default=float("nan"))
        return {"processes": rows, "peak_over_before": worst}


# -- the two transports ------------------------------------------------------------------------


def _store_snapshot(store: ObjectStore) -> dict[str, int]:
    return {i.key: i.size for i in store.list("")}


def _category(key: str) -> str:
    """What a new object is, its ids generalised: ``agent: shards/``, ``published/``, ..."""
    parts = key.split("/")
    if parts[0] == "checkpoints" and len(parts) >= 3:
        if parts[2] == "components" and len(parts) >= 6:
            rest = parts[5:]
            name = rest[0] if len(rest) == 1 else rest[0] + "/"
            for stem in ("index-", "refs-"):
                if name.startswith(stem):
                    name = stem + "*.parquet"
            return f"component {parts[3]}: {name}"
        return f"checkpoint: {'/'.join(parts[2:])}"
    return parts[0] + ("/" if len(parts) > 1 else "")


def _by_category(new: dict[str, int]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for key, size in new.items():
        row = out.setdefault(_category(key), [0, 0])
        row[0] += 1
        row[1] += size
    return dict(sorted(out.items()))


def _checkpoint(
    coordinator: Coordinator, store: ObjectStore, counting: CountingStore | None, memory: Memory, mode: str
) -> dict[str, Any]:
    before = _store_snapshot(store)
    if counting is not None:
        counting.reset()
    gc.collect()
    memory.start()
    started = time.perf_counter()
    outcome = coordinator.checkpoint(deadline_s=900, publication=mode)
    published = time.perf_counter() - started
    rss = memory.stop()
    assert outcome.clean and outcome.publication == mode, outcome.post_commit_errors
    after = _store_snapshot(store)
    new = {k: size for k, size in after.items() if before.get(k) != size}
    row: dict[str, Any] = {
        "mode": mode,
        "pause_s": outcome.pause_seconds,
        "published_s": published,
        "objects_new": len(new),
        "bytes_new": sum(new.values()),
        "new_by_category": _by_category(new),  # category -> [objects, bytes]
        "rss": rss,
        "timings_ms": {k: round(v * 1000, 1) for k, v in outcome.timings.items()},
    }
    if counting is not None:
        row["puts"] = sum(counting.requests[op] for op in _WRITES)
        row["bytes_put"] = counting.bytes_written
    return row


class InProcess:
    def __init__(self, url: str, ids: list[str]) -> None:
        self.store = open_store(url)
        self.counting = CountingStore(self.store)
        self.tokens = ObjectStoreTokenStore(self.store)
        self.agent = AgentParticipant("agent-0")
        self.model = PolicyModelParticipant(self.tokens, "policy-0")
        self.resources = ResourcesParticipant("resources-0", mode="exported")
        populate_agent(self.agent, ids)
        populate_model(self.model, self.tokens, ids)
        populate_resources(self.resources, ids)
        participants = [self.agent, self.model, self.resources]
        self.coordinator = Coordinator(self.counting, participants, _registry(ids), self.tokens)
        self.memory = Memory({"this process (all three + coordinator)": os.getpid()})

    def advance(self, moved: list[str], turn: int) -> None:
        advance_agent(self.agent, moved, turn)
        advance_model(self.model, self.tokens, moved, turn)
        advance_resources(self.resources, moved, turn)

    def checkpoint(self, mode: str) -> dict[str, Any]:
        return _checkpoint(self.coordinator, self.store, self.counting, self.memory, mode)

    def close(self) -> None:
        for p in (self.agent, self.model, self.resources):
            p.close()


class OverHttp:
    def __init__(self, url: str, ids: list[str], workers: int) -> None:
        self.store = open_store(url)
        self.procs: list[Any] = []
        self._servers = _servers(url, workers, {}, self.procs)
        self.urls = self._servers.__enter__()
        self.client = httpx.Client(timeout=900)
        try:
            self._start(ids)
        except BaseException:
            self.client.close()
            self._servers.__exit__(None, None, None)
            raise

    def _start(self, ids: list[str]) -> None:
        # a rollout lives on the worker its populate chunk was routed to (by the chunk's first id)
        self.route = {r: ids[i - i % CHUNK] for i, r in enumerate(ids)}
        for start in range(0, len(ids), CHUNK):
            self._post("populate", {"rollout_ids": ids[start : start + CHUNK]}, ids[start])
        self.remotes = [RemoteParticipant(self.urls[k], token=TOKEN, brief_commits=True) for k in KINDS]
        self.coordinator = Coordinator(
            self.store, self.remotes, _registry(ids), ObjectStoreTokenStore(self.store)
        )
        processes = {}
        for kind, proc in zip(KINDS, self.procs, strict=True):
            for i, pid in enumerate(_descendants(proc.pid)):
                processes[f"{kind} {'supervisor' if pid == proc.pid else f'process {i}'} (pid {pid})"] = pid
        self.memory = Memory(processes)

    def _post(self, action: str, body: dict[str, Any], routed_by: str) -> None:
        for base in self.urls.values():
            self.client.post(f"{base}/ng-rollout/{routed_by}/bench/{action}", json=body).raise_for_status()

    def advance(self, moved: list[str], turn: int) -> None:
        groups: dict[str, list[str]] = {}
        for r in moved:
            groups.setdefault(self.route[r], []).append(r)
        for first, group in groups.items():
            self._post("advance", {"rollout_ids": group, "turn": turn}, first)

    def checkpoint(self, mode: str) -> dict[str, Any]:
        return _checkpoint(self.coordinator, self.store, None, self.memory, mode)

    def close(self) -> None:
        for remote in self.remotes:
            remote.close()
        self.client.close()
        self._servers.__exit__(None, None, None)


# -- one deployment: a full checkpoint, then the steady state ------------------------------


def run(transport: str, url: str, n: int, moved: float, runs: int, workers: int, seed: int) -> dict[str, Any]:
    ids = [f"rollout-{i:07d}" for i in range(n)]
    started = time.perf_counter()
    side: InProcess | OverHttp = (
        InProcess(url, ids) if transport == "inprocess" else OverHttp(url, ids, workers)
    )
    setup = time.perf_counter() - started
    rng = random.Random(seed)
    k = max(1, round(n * moved))
    try:
        first = side.checkpoint("sync")
        rows: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        turn = 1
        for r in range(runs):
            for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                turn += 1
                side.advance(sorted(rng.sample(ids, k)), turn)
                rows[mode].append(side.checkpoint(mode))
    finally:
        side.close()
    out: dict[str, Any] = {
        "transport": transport,
        "rollouts": n,
        "moved": k,
        "runs": runs,
        "setup_s": setup,
        "first": first,
    }
    for mode in MODES:
        xs = rows[mode]
        out[mode] = {
            "pause_s": median([x["pause_s"] for x in xs]),
            "pause_us_per_rollout": median([x["pause_s"] for x in xs]) / n * 1e6,
            "published_s": median([x["published_s"] for x in xs]),
            "objects_new": median([x["objects_new"] for x in xs]),
            "bytes_new": median([x["bytes_new"] for x in xs]),
            "rss_peak_over_before": max(x["rss"]["peak_over_before"] for x in xs),
            "checkpoints": xs,
        }
        if "puts" in xs[0]:
            out[mode]["puts"] = median([x["puts"] for x in xs])
    out["bytes_new_over_first"] = out["sync"]["bytes_new"] / first["bytes_new"]
    out["rss_peak_over_before"] = max(out[m]["rss_peak_over_before"] for m in MODES)
    if n >= GOAL_AT:
        out["goals"] = {
            "async_pause_s<=0.5": out["async"]["pause_s"] <= GOAL_ASYNC_PAUSE_S,
            "rss_peak_over_before<=1.5": out["rss_peak_over_before"] <= GOAL_RSS_RATIO,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument(
        "--moved", type=float, default=0.1, help="fraction of the live rollouts moved per checkpoint"
    )
    parser.add_argument("--transport", choices=["inprocess", "http", "both"], default="both")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per server (http)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument(
        "--store", default=None, help="local store folder, kept (default: a new temporary one, removed after)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    base = (args.store or tempfile.mkdtemp(prefix="steady-state-")).rstrip("/")
    transports = ["inprocess", "http"] if args.transport == "both" else [args.transport]
    results: list[dict[str, Any]] = []
    try:
        for n in sorted(args.rollouts):
            for transport in transports:
                try:
                    row = run(
                        transport,
                        f"{base}/{transport}-n{n}",
                        n,
                        args.moved,
                        args.runs,
                        args.workers,
                        args.seed,
                    )
                except Exception as exc:  # one size/transport failing keeps the others' figures
                    print(f"{transport} N={n}: failed: {exc!r}", file=sys.stderr, flush=True)
                    results.append({"transport": transport, "rollouts": n, "error": repr(exc)})
                    continue
                results.append(row)
                if not args.json:
                    sync, asyn = row["sync"], row["async"]
                    print(
                        f"{transport:9} N={n:>7} moved={row['moved']}: pause sync {sync['pause_s']:.3f}s "
                        f"async {asyn['pause_s']:.3f}s | new objects {sync['objects_new']:.0f}, "
                        f"{sync['bytes_new'] / 1e6:.1f} MB ({row['bytes_new_over_first']:.2f} of the "
                        f"first) | RSS peak/before {row['rss_peak_over_before']:.2f}"
                        + (f" | goals {row['goals']}" if "goals" in row else ""),
                        flush=True,
                    )
    finally:
        if args.store is None:
            shutil.rmtree(base, ignore_errors=True)
    summary = {
        "benchmark": "steady_state",
        "store": base,
        "moved_fraction": args.moved,
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "peak_rss_mb": peak_rss_mb(),
        "results": results,
    }
    if args.json:
        print(json.dumps(summary))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
