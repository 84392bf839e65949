"""S3 (and S3-compatible) store with conditional puts the server enforces.

The conditional puts are single ``PutObject`` requests sent straight to the botocore client that
s3fs holds, never through s3fs's file or ``pipe_file`` paths, because those paths have traps
(see ``docs/storage.md``):

* ``open(path, "xb")`` with zero bytes written falls back to an *unconditional* ``touch``;
* ``_call_s3`` silently drops parameters the botocore operation does not take, and the
  multipart path drops ``IfMatch``, so a large compare-and-swap becomes a blind overwrite.

Calling the client directly also means an unknown parameter fails loudly instead of vanishing,
and every error arrives as the raw ``ClientError`` so 412 / 404 / 409 can be told apart.
Whether the endpoint really enforces the preconditions is shown by a probe
(:meth:`S3Store.require_atomic_commits`), which runs before the first conditional put to each
endpoint + bucket, whoever makes it (coordinator, archive writer, token store, gc).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from typing import Any, BinaryIO, cast

import s3fs
from fsspec.asyn import sync

from ..errors import (
    ConditionalWriteUnsupportedError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreError,
    TransientStoreError,
    VersionChangedError,
)
from ..ids import validate_key
from ._base import ObjectInfo, PutResult, StoreCapabilities
from ._fsspec import FsspecStore
from ._retry import RetryPolicy, call_with_retry
from ._s3_errors import error_code, etag_of, is_client_error, is_precondition_failed
from ._s3_probe import PROBE_CACHE, PROBE_LOCK, ProbeResult, clear_probe_cache, decide_probe

__all__ = ["MAX_SINGLE_PUT_BYTES", "ProbeResult", "S3Store", "clear_probe_cache"]

MAX_SINGLE_PUT_BYTES = 5 * 1024**3
"""S3's limit for one PutObject; larger conditional objects would need multipart, which loses If-Match."""

OPEN_READ_BLOCK_SIZE = 4 * 1024**2
"""Read-ahead of :meth:`S3Store.open_read` (s3fs defaults to 50 MiB, too much for footer reads)."""

PROBE_PREFIX = "_probe"

_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_UNSUPPORTED_CODES = frozenset({"NotImplemented", "501"})


