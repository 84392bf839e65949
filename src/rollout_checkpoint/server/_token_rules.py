"""What a control token may be: printable ASCII without spaces, at least
:data:`MIN_TOKEN_LENGTH` characters. A server refuses any other at start; a client refuses one it
could not even send (an HTTP header carries ASCII only), both with ``invalid_value``."""

from __future__ import annotations

from ..errors import InvalidValueError

__all__ = ["MIN_TOKEN_LENGTH", "check_sendable_token", "check_server_token"]

MIN_TOKEN_LENGTH = 16


def _printable_ascii(token: str) -> bool:
    return all(0x21 <= ord(c) <= 0x7E for c in token)


def check_sendable_token(token: object) -> str:
    """A token a client can send in an ``Authorization`` header (any length: the server decides)."""
    if not isinstance(token, str) or not token or not _printable_ascii(token):
        raise InvalidValueError(
            "the control token must be printable ASCII without spaces (it travels in an HTTP header)"
        )
    return token


def check_server_token(token: object) -> str:
    """A token a server accepts at start: sendable and at least :data:`MIN_TOKEN_LENGTH` long."""
    check_sendable_token(token)
    assert isinstance(token, str)
    if len(token) < MIN_TOKEN_LENGTH:
        raise InvalidValueError(
            f"the control token is {len(token)} characters; use at least {MIN_TOKEN_LENGTH} "
            "(for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token
