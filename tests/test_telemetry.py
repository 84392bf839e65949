"""Telemetry in one process: a checkpoint cycle is one trace with the documented spans, the
outcome's timings are the spans' durations, and the metrics equal the checkpoint's own counts."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from _http import served
from _protocol_fakes import ScriptedParticipant, ex
from _telemetry import telemetry, total
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.demo import DemoDeployment
from rollout_checkpoint.errors import CheckpointError, InvalidPhaseError
from rollout_checkpoint.format import ArchiveReader
from rollout_checkpoint.reader import load_checkpoint
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import RemoteParticipant, control_app
from rollout_checkpoint.telemetry import Attr, Metric, Span

KINDS = ("agent", "model", "resources")


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def _archive_totals(deployment: DemoDeployment, checkpoint_id: str) -> tuple[int, int]:
    """Records and bytes (shards, index, manifest) of the participants' components."""
    record = load_checkpoint(deployment.store, checkpoint_id).record
    records = size = 0
    for component in record.components:
        if component.role != "participant":
            continue
        reader = ArchiveReader.open(deployment.store, component.prefix)
        records += sum(reader.manifest.record_counts.values())
        size += sum(s.bytes for s in reader.manifest.shards) + reader.manifest.index.bytes
        size += reader.manifest_ref.bytes
    return records, size


def test_a_checkpoint_is_one_trace_whose_spans_are_the_outcome_timings(tmp_path: Path) -> None:
    otel = telemetry()
    deployment = DemoDeployment(str(tmp_path / "store"))
    try:
        deployment.populate(40)
        otel.spans.clear()
        with otel.delta() as points:
            outcome = deployment.checkpoint("ck-traced")
    finally:
        deployment.close()
    spans = otel.finished()
    (root,) = [s for s in spans if s.name == Span.coordinator("checkpoint")]
    assert root.parent is None
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert root.attributes is not None
    assert root.attributes[Attr.CHECKPOINT_ID] == "ck-traced"
    assert root.attributes[Attr.PUBLICATION] == "sync"
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:  # every span hangs from the root
        node = span
        while node.parent is not None:
            node = by_id[node.parent.span_id]
        assert node is root

    # one client span per participant and call, one participant-side span under each
    calls = Counter(
        (s.name, (s.attributes or {}).get(Attr.PARTICIPANT_KIND)) for s in spans if s.kind is SpanKind.CLIENT
    )
    for op in ("prepare", "commit", "resume"):
        for kind in KINDS:
            assert calls[(Span.call(op), kind)] == 1, calls
    for op in ("prepare", "commit", "resume"):
        sides = [s for s in spans if s.name == Span.participant(op)]
        assert sorted(str((s.attributes or {})[Attr.PARTICIPANT_KIND]) for s in sides) == sorted(KINDS), op
        for side in sides:  # a child of the coordinator's call span to the same participant
            assert side.parent is not None
            call = by_id[side.parent.span_id]
            assert call.kind is SpanKind.CLIENT and call.name == Span.call(op)
            assert (call.attributes or {})[Attr.PARTICIPANT_KIND] == (side.attributes or {})[
                Attr.PARTICIPANT_KIND
            ]
    for op in ("wait_ready", "export", "write"):  # once per participant, under its prepare or commit
        assert len([s for s in spans if s.name == Span.participant(op)]) == len(KINDS), op
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)

    # one measurement: the timings are the step spans' durations, the pause is the root's
    steps = {
        s.name.removeprefix(Span.COORDINATOR + "."): s for s in spans if s.name.startswith(Span.COORDINATOR)
    }
    assert set(outcome.timings) == {
        "prepare",
        "commit",
        "validate",
        "registry",
        "aggregate",
        "tokens",
        "publish",
        "latest",
        "resume",
    }
    for step, seconds in outcome.timings.items():
        assert seconds == _seconds(steps[step])
    assert outcome.pause_seconds == _seconds(root)
    assert outcome.publish_seconds == (steps["publish"].end_time - steps["commit"].start_time) / 1e9  # type: ignore[operator]

    # the metrics equal the checkpoint's own counts
    records, size = _archive_totals(deployment, "ck-traced")
    written = {Attr.DIRECTION: "write"}
    assert total(points, Metric.RECORDS, written) == records > 0
    assert total(points, Metric.IO, written) == size
    for kind in KINDS:
        assert total(points, Metric.RECORDS, {**written, Attr.PARTICIPANT_KIND: kind}) > 0
    assert total(points, Metric.PAUSE_DURATION, {Attr.PUBLICATION: "sync"}) == 1
    assert total(points, Metric.PUBLICATION_LAG, {Attr.PUBLICATION: "sync"}) == 1
    assert (
        total(
            points, Metric.OPERATION_DURATION, {Attr.OPERATION: "coordinator.checkpoint", Attr.OUTCOME: "ok"}
        )
        == 1
    )
    assert total(points, Metric.REFUSALS) == 0


