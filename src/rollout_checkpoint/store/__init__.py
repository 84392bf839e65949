"""Object stores: a small interface over fsspec with conditional puts and capability flags.

Open one from a URL with :func:`open_store`: a plain path or ``file://`` (:class:`LocalStore`),
``memory://`` (:class:`MemoryStore`), ``s3://bucket/prefix`` (:class:`S3Store`), or any other
fsspec protocol (:class:`FsspecStore`, whose conditional puts are not atomic).
:class:`CountingStore` wraps any of them and counts requests, bytes and keys read.
See ``docs/storage.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities
from ._counting import CountingStore
from ._delegating import DelegatingStore
from ._local import LocalStore
from ._open import open_store, refuse_single_slash_scheme

if TYPE_CHECKING:
    from ._fsspec import FsspecStore, MemoryStore
    from ._retry import RetryPolicy, is_transient
    from ._s3 import ProbeResult, S3Store

__all__ = [
    "CountingStore",
    "DelegatingStore",
    "FsspecStore",
    "LocalStore",
    "MemoryStore",
    "ObjectInfo",
    "ObjectStore",
    "ProbeResult",
    "PutResult",
    "RetryPolicy",
    "S3Store",
    "StoreCapabilities",
    "is_transient",
    "open_store",
    "refuse_single_slash_scheme",
]


# Imported on first use: s3fs/aiobotocore only when S3 is used, fsspec only for memory:// and
# other fsspec stores, tenacity only for remote retries (a process that writes to local disk
# loads none of them).
_LAZY = {
    "S3Store": "._s3",
    "ProbeResult": "._s3",
    "FsspecStore": "._fsspec",
    "MemoryStore": "._fsspec",
    "RetryPolicy": "._retry",
    "is_transient": "._retry",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
