"""What makes a Gym model server the policy participant, shared by the scripted model and Gym's
``openai_model`` (:mod:`.model`, :mod:`.openai_model`).

A :class:`PolicyServing` owns one :class:`~rollout_checkpoint.participants.PolicyModelParticipant`
(its token store under ``ROLLOUT_CHECKPOINT_STORE``), mounts the control routes
(``ROLLOUT_CHECKPOINT_TOKEN``) and the finish route, and delivers a call whose reply is already
computed: admitted under its execution and call id (while a checkpoint runs it waits here, so
prepare never waits for the model's latency), its tokens staged durably, then joined to the
rollout's lineage. It also keeps the test gate (``hold_file``) and the call log.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointError
from ...ids import ExecutionId
from ...participants import PolicyModelParticipant
from ...server import AsyncAdmission, install_error_handlers, install_participant, run_blocking
from ...store import open_store
from ...tokens import BatchingTokenSink, ObjectStoreTokenStore
from .identity import execution_from_capture_key
from .resources import start_paused_if_asked

__all__ = ["FINISH_PATH", "HOLD_SECONDS", "WAIT_SECONDS", "PolicyServing", "TokenIds"]

FINISH_PATH = "/rollout_checkpoint/finish"
WAIT_SECONDS = 300.0
HOLD_SECONDS = 300.0
"""How long a held call waits for its gate to open at most (then it goes on)."""


@dataclass(frozen=True)
class TokenIds:
    """The token ids of one call (empty lists where the backend returned none)."""

    prompt: Sequence[int] = ()
    generation: Sequence[int] = ()
    log_probs: Sequence[float] = ()


class PolicyServing:
    """See the module docstring. Build it in the server's ``setup_webserver``."""

    def __init__(
        self,
        app: Any,
        name: str,
        *,
        policy_version: str,
        call_log: str | None = None,
        hold_file: str | None = None,
        hold_from_call: int = 2,
        hold_log: str | None = None,
    ) -> None:
        store_url = os.environ.get("ROLLOUT_CHECKPOINT_STORE")
        if not store_url:
            raise ValueError(
                f"model server {name}: set ROLLOUT_CHECKPOINT_STORE (its token store lives there)"
            )
        token = os.environ.get("ROLLOUT_CHECKPOINT_TOKEN")
        if not token:
            raise ValueError(f"model server {name}: set ROLLOUT_CHECKPOINT_TOKEN (the control routes' token)")
        # group commit: replies released together at a resume share one durable shard write
        tokens = BatchingTokenSink(ObjectStoreTokenStore(open_store(store_url)))
        self.participant = PolicyModelParticipant(tokens, name, policy_version=policy_version)
        start_paused_if_asked(self.participant)
        self.admission = AsyncAdmission(self.participant)
        self.call_log = call_log
        self.hold_file = hold_file
        self.hold_from_call = hold_from_call
        self.hold_log = hold_log
        install_error_handlers(app)
        install_participant(app, self.participant, token=token, store=store_url)
        app.state.rollout_checkpoint_participant = self.participant

    async def deliver(self, execution: ExecutionId, call_id: str, tokens: TokenIds) -> None:
        """Admit the computed call, stage its tokens durably, join it to the lineage (raises
        :class:`~rollout_checkpoint.errors.CheckpointError`: refused, nothing recorded)."""
        participant = self.participant
        call = await self.admission.call(lambda: participant.admit(execution, call_id), timeout=WAIT_SECONDS)
        try:
            generation = list(tokens.generation)
            log_probs = list(tokens.log_probs) if len(tokens.log_probs) == len(generation) else []
            await run_blocking(
                lambda: call.stage(
                    prompt_token_ids=list(tokens.prompt),
                    generation_token_ids=generation,
                    generation_log_probs=log_probs or [0.0] * len(generation),
                )
            )
        finally:
            call.close()
        if self.call_log:
            line = {
                "rollout_id": execution.rollout_id,
                "attempt": execution.attempt,
                "call_id": call_id,
                "pid": os.getpid(),
                "generation_tokens": len(generation),
            }
            with open(self.call_log, "a") as log:
                log.write(json.dumps(line) + "\n")

    async def held(self, key: str, call_id: str) -> None:
        """Wait while the gate (``hold_file``) is closed for this call, :data:`HOLD_SECONDS` at
        most: a call whose id ends in a number at or above ``hold_from_call`` waits before it
        generates (nothing durable yet, so a checkpoint does not wait for it)."""
        gate = self.hold_file
        number = call_id.rsplit("-", 1)[-1]
        if gate is None or not number.isdigit() or int(number) < self.hold_from_call:
            return
        if not os.path.exists(gate):
            return
        if self.hold_log:
            try:
                execution = execution_from_capture_key(key)
            except CheckpointError:
                pass  # refused later, as any call without a rollout identity
            else:
                line = {"rollout_id": execution.rollout_id, "attempt": execution.attempt, "call_id": call_id}
                with open(self.hold_log, "a") as log:
                    log.write(json.dumps(line) + "\n")
        loop = asyncio.get_running_loop()
        end = loop.time() + HOLD_SECONDS
        while os.path.exists(gate) and loop.time() < end:
            await asyncio.sleep(0.02)

    async def finish(self, key: str | None) -> dict[str, bool]:
        """The rollout is done with the model (its lineage is not exported again)."""
        if key is None:
            return {"finished": False}
        try:
            await run_blocking(self.participant.finish, execution_from_capture_key(key))
        except CheckpointError:
            return {"finished": False}
        return {"finished": True}
