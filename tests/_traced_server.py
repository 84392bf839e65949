"""A scripted participant behind the control routes, as a real process, tracing into the
OpenTelemetry SDK's in-memory exporter; ``GET /spans`` returns what it recorded.

Usage: python _traced_server.py KIND INSTANCE PORT STORE_DIR (token from ROLLOUT_CHECKPOINT_TOKEN).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from _protocol_fakes import ScriptedParticipant, ex
from _telemetry import telemetry
from rollout_checkpoint.server import control_app
from rollout_checkpoint.store import LocalStore


def main() -> None:
    kind, instance, port, store_dir = sys.argv[1:5]
    otel = telemetry()
    participant = ScriptedParticipant(kind, instance)  # type: ignore[arg-type]
    participant.track(ex("r-traced"))
    app = control_app(participant, token=os.environ["ROLLOUT_CHECKPOINT_TOKEN"], store=LocalStore(store_dir))

    @app.get("/spans")
    def spans() -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "scope": s.instrumentation_scope.name if s.instrumentation_scope else None,
                "kind": s.kind.name,
                "trace_id": format(s.context.trace_id, "032x"),
                "span_id": format(s.context.span_id, "016x"),
                "parent_id": format(s.parent.span_id, "016x") if s.parent else None,
                "remote_parent": bool(s.parent and s.parent.is_remote),
                "attributes": dict(s.attributes or {}),
            }
            for s in otel.finished()
        ]

    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
