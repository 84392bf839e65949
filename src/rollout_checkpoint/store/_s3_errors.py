"""Reading botocore's answers: the error code and HTTP status of a ``ClientError``, a 412, an ETag."""

from __future__ import annotations

from typing import Any

__all__ = ["error_code", "etag_of", "is_client_error", "is_precondition_failed"]


def error_code(exc: BaseException) -> tuple[str, int]:
    """``(code, status)`` of a botocore ``ClientError``; ``("", 0)`` for anything else."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def is_client_error(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


def is_precondition_failed(exc: BaseException) -> bool:
    code, status = error_code(exc)
    return code == "PreconditionFailed" or status == 412


def etag_of(value: Any) -> str:
    """An ETag without its quotes (S3 answers ``"<hex>"``; ``If-Match`` takes it quoted again)."""
    return str(value).strip('"')
