"""Checkpoint pause over HTTP against the number of concurrent rollouts, 2 workers per server.

    python benchmarks/demo_scale.py [--rollouts 100 1000 5000] [--runs 3] [--stores local s3]
        [--s3-trace] [--json]

For every store and N: an agent, a policy-model and a resources server (``_scale_servers.py``,
each ``run_server(..., workers=2)``: a worker group over two uvicorn worker processes, real
processes on 127.0.0.1) hold N parked rollouts spread over their workers; the coordinator in
this process drives them with ``RemoteParticipant`` and takes ``--runs`` checkpoints. Reported:
pause (first prepare to last resume) p50 and max, the checkpoint's bytes, and the same N
in-process (the same participants and state in this process, no HTTP) as the baseline measured
in the same run. ``s3`` runs against a moto server started here on 127.0.0.1 (or
``AWS_ENDPOINT_URL``). ``--s3-trace`` runs moto with a request log (``_moto_trace.py``) and
adds, per checkpoint, its S3 requests and how long moto was busy. With ``--json`` the last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, peak_rss_mb
from _moto_trace import read as read_trace
from _moto_trace import summarize
from _scale_servers import populate_agent, populate_model, populate_resources
from rollout_checkpoint.coordinator import CheckpointOutcome, Coordinator
from rollout_checkpoint.format.layout import checkpoint_prefix
from rollout_checkpoint.participants import AgentParticipant, PolicyModelParticipant, ResourcesParticipant
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import CHECKPOINT_ROUTE_PREFIX, RemoteParticipant
from rollout_checkpoint.store import ObjectStore, open_store
from rollout_checkpoint.tokens import ObjectStoreTokenStore

HERE = Path(__file__).resolve().parent
KINDS = ("agent", "model", "resources")
CHUNK = 250
TOKEN = uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _servers(
    url: str, workers: int, env: dict[str, str], procs: list[subprocess.Popen[bytes]] | None = None
) -> Iterator[dict[str, str]]:
    """Serve every kind on 127.0.0.1; ``procs`` (if given) receives the server processes."""
    procs = [] if procs is None else procs
    urls: dict[str, str] = {}
    try:
        for kind in KINDS:
            port = _free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "_scale_servers.py"), kind, url, str(port), str(workers)],
                    env={**os.environ, **env, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            urls[kind] = f"http://127.0.0.1:{port}"
        for base in urls.values():
            _wait_workers(base, workers)
        yield urls
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _wait_workers(base: str, workers: int) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            status = httpx.get(
                f"{base}{CHECKPOINT_ROUTE_PREFIX}/status", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            if status.status_code == 200 and status.json().get("workers") == workers:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{base} did not start {workers} workers")


def _checkpoint_bytes(store: ObjectStore, checkpoint_id: str) -> int:
    return sum(i.size for i in store.list(checkpoint_prefix(checkpoint_id) + "/"))


def _registry(ids: list[str]) -> LiveExecutionRegistry:
    registry = LiveExecutionRegistry()
    for rollout_id in ids:
        registry.start(registry.dispatch(rollout_id, input_digest=rollout_id))
    return registry


def run_http(url: str, n: int, runs: int, workers: int, env: dict[str, str]) -> dict[str, Any]:
    store = open_store(url)
    ids = [f"rollout-{i:07d}" for i in range(n)]
    with _servers(url, workers, env) as urls, httpx.Client(timeout=300) as client:
        started = time.perf_counter()
        for start in range(0, n, CHUNK):
            chunk = ids[start : start + CHUNK]
            for base in urls.values():
                response = client.post(
                    f"{base}/ng-rollout/{chunk[0]}/bench/populate", json={"rollout_ids": chunk}
                )
                response.raise_for_status()
        setup = time.perf_counter() - started
        # the coordinator never reads a commit reply's execution lists: brief replies (as the demo's)
        remotes = [RemoteParticipant(urls[k], token=TOKEN, brief_commits=True) for k in KINDS]
        coordinator = Coordinator(store, remotes, _registry(ids), ObjectStoreTokenStore(store))
        outcomes, windows = _timed(coordinator, runs)
        for remote in remotes:
            remote.close()
    assert all(o.clean for o in outcomes)
    pauses = [o.pause_seconds for o in outcomes]
    return {
        "windows": windows,
        "setup_s": setup,
        "pause_ms_p50": median(pauses) * 1000,
        "pause_ms_max": max(pauses) * 1000,
        "checkpoint_bytes": _checkpoint_bytes(store, outcomes[-1].checkpoint_id),
        "timings_ms": {k: v * 1000 for k, v in outcomes[-1].timings.items()},
    }


GAP_S = 1.0
"""Seconds between two checkpoints (``--gap``)."""


def _timed(coordinator: Coordinator, runs: int) -> tuple[list[CheckpointOutcome], list[tuple[float, float]]]:
    """``runs`` checkpoints and the wall-clock window of each (to cut an S3 trace by)."""
    outcomes, windows = [], []
    for run in range(runs):
        if run:
            time.sleep(GAP_S)  # a run checkpoints periodically: one's background work ends first
        started = time.time()
        outcomes.append(coordinator.checkpoint(deadline_s=600))
        windows.append((started, time.time()))
    return outcomes, windows


def run_inprocess(url: str, n: int, runs: int) -> dict[str, Any]:
    store = open_store(url)
    ids = [f"rollout-{i:07d}" for i in range(n)]
    tokens = ObjectStoreTokenStore(store)
    agent = AgentParticipant("agent-0")
    model = PolicyModelParticipant(tokens, "policy-0")
    resources = ResourcesParticipant("resources-0", mode="exported")
    populate_agent(agent, ids)
    populate_model(model, tokens, ids)
    populate_resources(resources, ids)
    coordinator = Coordinator(store, [agent, model, resources], _registry(ids), tokens)
    outcomes, windows = _timed(coordinator, runs)
    for participant in (agent, model, resources):
        participant.close()
    pauses = [o.pause_seconds for o in outcomes]
    return {
        "windows": windows,
        "pause_ms_p50": median(pauses) * 1000,
        "pause_ms_max": max(pauses) * 1000,
        "checkpoint_bytes": _checkpoint_bytes(store, outcomes[-1].checkpoint_id),
        "timings_ms": {k: v * 1000 for k, v in outcomes[-1].timings.items()},
    }


@contextlib.contextmanager
def _s3_endpoint(trace: Path | None = None) -> Iterator[str]:
    given = os.environ.get("AWS_ENDPOINT_URL")
    if given and trace is None:
        yield given
        return
    port = _free_port()
    command = (
        [sys.executable, str(HERE / "_moto_trace.py"), str(port), str(trace)]
        if trace is not None
        else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    )
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(endpoint)
                break
            time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--gap",
        type=float,
        default=1.0,
        help="seconds between checkpoints: what runs after one's resume (an asynchronous "
        "upload, deletes) is then not counted in the next one's window",
    )
    parser.add_argument("--stores", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument(
        "--s3-trace",
        action="store_true",
        help="run moto with a request trace and report, per checkpoint, S3 requests, busy and summed time",
    )
    args = parser.parse_args(argv)
    global GAP_S
    GAP_S = args.gap
    results: list[dict[str, Any]] = []
    for kind in args.stores:
        with contextlib.ExitStack() as stack:
            env: dict[str, str] = {}
            if kind == "s3":
                trace = None
                if args.s3_trace:
                    trace = Path(tempfile.mkdtemp(prefix="demo-scale-trace-")) / "s3.jsonl"
                endpoint = stack.enter_context(_s3_endpoint(trace))
                env = {
                    "AWS_ENDPOINT_URL": endpoint,
                    "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
                    "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
                    "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                }
                os.environ.update(env)
                bucket = f"demo-scale-{uuid.uuid4().hex[:8]}"
                import boto3

                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
                base = f"s3://{bucket}/bench"
            else:
                base = tempfile.mkdtemp(prefix="demo-scale-")
            for n in sorted(args.rollouts):
                http = run_http(f"{base}/http-n{n}", n, args.runs, args.workers, env)
                local = run_inprocess(f"{base}/inproc-n{n}", n, args.runs)
                row = {
                    "store": kind,
                    "rollouts": n,
                    "workers_per_server": args.workers,
                    "runs": args.runs,
                    "http": http,
                    "in_process": local,
                    "http_over_in_process_p50": http["pause_ms_p50"] / local["pause_ms_p50"],
                }
                if kind == "s3" and args.s3_trace:
                    lines = read_trace(trace)  # type: ignore[arg-type]
                    for side in (http, local):
                        side["s3"] = [summarize(lines, lo, hi) for lo, hi in side["windows"]]
                for side in (http, local):
                    del side["windows"]
                results.append(row)
                if not args.json:
                    print(
                        f"{kind:5} N={n:>5}: HTTP pause p50 {http['pause_ms_p50']:8.1f} ms max "
                        f"{http['pause_ms_max']:8.1f} ms | in-process p50 {local['pause_ms_p50']:8.1f} ms "
                        f"| checkpoint {http['checkpoint_bytes']:,} B",
                        flush=True,
                    )
                    for name, side in (("HTTP", http), ("in-process", local)):
                        for i, trace_row in enumerate(side.get("s3", [])):
                            print(
                                f"      {name} checkpoint {i}: {trace_row['requests']} S3 requests, "
                                f"S3 busy {trace_row['s3_busy_ms']:.0f} ms, "
                                f"summed {trace_row['s3_summed_ms']:.0f} ms",
                                flush=True,
                            )
    for kind in args.stores:
        rows = [r for r in results if r["store"] == kind]
        for row in rows:
            row["ratio_rollouts"] = row["rollouts"] / rows[0]["rollouts"]
            row["ratio_http_pause_p50"] = row["http"]["pause_ms_p50"] / rows[0]["http"]["pause_ms_p50"]
    summary = {
        "benchmark": "demo_scale",
        "machine": machine_info(),
        "peak_rss_mb": peak_rss_mb(),
        "results": results,
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
