"""Checkpoint cycle cost against the number of live rollouts.

    python benchmarks/checkpoint_cycle.py [--store URL] [--endpoint-url URL] \\
        [--rollouts 1000 10000 100000] [--runs R] [--tracing off|on] [--json]

For every N: in-process participants of each kind (agent, policy model, resources: 3
participants, ``rollout_checkpoint.demo.DemoDeployment``) hold N live rollouts (20%
finished and handed off, 10% never started, 10% restart-only, 60% parked at a turn boundary
with a staged model call, a resources session and ``--state-bytes`` of opaque agent state).
One checkpoint cycle is timed:

* pause: first prepare to last resume (what the rollouts wait);
* publish: first commit to the global record written (the commit point);
* pause cpu: CPU seconds of the whole process (every thread) during the cycle, less sensitive
  than wall time to other jobs on a shared machine;
* exports: wall time of the participants' ``_export`` (under each participant's lock: what
  freezing the snapshot costs, the part of the pause asynchronous publication cannot remove);
* gc: wall time the cyclic garbage collector ran during the cycle (the setup's own collection
  debt is paid by a ``gc.collect()`` before the cycle, as a long-running server pays it along
  the way);
* classify: ``load_checkpoint`` of the published checkpoint, with the bytes it read next to the
  bytes of shard payload in the checkpoint (classify reads manifests and member indexes only).

Medians over ``--runs``; every figure is also given per rollout and as a ratio against the
first (smallest) N of the same run, next to the ratio of N itself (equal ratios = linear).
``--profile N`` instead runs one cycle at N rollouts under cProfile (the coordinator's thread
and every participant's commit thread, merged) and prints the top functions by own time and by
cumulative time, next to the cycle's step timings.

``--tracing on`` installs the OpenTelemetry SDK (``opentelemetry-sdk``, the test extra) before
the first cycle: a tracer provider exporting every span to the in-memory exporter through a
simple (synchronous) span processor, and a meter provider with an in-memory reader; ``off`` (the
default) leaves the API without a provider, as an application that configures none. Compare the
two in one run with ``benchmarks/tracing_overhead.py``.

Checkpoints stay in the store (``<store>/n<N>``) so ``rollout-checkpoint list / classify /
verify`` work on them afterwards. With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, payloads, peak_rss_mb, storage_options
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.format.layout import checkpoint_prefix
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.store import open_store


def _sub_url(base: str, n: int) -> str:
    return f"{base.rstrip('/')}/n{n}"


def _timed(fn: Any, into: dict[str, float], name: str) -> Any:
    """``fn`` that adds its wall time to ``into[name]`` (the participants' ``_export``: the part
    of a commit that runs under the participant's lock, what a frozen snapshot costs)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into[name] = into.get(name, 0.0) + time.perf_counter() - started

    return run


class _GcTimer:
    """Wall time the cyclic garbage collector ran (any thread) while the context is open."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        self._open = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if not self._open:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> _GcTimer:
        self._open = True
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        self._open = False
        gc.callbacks.remove(self._callback)


def install_tracing() -> Any:
    """The SDK with in-memory exporters (what ``--tracing on`` measures); returns the exporter."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return exporter


def run_one(url: str, n: int, options: dict[str, Any], state_bytes: int) -> dict[str, Any]:
    store = open_store(url, **options)
    started = time.perf_counter()
    deployment = DemoDeployment(store)
    made = deployment.populate(n, agent_states=payloads(n, state_bytes, seed=n))
    # Pay the setup's garbage-collection debt now: populating N rollouts leaves hundreds of
    # thousands of new objects pending a full collection, which the first allocations of the
    # timed cycle would otherwise trigger (a long-running server pays it along the way).
    gc.collect()
    setup = time.perf_counter() - started
    exports: dict[str, float] = {}
    for participant in deployment.participants:
        participant._export = _timed(participant._export, exports, participant.kind)  # type: ignore[method-assign]
    gc_time = _GcTimer()
    cpu = time.process_time()
    try:
        with gc_time:
            outcome = deployment.checkpoint(deadline_s=600)
        cpu = time.process_time() - cpu
    finally:
        deployment.close()
    assert outcome.clean, outcome.post_commit_errors
    plan = load_checkpoint(store, outcome.checkpoint_id, verify=False)
    listing = store.list(checkpoint_prefix(outcome.checkpoint_id) + "/")
    payload = sum(i.size for i in listing if "/shards/" in i.key)
    index = sum(i.size for i in listing if "/index-" in i.key)
    return {
        "checkpoint_id": outcome.checkpoint_id,
        "setup_s": setup,
        "pause_s": outcome.pause_seconds,
        "pause_cpu_s": cpu,
        "export_s": sum(exports.values()),
        "exports": {k: round(v, 4) for k, v in exports.items()},
        "gc_s": gc_time.seconds,
        "publish_s": outcome.publish_seconds,
        "classify_s": plan.seconds,
        "classify_bytes_read": plan.bytes_read,
        "classify_objects_read": plan.keys_read,
        "shard_payload_bytes": payload,
        "index_bytes": index,
        "counts": plan.counts(),
        "created": made,
        "timings": {k: round(v, 4) for k, v in outcome.timings.items()},
    }


def profile_one(url: str, n: int, options: dict[str, Any], state_bytes: int, top: int) -> dict[str, Any]:
    """One cycle under cProfile: the coordinator's thread plus each participant's commit when it
    runs on a coordinator worker thread (a profile sees only the thread it is enabled in)."""
    store = open_store(url, **options)
    deployment = DemoDeployment(store)
    deployment.populate(n, agent_states=payloads(n, state_bytes, seed=n))
    gc.collect()  # as run_one: the setup's collection debt is not the cycle's
    profiles: list[cProfile.Profile] = []

    def profiled(fn: Any) -> Any:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                return fn(*args, **kwargs)  # already under the main profile (one per thread)
            profile = cProfile.Profile()
            profiles.append(profile)
            return profile.runcall(fn, *args, **kwargs)

        return run

    for participant in deployment.participants:
        participant.commit = profiled(participant.commit)  # type: ignore[method-assign]
    main_profile = cProfile.Profile()
    profiles.append(main_profile)
    try:
        outcome = main_profile.runcall(deployment.checkpoint, deadline_s=600)
    finally:
        deployment.close()
    assert outcome.clean, outcome.post_commit_errors
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    out: dict[str, Any] = {"rollouts": n, "pause_s": outcome.pause_seconds, "timings": outcome.timings}
    for order in ("tottime", "cumulative"):
        buffer = io.StringIO()
        stats.stream = buffer  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(top)
        out[order] = buffer.getvalue()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", default=None, help="store URL (default: a new temporary directory)")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--rollouts", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--state-bytes", type=int, default=2048, help="opaque agent state per parked rollout (default 2 KiB)"
    )
    parser.add_argument(
        "--tracing",
        choices=("off", "on"),
        default="off",
        help="on: OpenTelemetry SDK with in-memory exporters; off: the API without a provider",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument(
        "--profile", type=int, default=None, metavar="N", help="profile one cycle at N rollouts instead"
    )
    parser.add_argument("--top", type=int, default=25, help="functions listed by --profile (default 25)")
    args = parser.parse_args(argv)
    base = args.store or tempfile.mkdtemp(prefix="checkpoint-cycle-")
    exporter = install_tracing() if args.tracing == "on" else None
    if args.profile is not None:
        url = _sub_url(base, args.profile)
        profiled = profile_one(
            url, args.profile, storage_options(url, args.endpoint_url), args.state_bytes, args.top
        )
        if args.json:
            print(json.dumps(profiled))
        else:
            print(f"N={args.profile}: pause {profiled['pause_s']:.3f}s  timings {profiled['timings']}")
            print(profiled["tottime"])
            print(profiled["cumulative"])
        return 0
    sizes = sorted(args.rollouts)
    results: list[dict[str, Any]] = []
    for n in sizes:
        url = _sub_url(base, n)
        options = storage_options(url, args.endpoint_url)
        runs = [run_one(url, n, options, args.state_bytes) for _ in range(args.runs)]
        row: dict[str, Any] = {"rollouts": n, "participants": 3, "url": url, "runs": len(runs)}
        for key in ("setup_s", "pause_s", "pause_cpu_s", "export_s", "gc_s", "publish_s", "classify_s"):
            row[key] = median([r[key] for r in runs])
        for key in ("classify_bytes_read", "classify_objects_read", "shard_payload_bytes", "index_bytes"):
            row[key] = runs[-1][key]
        row["counts"] = runs[-1]["counts"]
        row["timings"] = runs[-1]["timings"]
        row["checkpoint_id"] = runs[-1]["checkpoint_id"]
        row["pause_us_per_rollout"] = row["pause_s"] / n * 1e6
        row["pause_cpu_us_per_rollout"] = row["pause_cpu_s"] / n * 1e6
        row["export_us_per_rollout"] = row["export_s"] / n * 1e6
        row["exports"] = runs[-1]["exports"]
        if exporter is not None:
            row["spans"] = len(exporter.get_finished_spans())
            exporter.clear()
        row["publish_us_per_rollout"] = row["publish_s"] / n * 1e6
        row["classify_us_per_rollout"] = row["classify_s"] / n * 1e6
        results.append(row)
        if not args.json:
            print(
                f"N={n:>7}: pause {row['pause_s']:.3f}s (cpu {row['pause_cpu_s']:.3f}s, exports "
                f"{row['export_s']:.3f}s, gc {row['gc_s']:.3f}s)  publish {row['publish_s']:.3f}s  "
                f"classify {row['classify_s']:.3f}s  read {row['classify_bytes_read']:,} B "
                f"(shard payload {row['shard_payload_bytes']:,} B)  {row['counts']}",
                flush=True,
            )
    base_row = results[0]
    for row in results:
        scale = row["rollouts"] / base_row["rollouts"]
        row["ratio_rollouts"] = scale
        for key in ("pause_s", "publish_s", "classify_s", "classify_bytes_read"):
            ratio = row[key] / base_row[key] if base_row[key] else 0.0
            row[f"ratio_{key}"] = ratio
            row[f"linearity_{key}"] = ratio / scale  # 1.0 = exactly linear
    summary = {
        "benchmark": "checkpoint_cycle",
        "tracing": args.tracing,
        "store": base,
        "machine": machine_info(),
        "peak_rss_mb": peak_rss_mb(),
        "results": results,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"checkpoints are under {base} (n<N> per size); try: rollout-checkpoint list {results[-1]['url']}"
        )
        for row in results:
            print(
                f"N={row['rollouts']:>7} x{row['ratio_rollouts']:.0f}: pause x{row['ratio_pause_s']:.1f}, "
                f"publish x{row['ratio_publish_s']:.1f}, classify x{row['ratio_classify_s']:.1f}, "
                f"bytes read x{row['ratio_classify_bytes_read']:.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
