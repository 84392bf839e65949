"""Typed store errors for what local disks and generic fsspec backends raise.

``OSError`` subclasses, ``NotImplementedError`` and ``ValueError`` (read-only fsspec backends
such as ``zip://``) and aiohttp's client errors (``http://``) become
:class:`~rollout_checkpoint.errors.StoreError` codes naming the store URL and key, so no
caller, and no CLI user, sees a raw traceback.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar, cast

from ..errors import (
    CheckpointError,
    StoreError,
    StorePermissionError,
    StoreUnreachableError,
    StoreUnsupportedError,
)

__all__ = ["is_connection_error", "map_store_error", "mapped_errors"]

F = TypeVar("F", bound=Callable[..., Any])

_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    # aiohttp's ClientConnectorError / ServerDisconnectedError..., botocore's EndpointConnectionError
    module, name = type(exc).__module__, type(exc).__name__
    return module.startswith(("aiohttp", "botocore")) and ("Connect" in name or "Disconnect" in name)


def map_store_error(exc: BaseException, url: str, key: str | None, op: str) -> BaseException:
    """The typed error for ``exc`` (or ``exc`` itself when it is not a storage failure)."""
    if isinstance(exc, CheckpointError) or not isinstance(exc, Exception):
        return exc
    where = f"{url}/{key}" if key else url
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if is_connection_error(exc):
        return StoreUnreachableError(f"{op} on {where}: store unreachable: {reason}", url=url, key=key)
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno in _PERMISSION_ERRNOS):
        return StorePermissionError(
            f"{op} on {where}: permission denied ({reason})", url=url, key=key, errno=exc.errno
        )
    if isinstance(exc, NotImplementedError):
        return StoreUnsupportedError(
            f"{op} on {where}: this backend does not support it ({reason})", url=url, key=key
        )
    if isinstance(exc, OSError | ValueError) or type(exc).__module__.startswith("aiohttp"):
        # ValueError: e.g. zipfile refusing a write to an archive opened for reading
        return StoreError(
            f"{op} on {where} failed: {type(exc).__name__}: {reason}",
            url=url,
            key=key,
            errno=getattr(exc, "errno", None),
        )
    return exc


class _MappedContext(AbstractContextManager[Any]):
    """Maps errors of entering and finishing a context (a streamed write), never the body's."""

    def __init__(self, inner: AbstractContextManager[Any], url: str, key: str | None, op: str) -> None:
        self._inner, self._url, self._key, self._op = inner, url, key, op

    def __enter__(self) -> Any:
        try:
            return self._inner.__enter__()
        except Exception as exc:
            mapped = map_store_error(exc, self._url, self._key, self._op)
            if mapped is exc:
                raise
            raise mapped from exc

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            return self._inner.__exit__(et, ev, tb)
        except Exception as exc:
            if exc is ev:
                raise
            mapped = map_store_error(exc, self._url, self._key, self._op)
            if mapped is exc:
                raise
            raise mapped from exc


def mapped_errors(method: F) -> F:
    """Decorate a store method: storage failures leave it as typed ``StoreError`` codes."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = args[0] if args and isinstance(args[0], str) else kwargs.get("key")
        op = method.__name__
        try:
            result = method(self, *args, **kwargs)
        except Exception as exc:
            mapped = map_store_error(exc, self.url, key, op)
            if mapped is exc:
                raise
            raise mapped from exc
        if op == "open_write":
            return _MappedContext(result, self.url, key, op)
        return result

    return cast(F, wrapper)
