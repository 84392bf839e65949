"""Open a store from a URL plus storage options."""

from __future__ import annotations

import re
from typing import Any

from ..errors import StoreError
from ._base import ObjectStore
from ._local import LocalStore

__all__ = ["open_store"]


def open_store(url: str | ObjectStore, **storage_options: Any) -> ObjectStore:
    """Open the store at ``url``; an :class:`ObjectStore` passed in is returned as is.

    ``storage_options`` go to the backend (for S3: ``endpoint_url``, ``key``, ``secret``,
    ``client_kwargs``...; otherwise the standard ``AWS_*`` environment variables apply).
    ``accept_unsafe_store=True`` lets conditional puts go to an S3 endpoint without (or despite)
    the probe; the other backends take it and ignore it (publication asks them separately).
    """
    if isinstance(url, ObjectStore):
        return url
    if not isinstance(url, str) or not url:
        raise StoreError("store URL must be a non-empty string", url=url)
    refuse_single_slash_scheme(url)
    protocol, sep, rest = url.partition("://")
    protocol = protocol.lower()
    if protocol in ("s3", "s3a"):
        from ._s3 import S3Store

        return S3Store.from_url(url, **storage_options)
    # retries and the probe apply to S3; the other backends take these options and ignore them
    options = {k: v for k, v in storage_options.items() if k not in ("retry", "accept_unsafe_store")}
    if not sep or protocol in ("file", "local"):
        path = rest if sep else url
        if not path:
            raise StoreError(f"store URL {url!r} names no directory", url=url)
        unknown = sorted(set(options) - {"fsync"})
        if unknown:
            raise StoreError(
                f"{url}: storage options {unknown} do not apply to a local directory "
                "(only 'fsync' does; endpoint_url and credentials are for s3:// URLs)",
                url=url,
                options=unknown,
            )
        return LocalStore(path, **options)
    # fsspec is imported only for the stores that use it
    from ._fsspec import FsspecStore, MemoryStore

    if protocol == "memory":
        if options:
            raise StoreError(
                f"{url}: storage options {sorted(options)} do not apply to memory://",
                url=url,
                options=sorted(options),
            )
        return MemoryStore(rest)
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except Exception as exc:  # fsspec's backends raise anything (IsADirectoryError for zip://)
        raise StoreError(f"cannot open store {url!r}: {type(exc).__name__}: {exc}", url=url) from exc
    if isinstance(fs, DirFileSystem):
        # url_to_fs hands back the directory itself as the path, but a DirFileSystem already
        # resolves every path against it: using it as root again would nest it inside itself.
        root = ""
    return FsspecStore(fs, root, url)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)(?!:)")  # "dir::file://" chains
_KNOWN = ("s3", "s3a", "file", "local", "memory", "gs", "gcs", "az", "abfs", "hdfs", "http", "https", "zip")


def refuse_single_slash_scheme(url: str) -> None:
    """``s3:/bucket/x`` or ``file:/x`` would silently become a local directory named ``s3:``:
    a known scheme without ``://`` is refused (one clear line), never guessed."""
    match = _SCHEME.match(url)
    if match is None:
        return
    scheme = match.group(1).lower()
    known = scheme in _KNOWN
    if not known:
        from fsspec.registry import known_implementations

        known = scheme in known_implementations
    if known:
        rest = url[match.end() :].lstrip("/")
        raise StoreError(
            f"store URL {url!r}: a scheme needs '://' (did you mean '{scheme}://{rest}'?)",
            url=url,
        )
