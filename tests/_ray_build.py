"""A build function for the Ray tests' hosts: a scripted participant (``RC_TEST_BLOCKED=1`` in
the host's settings parks every prepare: it is never ready)."""

from __future__ import annotations

import os

from fastapi import FastAPI

from _protocol_fakes import ScriptedParticipant
from rollout_checkpoint.server import ServedApp, WorkerContext


def build(context: WorkerContext) -> ServedApp:
    participant = ScriptedParticipant("agent", os.environ.get("RC_TEST_INSTANCE", "agent-0"))
    if os.environ.get("RC_TEST_BLOCKED") == "1":
        participant.set_blockers(["parked by the test"])
    return ServedApp(app=FastAPI(), participant=participant)
