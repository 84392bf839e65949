"""The SDK against the simplest peer: NeMo Gym's JSONL participant store (``_jsonl_peer.py``).

    python benchmarks/peer_store.py [--sizes 10000 100000] [--runs 3] [--moto] [--json]
    python benchmarks/peer_store.py --quick --json          # seconds; what the smoke test runs

Both sides write the same records: one per rollout, shaped like an agent boundary
(``AgentBoundaryRecord`` fields) whose ``output_items`` hold about 2 KiB of JSON agent state, built
from the same Python dicts by the same generator. Generating a batch of dicts is not timed on
either side; everything after it is (encoding, hashing, compressing, writing, fsync, commit).

Each phase of each side runs in a fresh process: ``write`` (write + commit; peak RSS, which
includes the interpreter and the imports; imports are not timed on either side, so the SDK's
one-time import of pydantic and its manifest models, which its commit needs, happens between
the writes and the commit and is reported on its own as ``commit_import_s``), ``lookup`` (one
record, cold: open the archive / the manifest and fetch the middle record; five fresh processes
per run, their median, because one lookup of tens of milliseconds is at the mercy of the disk's
write-back of the files just written), ``read_all`` (every record into Python dicts). Figures are
medians over ``--runs``; the sides take turns run by run, and which goes first alternates.
``disk`` is the bytes the side left in its folder / prefix.

With ``--moto`` the SDK also runs against a moto S3 server on 127.0.0.1 (started here). The
baseline has no object store, so on S3 the SDK's figures are compared with the local-disk baseline
of the same run (stated in the output as ``baseline_store: local``).

The top-level keys ``write_ratio`` (sdk/baseline time), ``rss_ratio``, ``disk_ratio``,
``lookup_speedup`` (baseline/sdk time), ``read_all_ratio`` (sdk/baseline time),
``sdk_peak_rss_mb`` and ``baseline_peak_rss_mb`` are those of the largest size on local disk;
``write_cpu_ratio`` compares the CPU seconds of the writes (all threads, generation subtracted),
which a loaded machine changes less than the wall-clock ``write_ratio``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import _WORDS, machine_info, median, peak_rss_mb

PARTICIPANT = "agent-0"
KIND = "agent_boundary"
CHECKPOINT = "bench"
BATCH_ROWS = 1024
LOOKUPS = 5
"""Fresh lookup processes per run (their median is the run's lookup)."""
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

# -- the records ------------------------------------------------------------------------------


class _Corpus:
    """Text, token ids and logprobs that record states are cut from (cheap per record, and
    each record different: offsets spread over a corpus far larger than a Parquet page)."""

    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        words = [_WORDS[min(int(rng.paretovariate(0.5)) - 1, len(_WORDS) - 1)] for _ in range(400_000)]
        self.text = " ".join(words)
        self.ids = [rng.randrange(32_000) for _ in range(200_000)]
        self.probs = [round(-rng.expovariate(4.0), 2) for _ in range(200_000)]


def record(corpus: _Corpus, i: int) -> dict[str, Any]:
    """Record ``i``: an agent boundary with about 2 KiB of JSON state in ``output_items``."""
    text, ids, probs = corpus.text, corpus.ids, corpus.probs
    a = (i * 7919) % (len(text) - 2000)
    b = (i * 104_729) % (len(text) - 2000)
    c = (i * 613) % (len(ids) - 100)
    boundary = i % 17 + 1
    return {
        "schema_version": 1,
        "rollout_id": f"rollout-{i:07d}",
        "attempt": 0,
        "boundary_index": boundary,
        "turn_index": boundary,
        "last_model_call_id": f"call-{i:07d}-{boundary}",
        "resource_revisions": {"env": boundary},
        "usage": {"input_tokens": 900 + i % 300, "output_tokens": 40 + i % 60},
        "output_items": [
            {"type": "message", "role": "user", "content": text[a : a + 560]},
            {"type": "message", "role": "assistant", "content": text[b : b + 760]},
            {"type": "function_call", "name": "search", "arguments": text[a + 600 : a + 680]},
            {"type": "generation", "token_ids": ids[c : c + 36], "logprobs": probs[c : c + 36]},
        ],
        "agent_state": None,
    }


def batches(n: int, rows: int = BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    corpus = _Corpus()
    for start in range(0, n, rows):
        yield [record(corpus, i) for i in range(start, min(n, start + rows))]


def member_key(rec: dict[str, Any]) -> str:
    return f"{rec['boundary_index']:08d}"


# -- the SDK side -----------------------------------------------------------------------------
def _sdk_store(target: str, endpoint: str | None) -> Any:
    from rollout_checkpoint.store import open_store

    return open_store(target, **({"endpoint_url": endpoint} if endpoint else {}))


def _sdk_prefix() -> str:
    return f"checkpoints/{CHECKPOINT}/components/agent/{PARTICIPANT}"


def sdk_write(target: str, endpoint: str | None, n: int) -> float:
    from rollout_checkpoint.archive import ArchiveWriter

    store = _sdk_store(target, endpoint)
    writer = ArchiveWriter(
        store, _sdk_prefix(), checkpoint_id=CHECKPOINT, participant_kind="agent", instance=PARTICIPANT
    )
    elapsed = 0.0
    for batch in batches(n):
        start = time.perf_counter()
        writer.write_records(KIND, batch, key=member_key, revision="boundary_index", refs=_refs)
        elapsed += time.perf_counter() - start
    # What the commit imports on first use (pydantic and the manifest models), once per process
    # and outside the timer like every import on both sides; after the writes, so that its
    # resident memory does not add to the writing's peak. Its time is reported on its own.
    start = time.perf_counter()
    from rollout_checkpoint.archive import ComponentManifest  # noqa: F401

    _SDK_IMPORTS["commit_import_s"] = time.perf_counter() - start
    start = time.perf_counter()
    writer.commit()
    return elapsed + time.perf_counter() - start


_SDK_IMPORTS: dict[str, float] = {}


def _refs(rec: dict[str, Any]) -> dict[str, Any]:
    """What ``AgentBoundaryRecord.index_refs()`` returns for this record."""
    return {"model_call": rec["last_model_call_id"], "resources": rec["resource_revisions"]}


def _sdk_reader_imports() -> None:
    """What a read imports on first use (the Arrow compute kernels); imports are not timed on
    either side (the baseline's ``json`` is imported before its timer too)."""
    import pyarrow._compute  # noqa: F401


def sdk_lookup(target: str, endpoint: str | None, n: int) -> tuple[float, dict[str, Any]]:
    from rollout_checkpoint.format import ArchiveReader

    _sdk_reader_imports()

    store = _sdk_store(target, endpoint)  # imports the backend; sends no request
    start = time.perf_counter()
    reader = ArchiveReader.open(store, _sdk_prefix())
    i = n // 2
    rec = reader.get(KIND, f"rollout-{i:07d}", 0, f"{i % 17 + 1:08d}")
    elapsed = time.perf_counter() - start
    return elapsed, rec.model_dump(mode="json")


def sdk_read_all(target: str, endpoint: str | None) -> tuple[float, int]:
    from rollout_checkpoint.format import ArchiveReader

    _sdk_reader_imports()

    store = _sdk_store(target, endpoint)  # imports the backend; sends no request
    start = time.perf_counter()
    reader = ArchiveReader.open(store, _sdk_prefix())
    count = 0
    for _ in reader.iter_dicts(KIND):
        count += 1
    return time.perf_counter() - start, count


def sdk_disk(target: str, endpoint: str | None) -> int:
    return sum(info.size for info in _sdk_store(target, endpoint).list(""))


# -- the baseline side ------------------------------------------------------------------------
def baseline_write(target: str, n: int) -> float:
    from _jsonl_peer import JsonlParticipantWriter, commit_manifest

    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    writer = JsonlParticipantWriter(root, PARTICIPANT)
    elapsed = 0.0
    for batch in batches(n):
        start = time.perf_counter()
        for rec in batch:
            writer.write(rec)
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    entry = writer.finish()
    commit_manifest(root, {PARTICIPANT: entry})
    return elapsed + time.perf_counter() - start


def baseline_lookup(target: str, n: int) -> tuple[float, dict[str, Any]]:
    from _jsonl_peer import lookup

    start = time.perf_counter()
    rec = lookup(Path(target), PARTICIPANT, f"rollout-{n // 2:07d}")
    elapsed = time.perf_counter() - start
    if rec is None:
        raise SystemExit("baseline lookup found nothing")
    return elapsed, rec


def baseline_read_all(target: str) -> tuple[float, int]:
    from _jsonl_peer import read_all

    start = time.perf_counter()
    records = read_all(Path(target), PARTICIPANT)
    return time.perf_counter() - start, len(records)


def _disk_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# -- one phase in this (fresh) process --------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    side, phase, target, n, endpoint = args.side, args.phase, args.target, args.records, args.endpoint_url
    out: dict[str, Any] = {}
    if phase == "write":
        profiler = None
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu = time.process_time()
        seconds = sdk_write(target, endpoint, n) if side == "sdk" else baseline_write(target, n)
        cpu = time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        peak = peak_rss_mb()
        # CPU of every thread of the process while writing, less the CPU of generating the same
        # records again (untimed on both sides): what the write cost in CPU, whatever the load
        gen = time.process_time()
        for _ in batches(n):
            pass
        cpu -= time.process_time() - gen
        out = {
            "seconds": seconds,
            "cpu_s": cpu,
            "peak_rss_mb": peak,
            "disk_bytes": sdk_disk(target, endpoint) if side == "sdk" else _disk_bytes(target),
            **_SDK_IMPORTS,
        }
    elif phase == "lookup":
        seconds, rec = sdk_lookup(target, endpoint, n) if side == "sdk" else baseline_lookup(target, n)
        expected = record(_Corpus(), n // 2)
        if rec["output_items"] != expected["output_items"] or rec["rollout_id"] != expected["rollout_id"]:
            raise SystemExit(f"{side} lookup returned the wrong record")
        out = {"seconds": seconds}
    else:
        seconds, count = sdk_read_all(target, endpoint) if side == "sdk" else baseline_read_all(target)
        if count != n:
            raise SystemExit(f"{side} read {count} records, wrote {n}")
        out = {"seconds": seconds}
    print(json.dumps(out))


def run_child(side: str, phase: str, target: str, n: int, endpoint: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--side", side, "--phase", phase, "--target", target]
    cmd += ["--records", str(n)]
    if endpoint:
        cmd += ["--endpoint-url", endpoint]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{side} {phase} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# -- moto -------------------------------------------------------------------------------------
def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def make_bucket(endpoint: str, name: str) -> None:
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=name)


# -- the driver -------------------------------------------------------------------------------
def _one_run(
    side: str, n: int, run: int, target_for: Any, endpoint: str | None, cleanup: Any
) -> dict[str, Any]:
    target = target_for(side, n, run)
    w = run_child(side, "write", target, n, endpoint)
    w["lookup_s"] = median(run_child(side, "lookup", target, n, endpoint)["seconds"] for _ in range(LOOKUPS))
    w["read_all_s"] = run_child(side, "read_all", target, n, endpoint)["seconds"]
    cleanup(target)
    return w


def measure(
    sides: list[str], n: int, runs: int, target_for: Any, endpoint: str | None, cleanup: Any
) -> dict[str, dict[str, Any]]:
    """Medians of ``runs`` runs of each side. The sides take turns run by run, and which one goes
    first alternates, so a change in the host's load hits both sides alike."""
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for run in range(runs):
        order = sides if run % 2 == 0 else sides[::-1]
        for side in order:
            results[side].append(_one_run(side, n, run, target_for, endpoint, cleanup))
    return {side: _summary(rows) for side, rows in results.items()}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    col = {name: [row[name] for row in rows] for name in rows[0]}
    untimed = (
        {"commit_import_s": round(median(col["commit_import_s"]), 4)} if "commit_import_s" in col else {}
    )
    return {
        "write_s": round(median(col["seconds"]), 4),
        "write_cpu_s": round(median(col["cpu_s"]), 4),
        "peak_rss_mb": round(median(col["peak_rss_mb"]), 1),
        "disk_mb": round(median(col["disk_bytes"]) / 1e6, 2),
        "lookup_s": round(median(col["lookup_s"]), 4),
        "read_all_s": round(median(col["read_all_s"]), 4),
        **untimed,
        "runs": {
            "write_s": col["seconds"],
            "write_cpu_s": col["cpu_s"],
            "lookup_s": col["lookup_s"],
            "read_all_s": col["read_all_s"],
            "peak_rss_mb": col["peak_rss_mb"],
        },
    }


def ratios(sdk: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    return {
        "write_ratio": round(sdk["write_s"] / base["write_s"], 3),
        "write_cpu_ratio": round(sdk["write_cpu_s"] / base["write_cpu_s"], 3),
        "rss_ratio": round(sdk["peak_rss_mb"] / base["peak_rss_mb"], 3),
        "rss_gap_mb": round(sdk["peak_rss_mb"] - base["peak_rss_mb"], 1),
        "disk_ratio": round(sdk["disk_mb"] / base["disk_mb"], 3),
        "lookup_speedup": round(base["lookup_s"] / sdk["lookup_s"], 1),
        "read_all_ratio": round(sdk["read_all_s"] / base["read_all_s"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--moto", action="store_true", help="also run the SDK on a loopback moto S3 server")
    parser.add_argument("--quick", action="store_true", help="500 records, one run (a smoke run)")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a new temp folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["sdk", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["write", "lookup", "read_all"], help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile", default=None, help="(with --child) write a cProfile file here")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.sizes, args.runs = [500], 1
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="peer-store-"))
    scratch.mkdir(parents=True, exist_ok=True)

    def local_target(side: str, n: int, run: int) -> str:
        return str(scratch / f"{side}-{n}-{run}")

    def local_cleanup(target: str) -> None:
        shutil.rmtree(target, ignore_errors=True)

    result: dict[str, Any] = {
        "machine": machine_info(),
        "runs": args.runs,
        "sizes": args.sizes,
        "state_bytes": len(json.dumps(record(_Corpus(), 0)["output_items"])),
        "local": {},
    }
    for n in args.sizes:
        print(f"local disk, {n} records", file=sys.stderr, flush=True)
        both = measure(["baseline", "sdk"], n, args.runs, local_target, None, local_cleanup)
        base, sdk = both["baseline"], both["sdk"]
        result["local"][str(n)] = {"baseline": base, "sdk": sdk, **ratios(sdk, base)}
    if args.moto:
        moto, endpoint = start_moto()
        try:
            make_bucket(endpoint, "bench")
            s3_store = _s3_cleanup_store(endpoint)
            result["moto"] = {"baseline_store": "local"}
            for n in args.sizes:
                print(f"moto S3, {n} records", file=sys.stderr, flush=True)

                def s3_target(side: str, size: int, run: int) -> str:
                    return f"s3://bench/{side}-{size}-{run}"

                def s3_cleanup(target: str) -> None:
                    s3_store.rm(target, recursive=True)

                sdk = measure(["sdk"], n, args.runs, s3_target, endpoint, s3_cleanup)["sdk"]
                base = result["local"][str(n)]["baseline"]
                result["moto"][str(n)] = {"sdk": sdk, **ratios(sdk, base)}
        finally:
            moto.terminate()
            moto.wait()
    largest = result["local"][str(max(args.sizes))]
    for name in ("write_ratio", "write_cpu_ratio", "rss_ratio", "disk_ratio"):
        result[name] = largest[name]
    for name in ("lookup_speedup", "read_all_ratio"):
        result[name] = largest[name]
    result["sdk_peak_rss_mb"] = largest["sdk"]["peak_rss_mb"]
    result["baseline_peak_rss_mb"] = largest["baseline"]["peak_rss_mb"]
    if not args.dir:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key in ("write_ratio", "rss_ratio", "disk_ratio", "lookup_speedup", "read_all_ratio"):
            print(f"{key}: {result[key]}")


def _s3_cleanup_store(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint})


if __name__ == "__main__":
    main()
