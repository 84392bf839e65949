"""Helpers shared by the benchmarks: realistic payloads, medians, peak RSS, store URLs."""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "machine_info",
    "median",
    "payloads",
    "peak_rss_mb",
    "storage_options",
    "timed",
]

_WORDS = [
    "the",
    "model",
    "calls",
    "tool",
    "search",
    "returns",
    "result",
    "agent",
    "thinks",
    "about",
    "next",
    "step",
    "file",
    "patch",
    "test",
    "passes",
    "fails",
    "retry",
    "observation",
    "action",
    "reward",
    "environment",
    "state",
    "token",
    "policy",
    "rollout",
    "assistant",
    "user",
    "system",
    "content",
    "function",
    "arguments",
    "query",
    "answer",
    "error",
    "trace",
    "line",
    "python",
    "import",
    "def",
    "class",
    "return",
    "value",
    "true",
    "false",
    "null",
    "list",
    "dict",
    "index",
    "offset",
    "length",
]


def payloads(count: int, size: int, seed: int = 0) -> Iterator[bytes]:
    """``count`` JSON payloads of about ``size`` bytes each, shaped like agent turns (messages,
    token ids, logprobs) so zstd compresses them ~3-4x, as real rollout state does."""
    rng = random.Random(seed)
    for i in range(count):
        doc: dict[str, Any] = {
            "turn": i,
            "role": "assistant",
            "content": "",
            "token_ids": [],
            "logprobs": [],
        }
        parts: list[str] = []
        ids: list[int] = []
        probs: list[float] = []
        # ~60% text with Zipf-like word frequencies, ~40% token ids and logprobs
        text_budget = size * 3 // 5
        length = 0
        while length < text_budget:
            word = _WORDS[min(int(rng.paretovariate(0.5)) - 1, len(_WORDS) - 1)]
            parts.append(word)
            length += len(word) + 1
        while len(ids) * 11 < size - text_budget:
            ids.append(rng.randrange(32_000))
            probs.append(round(-rng.expovariate(4.0), 2))
        doc["content"] = " ".join(parts)
        doc["token_ids"] = ids
        doc["logprobs"] = probs
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) > size:
            data = data[:size]
        elif len(data) < size:
            data = data + b" " * (size - len(data))
        yield data


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def timed(fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` took (perf_counter)."""
    import time

    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    Linux: ``VmHWM`` from /proc/self/status, because ``ru_maxrss`` survives ``execve`` and would
    report the parent's peak in a freshly spawned child. Elsewhere ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage / (1 << 20) if sys.platform == "darwin" else usage / 1024


def storage_options(url: str, endpoint_url: str | None) -> dict[str, Any]:
    """Options for ``open_store``: the endpoint only matters (and is only accepted) for S3."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith(("s3://", "s3a://")) and endpoint:
        return {"endpoint_url": endpoint}
    return {}


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "python": sys.version.split()[0]}
