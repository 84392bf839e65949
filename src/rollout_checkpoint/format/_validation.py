"""Typed errors for invalid values a caller passes to a model: a pydantic ``ValidationError``
becomes :class:`~rollout_checkpoint.errors.InvalidRecordError` (``invalid_record``) that keeps
pydantic's per-field detail (``[type=...]``) but no documentation links."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRecordError

__all__ = ["TypedModel", "describe_validation_error"]


def describe_validation_error(exc: ValidationError) -> str:
    """One clause per failed field: ``loc: message [type=..., input_value=...]``."""
    parts = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"]) or "value"
        parts.append(f"{loc}: {error['msg']} [type={error['type']}, input_value={error.get('input')!r}]")
    return "; ".join(parts)


class TypedModel(BaseModel):
    """A model whose constructor raises ``invalid_record`` instead of a bare ValidationError.

    Only construction from Python values changes; parsing stored bytes
    (``model_validate_json``) keeps raising ``ValidationError`` for the caller to wrap.
    """

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidRecordError(
                f"invalid {type(self).__name__}: {describe_validation_error(exc)}",
                model=type(self).__name__,
                errors=[
                    {"loc": [str(p) for p in e["loc"]], "type": e["type"], "msg": e["msg"]}
                    for e in exc.errors(include_url=False)
                ],
            ) from None
