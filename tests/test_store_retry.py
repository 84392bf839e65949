"""The retry policy: which errors are transient, bounded attempts, and permanent errors at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from rollout_checkpoint.errors import StoreError, TransientStoreError
from rollout_checkpoint.store import RetryPolicy, is_transient
from rollout_checkpoint.store._retry import ENV_ATTEMPTS, ENV_MAX_WAIT, call_with_retry

FAST = RetryPolicy(attempts=4, initial_wait=0.001, max_wait=0.002, jitter=0.001)


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def flaky(errors: list[BaseException], result: str = "ok") -> tuple[Callable[[], str], list[int]]:
    """A callable raising ``errors`` in turn, then returning ``result``; and its call counter."""
    calls = [0]

    def fn() -> str:
        calls[0] += 1
        if calls[0] <= len(errors):
            raise errors[calls[0] - 1]
        return result

    return fn, calls


TRANSIENT = [
    client_error("SlowDown", 503),
    client_error("InternalError", 500),
    client_error("ServiceUnavailable", 503),
    client_error("ConditionalRequestConflict", 409),
    client_error("OperationAborted", 409),
    client_error("Throttling", 400),
    client_error("RequestTimeout", 400),
    client_error("TooManyRequests", 429),
    client_error("SomethingNew", 502),
    EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ConnectionResetError("reset"),
    TimeoutError("slow"),
]
PERMANENT = [
    client_error("AccessDenied", 403),
    client_error("NoSuchKey", 404),
    client_error("404", 404),
    client_error("PreconditionFailed", 412),
    client_error("InvalidRequest", 400),
    client_error("BucketAlreadyExists", 409),
    client_error("NoSuchBucket", 404),
    ValueError("a bug, not a hiccup"),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_transient_errors_are_retried_then_succeed(error: BaseException) -> None:
    assert is_transient(error)
    fn, calls = flaky([error, error])
    assert call_with_retry(fn, FAST, "put") == "ok"
    assert calls[0] == 3


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__ + ":" + str(e)[:30])
def test_permanent_errors_surface_at_once(error: BaseException) -> None:
    assert not is_transient(error)
    fn, calls = flaky([error, error])
    with pytest.raises(type(error)) as info:
        call_with_retry(fn, FAST, "put")
    assert info.value is error
    assert calls[0] == 1


def test_exhausted_attempts_raise_transient_store_error() -> None:
    error = client_error("SlowDown", 503)
    fn, calls = flaky([error] * 10)
    with pytest.raises(TransientStoreError) as info:
        call_with_retry(fn, FAST, "put_if_absent on s3://b/p")
    assert calls[0] == FAST.attempts
    assert info.value.__cause__ is error
    assert info.value.details == {"operation": "put_if_absent on s3://b/p", "attempts": FAST.attempts}
    assert "SlowDown" in info.value.message


def test_backoff_grows_and_is_bounded() -> None:
    policy = RetryPolicy(attempts=6, initial_wait=0.1, max_wait=0.5, jitter=0.05)
    slept: list[float] = []
    fn, _ = flaky([client_error("SlowDown", 503)] * 10)
    with pytest.raises(TransientStoreError):
        call_with_retry(fn, policy, "get", sleep=slept.append)
    assert len(slept) == policy.attempts - 1
    assert 0.1 <= slept[0] <= 0.15
    assert 0.2 <= slept[1] <= 0.25
    assert all(s <= 0.5 + 0.05 for s in slept)
    assert slept[-1] >= 0.5


def test_jitter_spreads_waits() -> None:
    policy = RetryPolicy(attempts=2, initial_wait=0.0, max_wait=1.0, jitter=0.5)
    slept: list[float] = []
    for _ in range(20):
        fn, _ = flaky([client_error("SlowDown", 503)])
        call_with_retry(fn, policy, "get", sleep=slept.append)
    assert len(set(slept)) > 10


def test_single_attempt_policy_does_not_retry() -> None:
    fn, calls = flaky([client_error("SlowDown", 503)])
    with pytest.raises(TransientStoreError):
        call_with_retry(fn, RetryPolicy(attempts=1), "get")
    assert calls[0] == 1


def test_policy_validation_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(max_wait=-1)
    monkeypatch.setenv(ENV_ATTEMPTS, "9")
    monkeypatch.setenv(ENV_MAX_WAIT, "0.25")
    assert RetryPolicy.from_env() == RetryPolicy(attempts=9, max_wait=0.25)
    monkeypatch.setenv(ENV_ATTEMPTS, "many")
    with pytest.raises(StoreError):
        RetryPolicy.from_env()
    monkeypatch.delenv(ENV_ATTEMPTS)
    monkeypatch.delenv(ENV_MAX_WAIT)
    assert RetryPolicy.from_env() == RetryPolicy()
