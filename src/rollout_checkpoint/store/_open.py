"""Open a store from a URL plus storage options."""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec.implementations.dirfs import DirFileSystem

from ..errors import StoreError
from ._base import ObjectStore
from ._fsspec import FsspecStore, MemoryStore
from ._local import LocalStore

__all__ = ["open_store"]


def open_store(url: str | ObjectStore, **storage_options: Any) -> ObjectStore:
    """Open the store at ``url``; an :class:`ObjectStore` passed in is returned as is.

    ``storage_options`` go to the backend (for S3: ``endpoint_url``, ``key``, ``secret``,
    ``client_kwargs``...; otherwise the standard ``AWS_*`` environment variables apply).
    """
    if isinstance(url, ObjectStore):
        return url
    if not isinstance(url, str) or not url:
        raise StoreError("store URL must be a non-empty string", url=url)
    protocol, _, rest = url.partition("://")
    if not rest:
        return LocalStore(url, **storage_options)
    protocol = protocol.lower()
    if protocol in ("file", "local"):
        return LocalStore(rest, **storage_options)
    if protocol == "memory":
        return MemoryStore(rest)
    if protocol in ("s3", "s3a"):
        from ._s3 import S3Store

        return S3Store.from_url(url, **storage_options)
    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except (ImportError, ValueError) as exc:
        raise StoreError(f"cannot open store {url!r}: {exc}", url=url) from exc
    if isinstance(fs, DirFileSystem):
        # url_to_fs hands back the directory itself as the path, but a DirFileSystem already
        # resolves every path against it: using it as root again would nest it inside itself.
        root = ""
    return FsspecStore(fs, root, url)
