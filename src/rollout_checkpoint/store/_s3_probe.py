"""The S3 endpoint probe: does this endpoint + bucket enforce ``If-None-Match: *`` and
``If-Match`` on PutObject? Older MinIO/Ceph releases and several emulators silently overwrite,
so the SDK shows it once per endpoint + bucket per process before its first conditional put.

Four puts to one fresh key decide it: create-only on a new key (must succeed), create-only
again (must be refused with 412), If-Match with the current ETag (must succeed), If-Match with
the now stale ETag (must be refused, and the object must keep the third body).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._s3_errors import etag_of, is_precondition_failed

__all__ = ["PROBE_CACHE", "PROBE_LOCK", "ProbeResult", "clear_probe_cache", "decide_probe"]


@dataclass(frozen=True)
class ProbeResult:
    """What the endpoint probe showed for one endpoint + bucket."""

    endpoint: str
    bucket: str
    if_none_match: bool
    if_match: bool
    detail: str

    @property
    def atomic(self) -> bool:
        return self.if_none_match and self.if_match


PROBE_CACHE: dict[tuple[str, str], ProbeResult] = {}
PROBE_LOCK = threading.Lock()


def clear_probe_cache() -> None:
    """Forget every probe answer (for tests, or after an endpoint was reconfigured)."""
    with PROBE_LOCK:
        PROBE_CACHE.clear()


PutAnswer = dict[str, Any] | Exception
"""A PutObject's response, or the permanent error the endpoint answered with."""


def decide_probe(
    endpoint: str,
    bucket: str,
    put: Callable[..., PutAnswer],
    read_back: Callable[[], bytes],
    bodies: Sequence[bytes],
) -> ProbeResult:
    """Run the four puts (``put(body, **conditions)``) and read the key back once."""

    def result(if_none_match: bool, if_match: bool, detail: str) -> ProbeResult:
        return ProbeResult(endpoint, bucket, if_none_match, if_match, detail)

    first = put(bodies[0], IfNoneMatch="*")
    if isinstance(first, Exception):
        return result(False, False, f"a create-only PutObject of a new key was refused: {first}")
    second = put(bodies[1], IfNoneMatch="*")
    if isinstance(second, Exception) and is_precondition_failed(second):
        none_match, etag, note = True, etag_of(first["ETag"]), "If-None-Match: * enforced"
    elif isinstance(second, Exception):
        none_match, etag, note = False, etag_of(first["ETag"]), f"If-None-Match: * answered {second}"
    else:
        none_match, etag = False, etag_of(second["ETag"])
        note = "If-None-Match: * IGNORED (an existing key was overwritten)"
    third = put(bodies[2], IfMatch=f'"{etag}"')
    if isinstance(third, Exception):
        return result(none_match, False, f"{note}; If-Match with the current ETag failed: {third}")
    fourth = put(bodies[3], IfMatch=f'"{etag}"')  # etag is stale now
    if not (isinstance(fourth, Exception) and is_precondition_failed(fourth)):
        if isinstance(fourth, Exception):
            return result(none_match, False, f"{note}; If-Match with a stale ETag answered {fourth}")
        return result(none_match, False, f"{note}; If-Match IGNORED (a stale ETag overwrote the object)")
    if read_back() != bodies[2]:
        return result(none_match, False, f"{note}; If-Match refused but the object changed anyway")
    return result(none_match, True, f"{note}; If-Match enforced")
