"""Object stores: a small interface over fsspec with conditional puts and capability flags.

Open one from a URL with :func:`open_store`: a plain path or ``file://`` (:class:`LocalStore`),
``memory://`` (:class:`MemoryStore`), ``s3://bucket/prefix`` (:class:`S3Store`), or any other
fsspec protocol (:class:`FsspecStore`, whose conditional puts are not atomic).
:class:`CountingStore` wraps any of them and counts requests, bytes and keys read.
See ``docs/storage.md``.
"""

from __future__ import annotations

from typing import Any

from ._base import ObjectInfo, ObjectStore, PutResult, StoreCapabilities
from ._counting import CountingStore
from ._delegating import DelegatingStore
from ._fsspec import FsspecStore, MemoryStore
from ._local import LocalStore
from ._open import open_store
from ._retry import RetryPolicy, is_transient

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
]


def __getattr__(name: str) -> Any:
    # s3fs/aiobotocore are imported only when S3 is used.
    if name in ("S3Store", "ProbeResult"):
        from . import _s3

        return getattr(_s3, name)
    raise AttributeError(name)