class S3Store(FsspecStore):
    """Objects under ``s3://bucket/prefix``.

    ``put_if_absent`` is one ``PutObject`` with ``If-None-Match: *`` and ``put_if_match`` one
    ``PutObject`` with ``If-Match: "<etag>"``; the version token is the ETag without quotes.
    Listing is always fresh (no s3fs listing or instance cache). :attr:`capabilities` reports
    atomic conditional puts only once the endpoint probe has shown them for this endpoint.
    """

    fs: s3fs.S3FileSystem
    write_block_size: int | None = 8 << 20
    """Part size of :meth:`open_write` uploads (s3fs would buffer 50 MiB; S3's minimum is 5 MiB)."""
    list_page_size: int = 1000
    """Keys per ListObjectsV2 page (1000 is S3's maximum)."""

    def __init__(
        self,
        fs: s3fs.S3FileSystem,
        bucket: str,
        prefix: str = "",
        *,
        retry: RetryPolicy | None = None,
        accept_unsafe_store: bool = False,
    ) -> None:
        if not bucket or "/" in bucket:
            raise StoreError(f"invalid S3 bucket name {bucket!r}", bucket=bucket)
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        root = f"{bucket}/{prefix}" if prefix else bucket
        super().__init__(fs, root, f"s3://{root}")
        self.bucket = bucket
        self.prefix = prefix
        self.retry = retry if retry is not None else RetryPolicy.from_env()
        self._endpoint: str | None = None
        self.accept_unsafe_store = accept_unsafe_store
        """``True``: conditional puts go out without the endpoint probe (the caller accepted that
        an endpoint ignoring preconditions lets a racing writer overwrite them)."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        accept_unsafe_store: bool = False,
        **storage_options: Any,
    ) -> S3Store:
        """Open ``s3://bucket/prefix``; ``storage_options`` go to :class:`s3fs.S3FileSystem`
        (``endpoint_url``, ``key``, ``secret``, ``token``, ``client_kwargs``, ``config_kwargs``...),
        otherwise the standard ``AWS_*`` variables (incl. ``AWS_ENDPOINT_URL``) apply.

        Caches that would hide other writers' objects are always off, and botocore's own retries
        default to none so that :mod:`._retry` is the one retry layer.
        """
        protocol, sep, rest = url.partition("://")
        if not sep or protocol.lower() not in ("s3", "s3a"):
            raise StoreError(f"not an s3:// URL: {url!r}", url=url)
        bucket, _, prefix = rest.rstrip("/").partition("/")
        options = dict(storage_options)
        options["skip_instance_cache"] = True
        options["use_listings_cache"] = False
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        options["config_kwargs"] = config
        fs = s3fs.S3FileSystem(**options)
        return cls(fs, bucket, prefix, retry=retry, accept_unsafe_store=accept_unsafe_store)

    # -- low level -------------------------------------------------------------------------
    def _s3key(self, key: str) -> str:
        self._check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        """One request on s3fs's botocore client (its event loop), raw ``ClientError`` on failure."""

        async def run() -> dict[str, Any]:
            client = await self.fs.set_session()
            response = cast(dict[str, Any], await getattr(client, op)(**kwargs))
            if op == "get_object":
                async with response["Body"] as body:
                    response["Body"] = await body.read()
            return response

        return cast(dict[str, Any], sync(self.fs.loop, run))

    def _list_pages(self, prefix: str) -> list[dict[str, Any]]:
        async def run() -> list[dict[str, Any]]:
            client = await self.fs.set_session()
            paginator = client.get_paginator("list_objects_v2")
            out: list[dict[str, Any]] = []
            pages = paginator.paginate(
                Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self.list_page_size}
            )
            async for page in pages:
                out.extend(page.get("Contents", []))
            return out

        return cast(list[dict[str, Any]], sync(self.fs.loop, run))

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        return call_with_retry(fn, self.retry, f"{what} on {self.url}")

    def _map_error(self, exc: Exception, key: str | None, what: str) -> Exception:
        """A typed store error for a permanent failure (the caller raises it ``from exc``)."""
        if isinstance(exc, StoreError):
            return exc
        code, status = error_code(exc)
        where = f"{self.url}/{key}" if key else self.url
        if code in _NOT_FOUND_CODES:
            return ObjectNotFoundError(f"{where} does not exist", key=key)
        if code == "NoSuchBucket":
            return StoreError(f"{what}: bucket {self.bucket!r} does not exist", key=key, code=code)
        if code in ("AccessDenied", "403", "Forbidden"):
            return StoreError(f"{what} on {where}: access denied", key=key, code=code, status=status)
        if is_client_error(exc):
            return StoreError(f"{what} on {where} failed: {code} ({status}): {exc}", key=key, code=code)
        return StoreError(f"{what} on {where} failed: {type(exc).__name__}: {exc}", key=key)

    def _request(self, what: str, key: str | None, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], self._retrying(what, lambda: self._call(op, **kwargs)))
        except TransientStoreError:
            raise
        except Exception as exc:
            raise self._map_error(exc, key, what) from exc

    def _check_single_put(self, key: str, data: bytes, what: str) -> None:
        if len(data) > MAX_SINGLE_PUT_BYTES:
            raise StoreError(
                f"{what} {self.url}/{key}: {len(data)} bytes is over S3's 5 GiB single-PUT limit; "
                "conditional objects are never written with multipart upload (it drops If-Match "
                "and leaves uploads behind), so keep manifests and pointers small",
                key=key,
                size=len(data),
            )

    # -- plain ------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> ObjectInfo:
        s3key = self._s3key(key)
        if len(data) > MAX_SINGLE_PUT_BYTES:
            # Unconditional and only for keys no one else writes, so multipart is acceptable.
            self.fs.pipe_file(f"{self.bucket}/{s3key}", data)
            return self.stat(key)
        resp = self._request("put", key, "put_object", Bucket=self.bucket, Key=s3key, Body=data)
        return ObjectInfo(key=key, size=len(data), version=etag_of(resp["ETag"]))

    def get(self, key: str) -> bytes:
        resp = self._request("get", key, "get_object", Bucket=self.bucket, Key=self._s3key(key))
        return cast(bytes, resp["Body"])

    def get_range(self, key: str, start: int, end: int) -> bytes:
        s3key = self._s3key(key)
        if start < 0 or end < start:
            raise StoreError(f"invalid byte range [{start}, {end})", key=key)
        if end == start:
            self.stat(key)  # still report a missing object
            return b""
        try:
            resp = self._retrying(
                "get_range",
                lambda: self._call(
                    "get_object", Bucket=self.bucket, Key=s3key, Range=f"bytes={start}-{end - 1}"
                ),
            )
        except TransientStoreError:
            raise
        except Exception as exc:
            if error_code(exc)[0] == "InvalidRange":  # start at or past the end: no bytes
                return b""
            raise self._map_error(exc, key, "get_range") from exc
        return cast(bytes, resp["Body"])

    def open_read(self, key: str) -> BinaryIO:
        path = f"{self.bucket}/{self._s3key(key)}"
        try:
            return cast(
                BinaryIO,
                self.fs.open(path, "rb", block_size=OPEN_READ_BLOCK_SIZE, cache_type="readahead"),
            )
        except FileNotFoundError:
            raise self._missing(key) from None
        except OSError as exc:  # s3fs translated a ClientError (403, ...) after its own retries
            raise StoreError(f"open_read on {self.url}/{key} failed: {exc}", key=key) from exc

    def stat(self, key: str) -> ObjectInfo:
        resp = self._request("stat", key, "head_object", Bucket=self.bucket, Key=self._s3key(key))
        return ObjectInfo(key=key, size=int(resp["ContentLength"]), version=etag_of(resp["ETag"]))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """One fresh ``ListObjectsV2`` walk; directory markers and keys that are not valid store
        keys (written by other tools) are skipped."""
        self._check_prefix(prefix)
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        try:
            entries = self._retrying("list", lambda: self._list_pages(full))
        except TransientStoreError:
            raise
        except Exception as exc:
            raise self._map_error(exc, None, "list") from exc
        cut = len(self.prefix) + 1 if self.prefix else 0
        out: list[ObjectInfo] = []
        for entry in entries:
            key = str(entry["Key"])[cut:]
            try:
                validate_key(key)
            except ValueError:
                continue
            out.append(ObjectInfo(key=key, size=int(entry["Size"]), version=etag_of(entry["ETag"])))
        out.sort(key=lambda info: info.key)
        return out

    def delete(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFoundError):
            self._request("delete", key, "delete_object", Bucket=self.bucket, Key=self._s3key(key))

    # -- conditional ------------------------------------------------------------------------------
    def _guard_conditional(self) -> None:
        """Before every conditional put, whoever makes it (coordinator, archive writer, token
        store, gc): the endpoint probe, once per endpoint + bucket, unless the risk was accepted."""
        if not self.accept_unsafe_store:
            self.require_atomic_commits()

    def put_if_absent(self, key: str, data: bytes) -> PutResult:
        s3key = self._s3key(key)
        self._check_single_put(key, data, "put_if_absent")
        self._guard_conditional()
        try:
            resp = self._retrying(
                "put_if_absent",
                lambda: self._call("put_object", Bucket=self.bucket, Key=s3key, Body=data, IfNoneMatch="*"),
            )
        except TransientStoreError:
            raise
        except Exception as exc:
            if is_precondition_failed(exc):
                # Someone's object is there -- possibly ours, from an attempt whose answer was lost.
                return self._resolve_existing(key, data)
            raise self._map_conditional_error(exc, key, "put_if_absent") from exc
        info = ObjectInfo(key=key, size=len(data), version=etag_of(resp["ETag"]))
        return PutResult(info=info, created=True)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        s3key = self._s3key(key)
        self._check_single_put(key, data, "put_if_match")
        self._guard_conditional()
        try:
            resp = self._retrying(
                "put_if_match",
                lambda: self._call(
                    "put_object", Bucket=self.bucket, Key=s3key, Body=data, IfMatch=f'"{etag_of(version)}"'
                ),
            )
        except TransientStoreError:
            raise
        except Exception as exc:
            if not is_precondition_failed(exc):
                raise self._map_conditional_error(exc, key, "put_if_match") from exc
            current = self._get_with_etag(key)
            if current is not None and current[0] == data:
                # Our own earlier send whose answer was lost (aiohttp resends a request on a
                # dropped keep-alive connection, below any retry layer of ours) already landed.
                return ObjectInfo(key=key, size=len(data), version=current[1])
            raise VersionChangedError(
                f"{self.url}/{key} changed: expected version {version}, "
                f"found {current[1] if current else 'no object'}",
                key=key,
                expected=version,
                found=current[1] if current else None,
            ) from exc
        return ObjectInfo(key=key, size=len(data), version=etag_of(resp["ETag"]))

    def _map_conditional_error(self, exc: Exception, key: str, what: str) -> Exception:
        code, status = error_code(exc)
        if code in _UNSUPPORTED_CODES or status == 501:
            return ConditionalWriteUnsupportedError(
                f"{what} on {self.url}/{key}: the endpoint does not implement conditional PutObject ({code})",
                url=self.url,
                key=key,
            )
        return self._map_error(exc, key, what)

    def _get_with_etag(self, key: str) -> tuple[bytes, str] | None:
        try:
            resp = self._request("get", key, "get_object", Bucket=self.bucket, Key=self._s3key(key))
        except ObjectNotFoundError:
            return None
        return cast(bytes, resp["Body"]), etag_of(resp["ETag"])

    def _resolve_existing(self, key: str, data: bytes) -> PutResult:
        """One GET (body + ETag) instead of the generic get-then-stat."""
        current = self._get_with_etag(key)
        if current is None:
            raise ObjectExistsError(
                f"{self.url}/{key}: create-only put failed but the object is gone again", key=key
            )
        if current[0] == data:
            return PutResult(info=ObjectInfo(key=key, size=len(data), version=current[1]), created=False)
        raise ObjectExistsError(f"{self.url}/{key} already exists with different content", key=key)

    # -- endpoint probe ----------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """The endpoint URL the client really talks to (after options and ``AWS_ENDPOINT_URL``)."""
        if self._endpoint is None:
            client = sync(self.fs.loop, self.fs.set_session)
            self._endpoint = str(client.meta.endpoint_url).rstrip("/")
        return self._endpoint

    @property
    def _probe_cache_key(self) -> tuple[str, str]:
        return (self.endpoint, self.bucket)

    @property
    def capabilities(self) -> StoreCapabilities:
        """Atomic only where the probe showed it for this endpoint + bucket (else not yet shown)."""
        result = PROBE_CACHE.get(self._probe_cache_key)
        return StoreCapabilities(
            atomic_put_if_absent=bool(result and result.if_none_match),
            atomic_put_if_match=bool(result and result.if_match),
        )

    @capabilities.setter
    def capabilities(self, value: StoreCapabilities) -> None:
        raise AttributeError("S3Store.capabilities comes from the endpoint probe and cannot be set")

    def probe_conditional_writes(self) -> ProbeResult:
        """Show (once per endpoint + bucket per process) whether the endpoint enforces
        ``If-None-Match: *`` and ``If-Match`` on PutObject; the answer is cached.

        Transient and permission errors propagate and are not cached.
        """
        cache_key = self._probe_cache_key
        with PROBE_LOCK:
            cached = PROBE_CACHE.get(cache_key)
            if cached is not None:
                return cached
            result = self._run_probe()
            PROBE_CACHE[cache_key] = result
            return result

    def _run_probe(self) -> ProbeResult:
        token = uuid.uuid4().hex
        key = f"{PROBE_PREFIX}/{token}"
        s3key = self._s3key(key)
        bodies = [f"rollout-checkpoint probe {token} {i}\n".encode() for i in range(4)]

        def put(body: bytes, **cond: str) -> dict[str, Any] | Exception:
            """The response, or the permanent ClientError the endpoint answered with."""
            try:
                return cast(
                    dict[str, Any],
                    self._retrying(
                        "probe",
                        lambda: self._call("put_object", Bucket=self.bucket, Key=s3key, Body=body, **cond),
                    ),
                )
            except TransientStoreError:
                raise
            except Exception as exc:
                if not is_client_error(exc):
                    raise
                code, _ = error_code(exc)
                if code in ("AccessDenied", "403", "NoSuchBucket"):
                    raise self._map_error(exc, key, "probe") from exc
                return exc

        def read_back() -> bytes:
            answer = self._request("probe", key, "get_object", Bucket=self.bucket, Key=s3key)
            return cast(bytes, answer["Body"])

        try:
            return decide_probe(self.endpoint, self.bucket, put, read_back, bodies)
        finally:
            with contextlib.suppress(Exception):
                self._call("delete_object", Bucket=self.bucket, Key=s3key)

    def require_atomic_commits(self, *, accept_risk: bool = False) -> None:
        """Probe the endpoint (once per endpoint + bucket) and refuse unless both preconditions
        are enforced; ``accept_risk=True`` skips the probe, for this call and for every later
        conditional put through this store."""
        if accept_risk:
            self.accept_unsafe_store = True
            return
        result = self.probe_conditional_writes()
        if result.atomic:
            return
        raise ConditionalWriteUnsupportedError(
            f"{self.url}: the S3 endpoint {result.endpoint} did not show atomic conditional puts "
            f"({result.detail}), so a checkpoint published here could be overwritten by a racing "
            "writer; use an endpoint that enforces If-None-Match/If-Match on PutObject, or pass "
            "accept_risk=True (CLI: --accept-unsafe-store) to publish anyway",
            url=self.url,
            endpoint=result.endpoint,
            atomic_put_if_absent=result.if_none_match,
            atomic_put_if_match=result.if_match,
        )
