"""The pydantic side of identifiers: the ``Identifier`` field type, ``CheckpointId`` and the
execution identity of a rollout (:class:`ExecutionId`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..errors import InvalidIdentifierError
from ._keys import validate_id

__all__ = ["CheckpointId", "ExecutionId", "Identifier"]


def _checked(value: str) -> str:
    try:
        return validate_id(value)
    except InvalidIdentifierError as exc:
        raise ValueError(exc.message) from None


Identifier = Annotated[str, AfterValidator(_checked)]
"""A string validated by :func:`validate_id` inside pydantic models."""

CheckpointId = Identifier


class ExecutionId(BaseModel):
    """One physical execution of a logical rollout: ``rollout_id`` plus ``attempt`` (0-based).

    Restore creates attempt N+1 and tombstones attempt N.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollout_id: Identifier
    attempt: int = Field(ge=0)

    @property
    def capture_key(self) -> str:
        """``rollout_id`` for attempt 0, ``rollout_id-a<N>`` after (NeMo Gym's capture key)."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    def next_attempt(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def __str__(self) -> str:
        return f"{self.rollout_id}#{self.attempt}"
