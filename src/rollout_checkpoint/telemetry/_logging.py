"""Structured log fields: what every log line of a checkpoint operation carries as ``extra``.

Fields are the checkpoint id, the participant, the error code, and the trace and span ids when a
recording span is active, so a log line joins its trace. Never a token, cookie or payload: the
callers pass ids and codes only.
"""

from __future__ import annotations

from opentelemetry import trace

__all__ = ["log_fields"]


def log_fields(
    checkpoint_id: str | None = None, participant: str | None = None, error_code: str | None = None
) -> dict[str, str]:
    """``extra=`` for :mod:`logging`: the given fields, plus ``trace_id`` / ``span_id`` (hex)."""
    fields: dict[str, str] = {}
    if checkpoint_id is not None:
        fields["checkpoint_id"] = checkpoint_id
    if participant is not None:
        fields["participant"] = participant
    if error_code is not None:
        fields["error_code"] = error_code
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        fields["trace_id"] = format(context.trace_id, "032x")
        fields["span_id"] = format(context.span_id, "016x")
    return fields
