"""Shard writer throughput, the naive one-object-per-record layout, and peak RSS.

    python benchmarks/shard_throughput.py --store URL [--endpoint-url URL] --records N \\
        --record-bytes B [--target-shard-mb M] [--runs R] [--stream-gib G] [--skip-naive] \\
        [--skip-rss] [--naive-records N] [--json]

1. SDK writer MB/s of record payload vs a ceiling measured in the same run on the same store:
   the same records built into one Arrow table in memory and written with
   ``pyarrow.parquet.write_table`` (zstd level 1) plus one ``store.put`` (``ceiling_mb_s``, the
   issue's definition: build + write). The write alone, from a prebuilt table, is reported too
   (``ceiling_write_only_mb_s``, ``ratio_to_write_only``): a harder bound. Median over ``--runs``;
   goal ratio >= 0.6.
2. The SDK vs one object per record for ``--naive-records`` records (``store.put`` per record;
   on S3 s3fs's concurrent batch upload ``fs.pipe({path: bytes})``): seconds, speedup, objects
   the SDK created.
3. Peak RSS of a child process streaming ``--stream-gib`` GiB through one writer, against the
   bound 4 x target + 150 MiB.

The throughput archives stay in the store (``inspect`` / ``verify`` work on the URL afterwards);
the ceiling objects, the naive objects and the RSS stream's archive are removed. With ``--json``
one JSON object is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa
import pyarrow.parquet as pq

from _common import machine_info, median, payloads, peak_rss_mb, storage_options
from rollout_checkpoint.archive import SHARD_SCHEMA, ArchiveWriter
from rollout_checkpoint.format.layout import component_prefix
from rollout_checkpoint.store import ObjectStore, open_store

KIND = "agent_boundary"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ids_for(n: int) -> tuple[list[str], list[str]]:
    """Rollout ids (10 members each) and member keys, like a participant's boundaries."""
    return [f"rollout-{i // 10:07d}" for i in range(n)], [f"{i % 10:08d}" for i in range(n)]


def write_sdk(
    store: ObjectStore, prefix: str, data: list[bytes], rids: list[str], keys: list[str], target: int
) -> float:
    start = time.perf_counter()
    _, checkpoint_id, _, kind, instance = prefix.split("/")
    writer = ArchiveWriter(
        store,
        prefix,
        checkpoint_id=checkpoint_id,
        participant_kind=kind,
        instance=instance,
        target_shard_bytes=target,
    )
    write = writer.write_raw
    for i, payload in enumerate(data):
        write(KIND, rids[i], 0, keys[i], payload, i)
    writer.commit(extra={"benchmark": "shard_throughput"})
    return time.perf_counter() - start


