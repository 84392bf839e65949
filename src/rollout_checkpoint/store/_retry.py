"""Bounded, jittered retries for transient object-store failures (tenacity).

Only errors that say "try again" are retried: timeouts, dropped connections, 5xx, throttling
(``SlowDown``) and S3's ``409 ConditionalRequestConflict`` (a concurrent conditional write held
the key). Everything else (403, 404, 412, bad requests) is an answer, not a hiccup, and surfaces
at once so callers can map it (a 412 on a create-only put must reach ``_resolve_existing``
untouched). When the attempts run out, :class:`TransientStoreError` is raised from the last error.

This is the *only* retry layer for the calls S3Store makes itself: botocore's own retries are
turned off there, so a retried conditional put is always visible to the code that resolves it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import tenacity

from ..errors import StoreError, StoreUnreachableError, TransientStoreError
from ._errors import is_connection_error

__all__ = ["ENV_ATTEMPTS", "ENV_MAX_WAIT", "RetryPolicy", "call_with_retry", "is_transient"]

T = TypeVar("T")

ENV_ATTEMPTS = "ROLLOUT_CHECKPOINT_STORE_RETRY_ATTEMPTS"
ENV_MAX_WAIT = "ROLLOUT_CHECKPOINT_STORE_RETRY_MAX_WAIT"

# S3 error codes that mean "the service is busy or hiccuped, the same request may succeed".
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "ConditionalRequestConflict",  # 409: a concurrent conditional write; retry the put
        "OperationAborted",  # 409: a conflicting operation was in progress
        "BadGateway",
        "GatewayTimeout",
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry: exponential backoff from ``initial_wait`` up to
    ``max_wait`` seconds plus up to ``jitter`` seconds of random jitter, ``attempts`` tries in all.

    Defaults are small on purpose: a checkpoint must fail fast enough to be retried by the
    cycle above it, and tests stay quick.
    """

    attempts: int = 5
    initial_wait: float = 0.05
    max_wait: float = 2.0
    jitter: float = 0.05

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.initial_wait < 0 or self.max_wait < 0 or self.jitter < 0:
            raise ValueError("RetryPolicy waits must not be negative")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """Defaults, overridden by ``ROLLOUT_CHECKPOINT_STORE_RETRY_ATTEMPTS`` / ``..._MAX_WAIT``."""
        kwargs: dict[str, Any] = {}
        try:
            if os.environ.get(ENV_ATTEMPTS):
                kwargs["attempts"] = int(os.environ[ENV_ATTEMPTS])
            if os.environ.get(ENV_MAX_WAIT):
                kwargs["max_wait"] = float(os.environ[ENV_MAX_WAIT])
            return cls(**kwargs)
        except ValueError as exc:
            raise StoreError(f"invalid retry setting in the environment: {exc}") from exc


def _client_error_info(exc: BaseException) -> tuple[str, int] | None:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    try:
        return code, int(status)
    except (TypeError, ValueError):
        return code, 0


def _transient_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [
        TimeoutError,  # also socket.timeout and asyncio.TimeoutError
        ConnectionError,  # refused / reset / aborted / broken pipe
        TransientStoreError,
    ]
    try:
        from botocore import exceptions as bexc

        types += [
            bexc.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError...
            bexc.HTTPClientError,
            bexc.ResponseStreamingError,
            bexc.IncompleteReadError,
        ]
    except ImportError:  # pragma: no cover - botocore ships with s3fs
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError]
    except ImportError:  # pragma: no cover
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


_TRANSIENT_TYPES: tuple[type[BaseException], ...] | None = None


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying with the same request (see module docstring)."""
    global _TRANSIENT_TYPES
    info = _client_error_info(exc)
    if info is not None:
        code, status = info
        if code in TRANSIENT_CODES:
            return True
        return status >= 500 or status == 429
    if _TRANSIENT_TYPES is None:
        _TRANSIENT_TYPES = _transient_types()
    return isinstance(exc, _TRANSIENT_TYPES)


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    what: str,
    *,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Run ``fn`` until it succeeds, raises a permanent error (re-raised as is), or ``policy``
    runs out (then :class:`TransientStoreError` from the last error). ``what`` names the
    operation in the error message."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        # exponential backoff plus random jitter (works on tenacity 8 and 9 alike)
        wait=tenacity.wait_exponential(multiplier=policy.initial_wait, max=policy.max_wait)
        + tenacity.wait_random(0, policy.jitter),
        retry=tenacity.retry_if_exception(is_transient),
        reraise=True,
        sleep=sleep if sleep is not None else tenacity.nap.sleep,
    )
    try:
        return retrying(fn)
    except Exception as exc:
        if isinstance(exc, TransientStoreError) or not is_transient(exc):
            raise
        error = StoreUnreachableError if is_connection_error(exc) else TransientStoreError
        raise error(
            f"{what} still failing after {policy.attempts} attempts: {type(exc).__name__}: {exc}",
            operation=what,
            attempts=policy.attempts,
        ) from exc
