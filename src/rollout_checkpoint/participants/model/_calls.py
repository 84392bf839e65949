"""What one policy call is while it runs: the result it returns, the ticket the participant tracks
for it, the external :class:`ModelCall` handle, and argument validation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ...errors import CheckpointError, InvalidArgumentError, InvalidIdentifierError
from ...format.records import GenerationCut, ModelCallLineageRecord
from ...ids import ID_MAX_LENGTH, ExecutionId, validate_id
from ...tokens import TokenEntry, TokenPutReceipt
from ..generation import Generation
from ._chain import Chain, PendingCut
from ._cuts import CutAcknowledgement, CutInventory

__all__ = ["CallOwner", "CutRound", "GenerationResult", "ModelCall", "Ticket"]

_CUT_SUFFIX = re.compile(r"\.cut[0-9]+$")
_CALL_ID_MAX = ID_MAX_LENGTH - 24  # room for the ``.cut<count>`` suffix of prefix entries


@dataclass(frozen=True)
class GenerationResult:
    """What :meth:`PolicyModelParticipant.generate` returns once the response is delivered."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str
    lineage: ModelCallLineageRecord
    continued_from: GenerationCut | None  # the restored cut this call continued from
    prefix_token_count: int  # tokens taken from that prefix instead of generated


@dataclass
class Ticket:
    execution: ExecutionId
    call_id: str
    policy_version: str
    cuttable: bool
    chain: Chain
    prompt: tuple[int, ...]
    pending: PendingCut | None
    state: Literal["queued", "running", "staging"] = "queued"
    generation: Generation | None = None
    completion: TokenPutReceipt | None = None
    completed_entry: TokenEntry | None = None  # what ``completion`` pins (a later round acks it)
    frozen_as: str | None = None  # the checkpoint that froze it unstarted (never_started)

    @property
    def key(self) -> tuple[ExecutionId, str]:
        return (self.execution, self.call_id)


@dataclass
class CutRound:
    """One checkpoint's frozen inventory and the acknowledgements gathered for it."""

    inventory: CutInventory
    deadline: float
    tickets: dict[str, Ticket]
    acks: dict[str, CutAcknowledgement] = field(default_factory=dict)
    errors: list[CheckpointError] = field(default_factory=list)
    validated: bool = False


class CallOwner(Protocol):
    """What a :class:`ModelCall` needs of the participant that admitted it (the policy model
    participant; a protocol, so this module does not import the participant)."""

    def _stage(
        self,
        call: ModelCall,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None,
    ) -> ModelCallLineageRecord: ...

    def _close_call(self, call: ModelCall) -> None: ...


class ModelCall:
    """An admitted call whose generation runs outside this package; :meth:`stage` its tokens."""

    def __init__(
        self, participant: CallOwner, execution: ExecutionId, call_id: str, policy_version: str
    ) -> None:
        self.participant = participant
        self.execution = execution
        self.call_id = call_id
        self.policy_version = policy_version
        self.lineage: ModelCallLineageRecord | None = None
        self._closed = False

    def stage(
        self,
        *,
        prompt_token_ids: Sequence[int],
        generation_token_ids: Sequence[int],
        generation_log_probs: Sequence[float],
        mask: Sequence[int] | None = None,
    ) -> ModelCallLineageRecord:
        """Store the tokens durably through the sink, then record lineage and the receipt."""
        return self.participant._stage(
            self, prompt_token_ids, generation_token_ids, generation_log_probs, mask
        )

    def close(self) -> None:
        """End the call; an unstaged call is dropped (the agent re-issues it from its boundary)."""
        if not self._closed:
            self._closed = True
            self.participant._close_call(self)


def token_entry(
    execution: ExecutionId,
    call_id: str,
    prompt: Sequence[int],
    tokens: Sequence[int],
    log_probs: Sequence[float],
) -> TokenEntry:
    return TokenEntry(
        rollout_id=execution.rollout_id,
        attempt=execution.attempt,
        call_id=call_id,
        prompt_token_ids=list(prompt),
        generation_token_ids=list(tokens),
        generation_log_probs=list(log_probs),
        mask=[1] * len(tokens),
    )


def check_policy_version(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 256
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in value)
    ):
        raise InvalidArgumentError(
            f"policy_version must be 1-256 printable characters, got {value!r}", value=repr(value)[:80]
        )
    return value


def check_call_id(call_id: str) -> None:
    validate_id(call_id, "call_id")
    if len(call_id) > _CALL_ID_MAX or _CUT_SUFFIX.search(call_id):
        raise InvalidIdentifierError(
            f"call_id {call_id!r} is reserved or too long: at most {_CALL_ID_MAX} characters, not ending "
            "in '.cut<digits>' (the token-store name of a cut prefix)",
            value=call_id,
        )


def check_token_ids(values: Sequence[int], what: str) -> tuple[int, ...]:
    try:
        out = tuple(values)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a sequence of token ids") from None
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in out):
        raise InvalidArgumentError(f"{what} must be non-negative integers")
    return out
