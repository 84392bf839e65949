"""One clock for spans and timings: monotonic, anchored to the epoch once per process.

OpenTelemetry timestamps are nanoseconds since the epoch; ``time.time_ns`` can step backwards
when the wall clock is adjusted, which would give negative durations. ``perf_counter_ns`` plus a
fixed offset never does, and a span's duration equals the seconds the coordinator reports.
"""

from __future__ import annotations

import time

__all__ = ["now_ns"]

_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


def now_ns() -> int:
    """Nanoseconds since the epoch, monotonic within this process."""
    return time.perf_counter_ns() + _OFFSET_NS
