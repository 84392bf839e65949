"""Identifier and object-key checks, without pydantic (the write path imports only these)."""

from __future__ import annotations

import re

from ..errors import InvalidIdentifierError

__all__ = ["ID_MAX_LENGTH", "ID_PATTERN", "validate_id", "validate_key"]

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ID_MAX_LENGTH = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_id(value: str, what: str = "identifier") -> str:
    """Return ``value`` if it is safe as one object-key segment, else raise ``InvalidIdentifierError``.

    Allowed: ``^[A-Za-z0-9][A-Za-z0-9._-]*$``, at most 128 characters, and never ``..``
    anywhere (so no segment can climb out of its prefix on a filesystem-backed store).
    """
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdentifierError(f"{what} must not be empty", value=value)
    if len(value) > ID_MAX_LENGTH:
        raise InvalidIdentifierError(
            f"{what} is {len(value)} characters long; at most {ID_MAX_LENGTH} are allowed",
            value=value[:ID_MAX_LENGTH] + "...",
        )
    if ".." in value or not ID_PATTERN.fullmatch(value):  # fullmatch: "$" alone admits "a\n"
        raise InvalidIdentifierError(
            f"{what} {value!r} is not allowed: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, and no '..'",
            value=value,
        )
    return value


def validate_key(key: str) -> str:
    """Validate a relative object key: ``/``-separated segments, no empty, ``.``/``..`` or control chars."""
    if not isinstance(key, str) or not key:
        raise InvalidIdentifierError("object key must be a non-empty string", value=key)
    if key.startswith("/") or key.endswith("/"):
        raise InvalidIdentifierError(f"object key {key!r} must not start or end with '/'", value=key)
    if _CONTROL.search(key) or "\\" in key:
        raise InvalidIdentifierError(f"object key {key!r} contains control characters or '\\'", value=key)
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidIdentifierError(f"object key {key!r} has an empty, '.' or '..' segment", value=key)
    return key
