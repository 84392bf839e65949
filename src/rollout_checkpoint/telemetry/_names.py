"""Every span name, attribute key and metric name the SDK emits (``docs/observability.md``).

Attribute keys live under one namespace, ``rollout_checkpoint.``; metric names follow
OpenTelemetry's semantic-convention rules: dotted lower case, units in the unit field (UCUM:
``s``, ``By``, ``{record}``), never in the name, and no ``_total`` suffix.
"""

from __future__ import annotations

from typing import Final

__all__ = ["Attr", "Metric", "Span"]

_NS: Final = "rollout_checkpoint"


class Span:
    """Span names: ``coordinator.*`` on the coordinator, ``call.*`` (client) for each participant
    call it makes, ``participant.*`` on the participant's side."""

    COORDINATOR: Final = f"{_NS}.coordinator"
    CALL: Final = f"{_NS}.call"
    PARTICIPANT: Final = f"{_NS}.participant"

    @staticmethod
    def coordinator(step: str) -> str:
        return f"{Span.COORDINATOR}.{step}"

    @staticmethod
    def call(op: str) -> str:
        return f"{Span.CALL}.{op}"

    @staticmethod
    def participant(op: str) -> str:
        return f"{Span.PARTICIPANT}.{op}"


class Attr:
    """Attribute keys (span and metric attributes; metrics take only the low-cardinality ones)."""

    CHECKPOINT_ID: Final = f"{_NS}.checkpoint.id"
    SOURCE_CHECKPOINT_ID: Final = f"{_NS}.checkpoint.source_id"
    PUBLICATION: Final = f"{_NS}.publication"
    PARTICIPANT_KIND: Final = f"{_NS}.participant.kind"
    PARTICIPANT_INSTANCE: Final = f"{_NS}.participant.instance"
    OPERATION: Final = f"{_NS}.operation"
    OUTCOME: Final = f"{_NS}.outcome"
    PHASE: Final = f"{_NS}.phase"
    STAGE: Final = f"{_NS}.stage"
    RECORDS: Final = f"{_NS}.records"
    BYTES: Final = f"{_NS}.bytes"
    EXECUTIONS: Final = f"{_NS}.executions"
    ROLLOUT_COUNT: Final = f"{_NS}.rollout.count"
    CALLS: Final = f"{_NS}.generation.calls"
    SEQUENCE: Final = f"{_NS}.sequence"
    ERROR_CODE: Final = f"{_NS}.error.code"
    DIRECTION: Final = f"{_NS}.io.direction"
    CUT_DISPOSITION: Final = f"{_NS}.cut.disposition"
    ROLLOUT_DISPOSITION: Final = f"{_NS}.rollout.disposition"


class Metric:
    """Metric names (instruments are in :mod:`._metrics`)."""

    OPERATION_DURATION: Final = f"{_NS}.operation.duration"
    RECORDS: Final = f"{_NS}.records"
    IO: Final = f"{_NS}.io"
    REFUSALS: Final = f"{_NS}.refusals"
    GENERATION_CUTS: Final = f"{_NS}.generation_cuts"
    ROLLOUTS: Final = f"{_NS}.rollouts"
    PAUSE_DURATION: Final = f"{_NS}.pause.duration"
    PUBLICATION_LAG: Final = f"{_NS}.publication.lag"
