"""Spans on the ``opentelemetry-api`` tracer, measured on :mod:`._clock`, and trace context
carried across threads (:func:`bound`) and HTTP (:func:`inject` / :func:`extracted`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from ..errors import CheckpointError
from ._clock import now_ns
from ._metrics import instruments
from ._names import Attr, Span

__all__ = [
    "Measured",
    "bound",
    "extracted",
    "inject",
    "operation",
    "participant_operation",
    "refusal_counted",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_tracer = trace.get_tracer("rollout_checkpoint")
_PREFIX = "rollout_checkpoint."
_COUNTED = "_rollout_checkpoint_refusal_counted"


class Measured:
    """One operation's measurement: start and end on the telemetry clock, and its span (a
    non-recording one without a tracer provider). ``seconds`` is what the span lasted."""

    __slots__ = ("end_ns", "name", "span", "start_ns")

    def __init__(self, name: str, start_ns: int, span: trace.Span) -> None:
        self.name = name
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.span = span

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def recording(self) -> bool:
        return self.span.is_recording()

    def set(self, key: str, value: AttributeValue) -> None:
        """Set a span attribute (skipped when nothing records)."""
        if self.span.is_recording():
            self.span.set_attribute(key, value)


def refusal_counted(exc: BaseException) -> bool:
    """Mark ``exc`` as counted in ``rollout_checkpoint.refusals``; ``True`` if it already was
    (an error crossing several nested operations is one refusal, counted where it arose)."""
    if getattr(exc, _COUNTED, False):
        return True
    try:
        setattr(exc, _COUNTED, True)
    except AttributeError:  # pragma: no cover - an exception type without a __dict__
        return True
    return False


def _error_code(exc: BaseException) -> str:
    return exc.code if isinstance(exc, CheckpointError) else type(exc).__name__


@contextmanager
def operation(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
    metric: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Measured]:
    """A span named ``name`` around the block, current inside it, plus one
    ``rollout_checkpoint.operation.duration`` record (operation, outcome, error code and the
    ``metric`` attributes). A failure sets the span's status and ``error.code``; a
    :class:`~rollout_checkpoint.errors.CheckpointError` is counted once as a refusal."""
    start = now_ns()
    span = _tracer.start_span(name, kind=kind, attributes=attributes, start_time=start)
    measured = Measured(name, start, span)
    recorded: dict[str, AttributeValue] = {Attr.OPERATION: name.removeprefix(_PREFIX)}
    if metric:
        recorded.update(metric)
    try:
        with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield measured
        recorded[Attr.OUTCOME] = "ok"
    except BaseException as exc:
        code = _error_code(exc)
        recorded[Attr.OUTCOME] = "error"
        recorded[Attr.ERROR_CODE] = code
        if span.is_recording():
            span.set_attribute(Attr.ERROR_CODE, code)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{code}: {exc}"[:500]))
        if isinstance(exc, CheckpointError) and not refusal_counted(exc):
            instruments().refusals.add(1, {Attr.ERROR_CODE: code, Attr.OPERATION: recorded[Attr.OPERATION]})
        raise
    finally:
        measured.end_ns = now_ns()
        span.end(end_time=measured.end_ns)
        instruments().operation_duration.record(measured.seconds, recorded)


def bound(fn: Callable[..., T], context: otel_context.Context | None = None) -> Callable[..., T]:
    """``fn`` run under the trace context current now (or ``context``), for another thread (a
    pool's worker, a cutter or upload thread), so its spans join this trace."""
    captured = otel_context.get_current() if context is None else context

    def run(*args: Any, **kwargs: Any) -> T:
        token = otel_context.attach(captured)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return run


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add the current trace context to ``headers`` (W3C ``traceparent`` / ``tracestate`` with
    the default propagators); nothing when no span records."""
    propagate.inject(headers)
    return headers


@contextmanager
def extracted(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the trace context a request carries current for the block (the server side of
    :func:`inject`): the participant's spans become children of the caller's."""
    token = otel_context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        otel_context.detach(token)


def participant_operation(op: str) -> Callable[[F], F]:
    """Decorate a participant's control operation: a ``rollout_checkpoint.participant.<op>``
    span around it, with the participant's kind and instance (``self.kind`` / ``self.instance``),
    the checkpoint id when the first argument is one, and the phase its reply names."""
    name = Span.participant(op)

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            kind = str(self.kind)
            attributes: dict[str, AttributeValue] = {
                Attr.PARTICIPANT_KIND: kind,
                Attr.PARTICIPANT_INSTANCE: str(self.instance),
            }
            if args and isinstance(args[0], str):
                attributes[Attr.CHECKPOINT_ID] = args[0]
            with operation(name, attributes=attributes, metric={Attr.PARTICIPANT_KIND: kind}) as measured:
                result = method(self, *args, **kwargs)
                phase = getattr(result, "phase", None)  # the phase a reply leaves the participant in
                if phase is not None and measured.recording:
                    measured.set(Attr.PHASE, str(getattr(phase, "value", phase)))
                return result

        return cast(F, run)

    return decorate
