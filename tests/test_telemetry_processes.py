"""One checkpoint over real server processes is one trace: the coordinator's client spans
carry W3C trace context over HTTP, and each server's participant spans continue it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from opentelemetry.trace import SpanKind

from _telemetry import telemetry
from conftest import _free_port, _wait_listening
from rollout_checkpoint.coordinator import Coordinator
from rollout_checkpoint.registry import LiveExecutionRegistry
from rollout_checkpoint.server import RemoteParticipant
from rollout_checkpoint.store import LocalStore
from rollout_checkpoint.telemetry import Attr, Span

TOKEN = "tok-traced-secret"
HERE = Path(__file__).parent
SERVERS = (("agent", "agent-0"), ("model", "model-0"), ("resources", "resources-0"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_one_checkpoint_over_server_processes_is_one_trace(tmp_path: Path) -> None:
    otel = telemetry()
    store_dir = tmp_path / "store"
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for kind, instance in SERVERS:
            port = _free_port()
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "_traced_server.py"),
                        kind,
                        instance,
                        str(port),
                        str(store_dir),
                    ],
                    env={**os.environ, "ROLLOUT_CHECKPOINT_TOKEN": TOKEN},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
            _wait_listening(port, procs[-1])
            urls[kind] = f"http://127.0.0.1:{port}"
        remotes = [RemoteParticipant(url, token=TOKEN) for url in urls.values()]
        coordinator = Coordinator(LocalStore(store_dir), remotes, LiveExecutionRegistry())
        otel.spans.clear()
        outcome = coordinator.checkpoint("ck-one-trace", deadline_s=60)
        assert outcome.clean
        served = {kind: httpx.get(f"{url}/spans", timeout=10).json() for kind, url in urls.items()}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
    local = otel.finished()
    (root,) = [s for s in local if s.name == Span.coordinator("checkpoint")]
    trace_id = format(root.context.trace_id, "032x")
    assert {format(s.context.trace_id, "032x") for s in local} == {trace_id}
    client = {format(s.context.span_id, "016x"): s for s in local if s.kind is SpanKind.CLIENT}
    for kind, every in served.items():
        spans = [s for s in every if s["scope"] == "rollout_checkpoint"]  # FastAPI traces requests too
        assert spans, f"{kind}: no spans"
        assert {s["trace_id"] for s in spans} == {trace_id}, [
            (s["name"], s["parent_id"]) for s in spans if s["trace_id"] != trace_id
        ]
        by_name = {s["name"]: s for s in spans}
        for op in ("prepare", "commit", "resume"):
            span = by_name[Span.participant(op)]
            assert span["attributes"][Attr.PARTICIPANT_KIND] == kind
            assert span["attributes"][Attr.CHECKPOINT_ID] == "ck-one-trace"
            assert span["remote_parent"], (kind, op)
            assert (
                span["attributes"][Attr.PHASE]
                == {"prepare": "prepared", "commit": "committed", "resume": "idle"}[op]
            )
            parent = client[span["parent_id"]]  # the coordinator's call span of this participant
            assert parent.name == Span.call(op)
            assert (parent.attributes or {})[Attr.PARTICIPANT_KIND] == kind
        assert {Span.participant("wait_ready"), Span.participant("export"), Span.participant("write")} <= set(
            by_name
        )
