"""A moto S3 server that records every request: ``python _moto_trace.py PORT TRACE_FILE``.

Each request appends one JSON line ``{"t": start (epoch s), "d": seconds, "m": method,
"p": path, "s": status}``; :func:`summarize` turns the lines of one time window (a checkpoint's
pause) into counts per operation, the time S3 was busy (the union of the request intervals) and
the summed request time (their ratio is the average concurrency). ``demo_scale.py --s3-trace``
uses it to show where the moto S3 pause goes.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _traced(app: Wsgi, out: Path) -> Wsgi:
    lock = threading.Lock()
    sink = out.open("a", buffering=1)

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        started = time.time()
        status: list[str] = []

        def capture(code: str, headers: Any, *rest: Any) -> Any:
            status.append(code.split()[0])
            return start_response(code, headers, *rest)

        body = b"".join(app(environ, capture))  # moto answers in memory: collect, then time it
        line = {
            "t": started,
            "d": time.time() - started,
            "m": environ["REQUEST_METHOD"],
            "p": environ.get("PATH_INFO", ""),
            "s": int(status[0]) if status else 0,
        }
        with lock:
            sink.write(json.dumps(line) + "\n")
        return [body]

    return wrapped


_HEX = re.compile(r"[0-9a-f]{12,}")
_CKPT = re.compile(r"ckpt-[0-9T]+-[0-9a-f]+")


def _kind(path: str) -> str:
    """A request's object, with ids replaced: ``PUT .../components/agent/agent-0/shards/*``."""
    parts = path.strip("/").split("/")[3:]  # drop bucket/bench/<run>
    text = "/".join(parts)
    text = _CKPT.sub("CID", text)
    text = re.sub(r"parts/w\d+", "parts/W", text)  # a worker group's parts
    return _HEX.sub("H", text)


def summarize(lines: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """Requests that started inside ``[start, end]``: counts, busy time, summed time."""
    inside = sorted((r for r in lines if start <= r["t"] <= end), key=lambda r: r["t"])
    busy, cursor = 0.0, start
    for r in inside:
        lo, hi = max(r["t"], cursor), r["t"] + r["d"]
        if hi > lo:
            busy += hi - lo
            cursor = hi
    ops = Counter(f"{r['m']} {_kind(r['p'])}" for r in inside)
    return {
        "requests": len(inside),
        "s3_busy_ms": busy * 1000,
        "s3_summed_ms": sum(r["d"] for r in inside) * 1000,
        "by_method": dict(Counter(r["m"] for r in inside)),
        "top": ops.most_common(12),
    }


def read(trace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]


def main() -> None:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    port, trace = int(sys.argv[1]), Path(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, _traced(app, trace), threaded=True)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
