"""Telemetry: OpenTelemetry spans and metrics, trace context across HTTP, structured log fields.

Built on ``opentelemetry-api`` only: the host chooses the SDK and its exporters. Without a
configured provider every span is the API's non-recording span and every instrument a no-op,
so the instrumented code pays a few attribute look-ups. One measurement (:mod:`._clock`) feeds a
span's start and end, the duration histogram and the coordinator's ``CheckpointOutcome``
timings. Names, attributes and metrics are listed in ``docs/observability.md``.

This package imports only :mod:`rollout_checkpoint.errors`; every other layer may import it.
"""

from __future__ import annotations

from ._clock import now_ns
from ._logging import log_fields
from ._metrics import instruments
from ._names import Attr, Metric, Span
from ._spans import Measured, bound, extracted, inject, operation, participant_operation, refusal_counted

__all__ = [
    "Attr",
    "Measured",
    "Metric",
    "Span",
    "bound",
    "extracted",
    "inject",
    "instruments",
    "log_fields",
    "now_ns",
    "operation",
    "participant_operation",
    "refusal_counted",
]
