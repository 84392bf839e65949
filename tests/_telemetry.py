"""The OpenTelemetry SDK's in-memory exporters, installed once per test process.

A process has one global tracer and one global meter provider (the API refuses to replace
them), so every telemetry test shares these: spans are cleared per test, metrics are read as
differences between two collections.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

Key = tuple[str, tuple[tuple[str, Any], ...]]


class Telemetry:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        trace.set_tracer_provider(tracer_provider)
        self.reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.reader]))

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self) -> dict[Key, float]:
        """Every metric point now: counters' sums, histograms' counts (cumulative)."""
        out: dict[Key, float] = defaultdict(float)
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        out[(metric.name, tuple(sorted(point.attributes.items())))] += value
        return out

    @contextmanager
    def delta(self) -> Iterator[dict[Key, float]]:
        """Metric points added inside the block."""
        before = self.points()
        out: dict[Key, float] = {}
        yield out
        for key, value in self.points().items():
            if value != before.get(key, 0):
                out[key] = value - before.get(key, 0)


def total(points: Mapping[Key, float], name: str, wanted: Mapping[str, Any] | None = None) -> float:
    """Sum of the points of metric ``name`` whose attributes include ``wanted``."""
    wanted = wanted or {}
    return sum(
        value
        for (metric, attrs), value in points.items()
        if metric == name and all(dict(attrs).get(k) == v for k, v in wanted.items())
    )


@cache
def telemetry() -> Telemetry:
    return Telemetry()
