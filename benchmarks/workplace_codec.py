"""Bytes per ``workplace_assistant`` session in a checkpoint: the Parquet codec against JSON.

Each of ``--sessions`` sessions is Gym's ``get_tools()`` state after a few of its own tool calls
(a sent email, a created event, a new customer, a plot; different per session). Both encodings
are committed by a real resources participant into an archive on a local store, and the
component's bytes on the store are summed:

* ``json``: the DataFrames as JSON (``to_dict(orient="split")`` per frame, what a hand-written
  codec does), stored as every JSON codec is (base64 in the JSON ``resource_snapshot`` payload);
* ``parquet``: :class:`WorkplaceAssistantCodec` through the Gym integration's participant (one
  Parquet file per DataFrame, in the binary ``resource_snapshot`` payload).

``--json`` prints one object: per encoding the state bytes per session (median), the archive
bytes per session, and the median encode time per session (``--repeats`` runs), plus the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine_info, median

TOOLKITS = ["email", "calendar", "analytics", "project_management", "customer_relationship_manager"]


class _JsonFrames:
    name = "workplace-json-baseline"

    def encode(self, state: Any) -> bytes:
        doc = {
            tool: {attr: frame.to_dict(orient="split") for attr, frame in vars(obj).items()}
            for tool, obj in state["containers"].items()
        }
        return json.dumps(doc, sort_keys=True, default=str).encode()

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError("the baseline is only measured, never restored")


def _session(n: int) -> Any:
    from resources_servers.workplace_assistant.utils import get_tools

    env = get_tools(TOOLKITS)
    f = env["functions"]
    f["email_send_email"](recipient=f"user{n}@atlas.com", subject=f"Report {n}", body="Numbers attached " * n)
    f["calendar_create_event"](
        event_name=f"Review {n}",
        participant_email=f"user{n}@atlas.com",
        event_start="2023-12-04 10:00:00",
        duration="30",
    )
    f["customer_relationship_manager_add_customer"](
        customer_name=f"Customer {n}", assigned_to_email="a@atlas.com"
    )
    f["analytics_create_plot"](
        time_min="2023-10-22", time_max="2023-10-25", value_to_plot="total_visits", plot_type="bar"
    )
    return env


def _store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _commit(participant: Any, states: list[Any], store: Path) -> int:
    from rollout_checkpoint import ExecutionId

    for n, state in enumerate(states):
        participant.open_session(ExecutionId(rollout_id=f"r{n}", attempt=0), f"s{n}", state)
    deadline = time.time() + 120
    assert participant.prepare("ck-bench", deadline).ready
    participant.commit("ck-bench", str(store), deadline)
    participant.resume("ck-bench", deadline)
    return _store_bytes(store)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from resources_servers.workplace_assistant.app import WorkbenchResourcesServer

    from rollout_checkpoint import ResourcesParticipant
    from rollout_checkpoint.integrations.nemo_gym import WORKPLACE_ASSISTANT, WorkplaceAssistantCodec
    from rollout_checkpoint.integrations.nemo_gym.resources import GymResourcesParticipant

    states = [_session(n) for n in range(args.sessions)]
    codecs: dict[str, Any] = {"json": _JsonFrames(), "parquet": WorkplaceAssistantCodec()}
    result: dict[str, Any] = {"sessions": args.sessions, "machine": machine_info()}
    for name, codec in codecs.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for state in states:
                codec.encode(state)
            times.append((time.perf_counter() - start) / len(states))
        sizes = [len(codec.encode(s)) for s in states]
        with tempfile.TemporaryDirectory() as tmp:
            if name == "json":
                participant: Any = ResourcesParticipant("wa", mode="exported", codec=codec)
            else:
                server = WorkbenchResourcesServer.model_construct(session_id_to_tool_env={})
                participant = GymResourcesParticipant(server, WORKPLACE_ASSISTANT, "wa")
            archive = _commit(participant, states, Path(tmp))
        result[name] = {
            "state_bytes_per_session": median(sizes),
            "archive_bytes_per_session": archive / args.sessions,
            "encode_ms_per_session": median(times) * 1000,
        }
    for key in ("state_bytes_per_session", "archive_bytes_per_session", "encode_ms_per_session"):
        result[f"{key}_json_over_parquet"] = result["json"][key] / result["parquet"][key]
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name in codecs:
            r = result[name]
            state, stored = r["state_bytes_per_session"] / 1e3, r["archive_bytes_per_session"] / 1e3
            print(f"{name:8s} state {state:8.1f} KB  archive {stored:8.1f} KB/session  ", end="")
            print(f"encode {r['encode_ms_per_session']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
