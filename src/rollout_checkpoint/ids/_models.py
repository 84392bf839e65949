"""The pydantic side of identifiers: the ``Identifier`` field type, ``CheckpointId`` and the
execution identity of a rollout (:class:`ExecutionId`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidIdentifierError, InvalidValueError
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

    def __init__(self, /, **data: Any) -> None:
        """Constructed directly, a bad id or attempt is a typed ``CheckpointError`` (nested in
        another model it stays part of that model's ``ValidationError``)."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
            )
            fields = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            error = InvalidIdentifierError if fields == {"rollout_id"} else InvalidValueError
            raise error(f"not an execution id ({problems})", value=repr(data)[:200]) from None

    @property
    def capture_key(self) -> str:
        """``rollout_id`` for attempt 0, ``rollout_id-a<N>`` after (NeMo Gym's capture key)."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    def next_attempt(self) -> ExecutionId:
        return ExecutionId(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def __str__(self) -> str:
        return f"{self.rollout_id}#{self.attempt}"

    # The identity is (rollout_id, attempt): compared on those two fields only, and hashed on
    # the rollout id alone (equal ids have equal rollout ids; a string caches its hash, so no
    # tuple is built per hash: a set rarely holds two attempts of one rollout). pydantic's
    # generated ``__hash__`` / ``__eq__`` give the same equality (the model is frozen, with no
    # extra or private fields) at several times the cost, and a checkpoint hashes every live
    # execution (the commit's scope) inside its pause.
    def __hash__(self) -> int:
        return hash(self.rollout_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExecutionId):
            return self.rollout_id == other.rollout_id and self.attempt == other.attempt
        return NotImplemented


# Nested in another model (a request body's ``scope``), an ExecutionId is validated by pydantic
# itself, so its errors stay part of that model's ``ValidationError`` with their field paths;
# only a direct ``ExecutionId(...)`` call goes through the ``__init__`` above.
ExecutionId.__pydantic_custom_init__ = False
ExecutionId.model_rebuild(force=True)
