"""The SDK's instruments, on the global OpenTelemetry meter.

Created once, from the API's proxy meter: until the host sets a meter provider every record is a
no-op; after it, the same instruments forward to it. Attributes are the low-cardinality ones
only (kinds, operations, outcomes, codes, dispositions), never an id.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from opentelemetry import metrics

from ._names import Metric

__all__ = ["Instruments", "instruments"]

SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Bucket advice for the duration histograms (the SDK's default buckets are meant for ms)."""


@dataclass(frozen=True)
class Instruments:
    operation_duration: metrics.Histogram
    records: metrics.Counter
    io: metrics.Counter
    refusals: metrics.Counter
    generation_cuts: metrics.Counter
    rollouts: metrics.Counter
    pause_duration: metrics.Histogram
    publication_lag: metrics.Histogram


_lock = threading.Lock()
_instruments: Instruments | None = None


def instruments() -> Instruments:
    """The instruments (created once, on first use by any thread, then shared)."""
    global _instruments
    made = _instruments
    if made is None:
        with _lock:
            if _instruments is None:
                _instruments = _create()
            made = _instruments
    return made


def _create() -> Instruments:
    meter = metrics.get_meter("rollout_checkpoint")

    def seconds(name: str, description: str) -> metrics.Histogram:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=SECONDS_BUCKETS
        )

    return Instruments(
        operation_duration=seconds(Metric.OPERATION_DURATION, "Duration of one checkpoint operation."),
        records=meter.create_counter(
            Metric.RECORDS, unit="{record}", description="Records written to or read from archives."
        ),
        io=meter.create_counter(Metric.IO, unit="By", description="Archive bytes written or read."),
        refusals=meter.create_counter(
            Metric.REFUSALS, unit="{refusal}", description="Operations refused, by error code."
        ),
        generation_cuts=meter.create_counter(
            Metric.GENERATION_CUTS, unit="{cut}", description="Frozen generation calls, by disposition."
        ),
        rollouts=meter.create_counter(
            Metric.ROLLOUTS, unit="{rollout}", description="Rollouts of restored checkpoints, by disposition."
        ),
        pause_duration=seconds(Metric.PAUSE_DURATION, "Freeze of dispatch to the last resume."),
        publication_lag=seconds(Metric.PUBLICATION_LAG, "Freeze of dispatch to the checkpoint published."),
    )
