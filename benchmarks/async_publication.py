"""The pause of a checkpoint cycle with asynchronous publication on and off.

    python benchmarks/async_publication.py [--store URL] [--endpoint-url URL] \\
        [--rollouts 1000 10000] [--runs R] [--state-bytes B] [--json]

For every N and run, two fresh in-process deployments (``rollout_checkpoint.demo.DemoDeployment``:
agent, policy model and resources participants holding N live rollouts, the mix of
``checkpoint_cycle.py``) each take one checkpoint, one with ``publication="sync"`` and one with
``publication="async"``, alternating which goes first. The setup's garbage is collected before
each cycle (the setup builds N rollouts in one burst, which a real run spreads over hours), as in
``checkpoint_cycle.py``. Figures per mode, medians over runs:

* pause: first prepare to last resume (what the rollouts wait);
* published: start of the call to the global record written (the whole cycle);
* publish: first commit to the global record.

``ratio_pause`` = async pause / sync pause and ``ratio_published`` = async / sync time to the
record, both from the same run. Every checkpoint is verified (``verify_checkpoint``) after the
timing. With ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, payloads, peak_rss_mb, storage_options
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.reader import verify_checkpoint
from rollout_checkpoint.store import open_store

MODES = ("sync", "async")


def run_one(url: str, n: int, mode: str, options: dict[str, Any], state_bytes: int) -> dict[str, Any]:
    store = open_store(url, **options)
    deployment = DemoDeployment(store)
    deployment.populate(n, agent_states=payloads(n, state_bytes, seed=n))
    # the setup builds N rollouts in one burst, which a real run spreads over hours: collect its
    # garbage now so that the cycle is not charged for it (checkpoint_cycle.py does the same)
    gc.collect()
    try:
        started = time.perf_counter()
        outcome = deployment.checkpoint(deadline_s=900, publication=mode)
        published = time.perf_counter() - started
    finally:
        deployment.close()
    assert outcome.clean and outcome.publication == mode, outcome.post_commit_errors
    verify_checkpoint(store, outcome.checkpoint_id)
    return {
        "pause_s": outcome.pause_seconds,
        "published_s": published,
        "publish_s": outcome.publish_seconds,
        "timings": {k: round(v, 4) for k, v in outcome.timings.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", default=None, help="store URL (default: a new temporary directory)")
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--rollouts", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-bytes", type=int, default=2048, help="opaque agent state per parked rollout")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args(argv)
    base = (args.store or tempfile.mkdtemp(prefix="async-publication-")).rstrip("/")
    results: list[dict[str, Any]] = []
    for n in sorted(args.rollouts):
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for r in range(args.runs):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                url = f"{base}/n{n}-{mode}-{r}"
                runs[mode].append(
                    run_one(url, n, mode, storage_options(url, args.endpoint_url), args.state_bytes)
                )
        row: dict[str, Any] = {"rollouts": n, "runs": args.runs}
        for mode in MODES:
            for key in ("pause_s", "published_s", "publish_s"):
                row[f"{mode}_{key}"] = median([x[key] for x in runs[mode]])
            row[f"{mode}_pause_us_per_rollout"] = row[f"{mode}_pause_s"] / n * 1e6
            row[f"{mode}_timings"] = runs[mode][-1]["timings"]
        row["ratio_pause"] = row["async_pause_s"] / row["sync_pause_s"]
        row["ratio_published"] = row["async_published_s"] / row["sync_published_s"]
        results.append(row)
        if not args.json:
            print(
                f"N={n:>7}: pause sync {row['sync_pause_s']:.3f}s async {row['async_pause_s']:.3f}s "
                f"(x{row['ratio_pause']:.2f}); published sync {row['sync_published_s']:.3f}s "
                f"async {row['async_published_s']:.3f}s (x{row['ratio_published']:.2f})",
                flush=True,
            )
    summary = {
        "benchmark": "async_publication",
        "store": base,
        "machine": machine_info(),
        "peak_rss_mb": peak_rss_mb(),
        "results": results,
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