def test_a_restore_counts_rollouts_by_disposition_and_bytes_read(tmp_path: Path) -> None:
    otel = telemetry()
    url = str(tmp_path / "store")
    first = DemoDeployment(url)
    try:
        first.populate(30)
        first.checkpoint("ck-source")
    finally:
        first.close()
    second = DemoDeployment(url)
    try:
        otel.spans.clear()
        with otel.delta() as points:
            restored = second.restore("ck-source")
    finally:
        second.close()
    for disposition, count in restored.plan.counts().items():
        assert total(points, Metric.ROLLOUTS, {Attr.ROLLOUT_DISPOSITION: disposition}) == count
    _, size = _archive_totals(second, "ck-source")
    assert total(points, Metric.IO, {Attr.DIRECTION: "read"}) == size
    names = {s.name for s in otel.finished()}
    assert {
        Span.coordinator("restore"),
        Span.call("restore"),
        Span.participant("restore"),
        Span.participant("read"),
        Span.participant("install"),
    } <= names


def test_an_asynchronous_cycle_is_one_trace_and_records_its_publication_lag(tmp_path: Path) -> None:
    otel = telemetry()
    deployment = DemoDeployment(str(tmp_path / "store"))
    try:
        deployment.populate(20)
        otel.spans.clear()
        with otel.delta() as points:
            outcome = deployment.checkpoint("ck-async", publication="async")
    finally:
        deployment.close()
    spans = otel.finished()
    (root,) = [s for s in spans if s.name == Span.coordinator("checkpoint")]
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    names = {s.name for s in spans}
    assert {Span.coordinator("collect"), Span.call("collect"), Span.participant("collect")} <= names
    assert Span.participant("write") in names  # the upload thread's write joins the trace
    assert outcome.pause_seconds == _seconds(root)
    assert set(outcome.timings) >= {"prepare", "commit", "registry_snapshot", "resume", "collect", "publish"}
    assert total(points, Metric.PUBLICATION_LAG, {Attr.PUBLICATION: "async"}) == 1
    records, size = _archive_totals(deployment, "ck-async")
    assert total(points, Metric.RECORDS, {Attr.DIRECTION: "write"}) == records
    assert total(points, Metric.IO, {Attr.DIRECTION: "write"}) == size


def test_a_refusal_is_counted_once_by_code_and_ends_its_spans_in_error(tmp_path: Path) -> None:
    otel = telemetry()
    participant = ScriptedParticipant("agent", "agent-0")
    participant.track(ex("r-1"))
    coordinator = Coordinator(str(tmp_path / "store"), [participant], LiveExecutionRegistry())
    otel.spans.clear()
    with otel.delta() as points, pytest.raises(InvalidPhaseError):
        participant.commit("ck-never-prepared", coordinator.store, time.time() + 30)
    assert total(points, Metric.REFUSALS, {Attr.ERROR_CODE: "invalid_phase"}) == 1
    (span,) = [s for s in otel.finished() if s.name == Span.participant("commit")]
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[Attr.ERROR_CODE] == "invalid_phase"
    assert (
        total(points, Metric.OPERATION_DURATION, {Attr.OUTCOME: "error", Attr.ERROR_CODE: "invalid_phase"})
        == 1
    )


def test_log_lines_carry_the_checkpoint_and_the_trace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    otel = telemetry()

    def pointer_fails(step: str) -> None:
        if step == "latest":
            raise RuntimeError("pointer store unreachable")

    participant = ScriptedParticipant("agent", "agent-0")
    coordinator = Coordinator(
        str(tmp_path / "store"), [participant], LiveExecutionRegistry(), fault_hook=pointer_fails
    )
    otel.spans.clear()
    with caplog.at_level(logging.WARNING, logger="rollout_checkpoint"):
        outcome = coordinator.checkpoint("ck-logged")
    assert not outcome.clean
    (line,) = [r for r in caplog.records if "latest pointer was not moved" in r.getMessage()]
    (root,) = [s for s in otel.finished() if s.name == Span.coordinator("checkpoint")]
    assert line.checkpoint_id == "ck-logged"  # type: ignore[attr-defined]
    assert line.trace_id == format(root.context.trace_id, "032x")  # type: ignore[attr-defined]


def test_no_token_reaches_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = "tok-never-logged-7f3a"
    participant = ScriptedParticipant("agent", "agent-0")
    participant.track(ex("r-1"))
    with caplog.at_level(logging.DEBUG), served(control_app(participant, token=token)) as url:
        remote = RemoteParticipant(url, token=token)
        coordinator = Coordinator(str(tmp_path / "store"), [remote], LiveExecutionRegistry())
        coordinator.checkpoint("ck-remote")
        with pytest.raises(CheckpointError):
            RemoteParticipant(url, token="wrong-token-9c1d").status()
    assert caplog.records
    assert token not in caplog.text and "wrong-token-9c1d" not in caplog.text
