"""Peak RSS floors for ``peer_store.py``'s write: how much of the SDK's peak any pyarrow writer pays.

    python benchmarks/rss_floor.py [--records 100000] [--runs 3] [--json]

Each step runs in a fresh process over the same records as ``peer_store.py`` (its generator, its
batches of 1,024 dicts), and reports the process's peak RSS (``VmHWM``):

* ``baseline``: the JSONL peer's write (``peer_store.py``'s baseline side);
* ``pyarrow_import``: ``import pyarrow``, then ``orjson.dumps`` of every record (no Arrow);
* ``arrow_tables``: the same, and each batch becomes an Arrow table (rollout ids and payloads,
  Arrow's default pool), dropped at once: the least any Arrow-based writer does;
* ``naive_parquet``: the same tables written with one ``write_table`` per batch into one local
  Parquet file (zstd level 1, 512-row row groups): the plainest pyarrow Parquet writer;
* ``sdk``: ``ArchiveWriter.write_records`` + ``commit`` (``peer_store.py``'s SDK side).

Goal 3 of issue 9 asks for the SDK's peak at most the baseline's plus 60 MB; the steps show how
much of that allowance importing pyarrow and building Arrow data from these dicts take by
themselves. Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, median, peak_rss_mb

STEPS = ("baseline", "pyarrow_import", "arrow_tables", "naive_parquet", "sdk")


def child(step: str, records: int, target: str) -> float:
    import peer_store

    if step == "baseline":
        peer_store.baseline_write(target, records)
    elif step == "sdk":
        peer_store.sdk_write(target, None, records)
    else:
        import orjson
        import pyarrow as pa

        writer: Any = None
        schema = pa.schema([pa.field("rollout_id", pa.string()), pa.field("payload", pa.binary())])
        if step == "naive_parquet":
            from pyarrow._parquet import ParquetWriter

            Path(target).mkdir(parents=True, exist_ok=True)
            writer = ParquetWriter(
                str(Path(target) / "naive.parquet"),
                schema,
                version="2.6",
                writer_engine_version="V2",  # what pyarrow.parquet.ParquetWriter passes
                compression="zstd",
                compression_level=1,
                use_dictionary=False,
                write_statistics=False,
            )
        for batch in peer_store.batches(records):
            if step == "pyarrow_import":
                for r in batch:
                    orjson.dumps(r)
                continue
            payloads = [orjson.dumps(r) for r in batch]
            ids = [r["rollout_id"] for r in batch]
            table = pa.table({"rollout_id": ids, "payload": pa.array(payloads, pa.binary())}, schema=schema)
            if writer is not None:
                writer.write_table(table, row_group_size=512)
            del table
        if writer is not None:
            writer.close()
    return peak_rss_mb()


def run_child(step: str, records: int) -> float:
    scratch = tempfile.mkdtemp(prefix="rss-floor-")
    try:
        cmd = [sys.executable, __file__, "--child", step, "--records", str(records)]
        cmd += ["--target", scratch + "/t"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"step {step} failed:\n{proc.stderr}")
        return float(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(round(child(args.child, args.records, args.target), 2))
        return
    peaks: dict[str, list[float]] = {step: [] for step in STEPS}
    for run in range(args.runs):
        for step in STEPS if run % 2 == 0 else STEPS[::-1]:
            peaks[step].append(run_child(step, args.records))
    result: dict[str, Any] = {
        "machine": machine_info(),
        "records": args.records,
        "runs": args.runs,
        "peak_rss_mb": {step: round(median(values), 1) for step, values in peaks.items()},
        "all_runs": peaks,
    }
    base = result["peak_rss_mb"]["baseline"]
    result["over_baseline_mb"] = {step: round(v - base, 1) for step, v in result["peak_rss_mb"].items()}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for step in STEPS:
            peak, over = result["peak_rss_mb"][step], result["over_baseline_mb"][step]
            print(f"{step:16s} {peak:7.1f} MB  (+{over} MB)")


if __name__ == "__main__":
    main()