def ceiling_table(data: list[bytes], rids: list[str], keys: list[str]) -> pa.Table:
    n = len(data)
    return pa.Table.from_arrays(
        [
            pa.array([KIND] * n, pa.string()),
            pa.array(rids, pa.string()),
            pa.array([0] * n, pa.int64()),
            pa.array(keys, pa.string()),
            pa.array([1] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([None] * n, pa.string()),
            pa.array(data, pa.binary()),
        ],
        schema=SHARD_SCHEMA,
    )


def write_ceiling(store: ObjectStore, key: str, table: pa.Table) -> float:
    start = time.perf_counter()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", compression_level=1)
    store.put(key, sink.getvalue().to_pybytes())
    return time.perf_counter() - start


def write_naive(
    store: ObjectStore, prefix: str, data: list[bytes], rids: list[str], keys: list[str]
) -> float:
    """One object per record: s3fs concurrent batch upload on S3, one ``put`` each elsewhere."""
    names = [f"{prefix}/{rids[i]}/{keys[i]}.json" for i in range(len(data))]
    fs = getattr(store, "fs", None)
    start = time.perf_counter()
    if type(store).__name__ == "S3Store" and fs is not None:
        root = f"{store.bucket}/{store.prefix}".rstrip("/")  # type: ignore[attr-defined]
        fs.pipe({f"{root}/{name}": payload for name, payload in zip(names, data, strict=True)})
    else:
        for name, payload in zip(names, data, strict=True):
            store.put(name, payload)
    return time.perf_counter() - start


def remove_prefix(store: ObjectStore, prefix: str) -> None:
    fs = getattr(store, "fs", None)
    if type(store).__name__ == "S3Store" and fs is not None:
        root = f"{store.bucket}/{store.prefix}".rstrip("/")  # type: ignore[attr-defined]
        fs.rm(f"{root}/{prefix}", recursive=True)
        return
    for info in store.list(prefix + "/"):
        store.delete(info.key)


def rss_child(args: argparse.Namespace) -> None:
    """Stream ``--stream-gib`` GiB through one writer; print peak RSS (MiB) as JSON."""
    store = open_store(args.store, **storage_options(args.store, args.endpoint_url))
    pool = list(payloads(4096, args.record_bytes, seed=7))
    baseline = peak_rss_mb()
    total = int(args.stream_gib * (1 << 30))
    prefix = args.rss_prefix
    writer = ArchiveWriter(
        store, prefix, checkpoint_id=prefix.split("/")[1], participant_kind="agent", instance="rss",
        target_shard_bytes=int(args.target_shard_mb * (1 << 20)),
    )  # fmt: skip
    written = 0
    i = 0
    start = time.perf_counter()
    while written < total:
        payload = pool[i % len(pool)]
        writer.write_raw(KIND, f"rollout-{i // 10:08d}", 0, f"{i % 10:08d}", payload, i)
        written += len(payload)
        i += 1
    manifest = writer.commit()
    elapsed = time.perf_counter() - start
    print(
        json.dumps(
            {
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "baseline_rss_mb": round(baseline, 1),
                "records": i,
                "payload_bytes": written,
                "shards": len(manifest.shards),
                "seconds": round(elapsed, 2),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--store", required=True, help="store URL: path, file://, memory://, s3://bucket/prefix"
    )
    parser.add_argument("--endpoint-url", default=None, help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--record-bytes", type=int, default=2048)
    parser.add_argument("--target-shard-mb", type=float, default=64.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--naive-records", type=int, default=20_000, help="records for part 2")
    parser.add_argument("--stream-gib", type=float, default=1.0)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rss-prefix", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(args)
        return

    store = open_store(args.store, **storage_options(args.store, args.endpoint_url))
    target = int(args.target_shard_mb * (1 << 20))
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    checkpoint = f"bench-{run_id}"
    log(f"generating {args.records} payloads of {args.record_bytes} B")
    data = list(payloads(args.records, args.record_bytes))
    rids, keys = ids_for(args.records)
    payload_mb = sum(len(d) for d in data) / 1e6
    result: dict[str, Any] = {
        "store": store.url,
        "records": args.records,
        "record_bytes": args.record_bytes,
        "target_shard_mb": args.target_shard_mb,
        "runs": args.runs,
        "machine": machine_info(),
        "checkpoint_id": checkpoint,
    }

    # 1. writer vs ceiling, interleaved so drift on a shared host hits both alike
    writer_s: list[float] = []
    ceiling_s: list[float] = []  # build the table + write it
    write_only_s: list[float] = []  # write a prebuilt table
    for run in range(args.runs):
        prefix = component_prefix(checkpoint, "agent", f"run{run}")
        writer_s.append(write_sdk(store, prefix, data, rids, keys, target))
        built = time.perf_counter()
        table = ceiling_table(data, rids, keys)
        build_s = time.perf_counter() - built
        write_only_s.append(write_ceiling(store, f"bench-ceiling/{run_id}-{run}.parquet", table))
        ceiling_s.append(build_s + write_only_s[-1])
        store.delete(f"bench-ceiling/{run_id}-{run}.parquet")
        del table
        w_mb, c_mb = payload_mb / writer_s[-1], payload_mb / ceiling_s[-1]
        log(
            f"run {run}: writer {w_mb:.0f} MB/s, ceiling {c_mb:.0f} MB/s "
            f"(write only {payload_mb / write_only_s[-1]:.0f} MB/s)"
        )
    ratios = [c / w for w, c in zip(writer_s, ceiling_s, strict=True)]
    write_only_ratios = [c / w for w, c in zip(writer_s, write_only_s, strict=True)]
    result.update(
        writer_mb_s=round(payload_mb / median(writer_s), 1),
        ceiling_mb_s=round(payload_mb / median(ceiling_s), 1),
        ratio_to_ceiling=round(median(ratios), 3),
        ratio_per_run=[round(r, 3) for r in ratios],
        ceiling_write_only_mb_s=round(payload_mb / median(write_only_s), 1),
        ratio_to_write_only=round(median(write_only_ratios), 3),
    )

    # 2. SDK vs one object per record
    result.update(naive_s=None, sdk_s=None, speedup_vs_naive=None, objects_created=None, shards=None)
    if not args.skip_naive:
        n = args.naive_records
        data, rids, keys = data[:n], rids[:n], keys[:n]
        if len(data) < n:
            data = list(payloads(n, args.record_bytes))
            rids, keys = ids_for(n)
        prefix = component_prefix(checkpoint, "agent", "vs-naive")
        sdk_s = write_sdk(store, prefix, data, rids, keys, target)
        objects = store.list(prefix + "/")
        shards = sum(1 for o in objects if "/shards/" in o.key)
        naive_prefix = f"bench-naive/{run_id}"
        log(f"naive: writing {n} objects")
        naive_s = write_naive(store, naive_prefix, data, rids, keys)
        remove_prefix(store, naive_prefix)
        result.update(
            naive_records=n,
            naive_s=round(naive_s, 3),
            sdk_s=round(sdk_s, 3),
            speedup_vs_naive=round(naive_s / sdk_s, 1),
            objects_created=len(objects),
            shards=shards,
        )
        log(f"naive {naive_s:.2f} s vs SDK {sdk_s:.2f} s ({len(objects)} objects)")

    # 3. peak RSS while streaming, in a fresh child process
    result.update(peak_rss_mb=None, rss_bound_mb=None, rss=None)
    if not args.skip_rss:
        rss_prefix = component_prefix(checkpoint, "agent", "rss")
        cmd = [
            sys.executable, __file__, "--rss-child", "--store", args.store, "--rss-prefix", rss_prefix,
            "--record-bytes", str(args.record_bytes), "--target-shard-mb", str(args.target_shard_mb),
            "--stream-gib", str(args.stream_gib),
        ]  # fmt: skip
        if args.endpoint_url:
            cmd += ["--endpoint-url", args.endpoint_url]
        log(f"streaming {args.stream_gib} GiB in a child process")
        child = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise SystemExit(f"RSS child failed: {child.stderr}")
        rss = json.loads(child.stdout.strip().splitlines()[-1])
        remove_prefix(store, rss_prefix)
        result.update(
            peak_rss_mb=rss["peak_rss_mb"],
            rss_bound_mb=round(4 * target / (1 << 20) + 150, 1),
            rss=rss,
        )

    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
